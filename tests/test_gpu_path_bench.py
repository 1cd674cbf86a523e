"""bench.gpu_path: with --config, the backbone each row names is the one it trains."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.gpu_path import config_of, parse
from tests.conftest import ROOT

CONFIG = str(ROOT / "configs" / "omniglot_hbn.yaml")


def test_a_config_trains_its_own_backbone_unless_the_flags_name_others():
    own = yaml.safe_load(Path(CONFIG).read_text())["backbone"]
    args = parse(["--root", "r", "--config", CONFIG])
    assert (args.backbones, args.fit_backbone) == ([own], own)
    args = parse(["--root", "r", "--config", CONFIG, "--backbones", "resnet18", "googlenet", "--backbone", "resnet18"])
    assert [config_of(args, b, "bf16").backbone for b in args.backbones] == ["resnet18", "googlenet"]
    assert config_of(args, args.fit_backbone, "fp32").backbone == "resnet18"
    assert config_of(args, "resnet18", "fp32").classes_per_batch == yaml.safe_load(Path(CONFIG).read_text())["classes_per_batch"]


def test_the_photo_set_defaults_stay():
    args = parse(["--root", "r"])
    assert (args.backbones, args.fit_backbone) == (["resnet50", "googlenet"], "resnet50")
    assert config_of(args, "googlenet", "fp16").backbone == "googlenet"

"""Tests of trainables.core.checkpoint: bundle round trips compared with the original objects and
fresh RNG draws; truncated, foreign and code-executing files refused naming the file.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.conftest import write_malicious_pickle
from trainables.core.checkpoint import (
    CheckpointError,
    load_bundle,
    rng_state,
    save_bundle,
    set_rng_state,
)
from trainables.core.config import TrainConfig


def draws():
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)]


def test_bundle_round_trip(tmp_path):
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    state = rng_state()
    expected = draws()
    bundle = {
        "config": TrainConfig().to_dict(),
        "epoch": 3,
        "model": {"layer.weight": torch.randn(3, 4), "layer.bias": torch.arange(3, dtype=torch.float64)},
        "sampler": {"seed": 0, "epoch": 3, "position": 0},
        "classes": [4, 8, 15],
        "rng": state,
    }
    path = save_bundle(bundle, tmp_path / "run" / "bundle.pt")
    assert path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["bundle.pt"]  # no temp file left behind
    for source in (path, path.parent):  # a directory holding bundle.pt is accepted
        loaded = load_bundle(source)
        assert loaded["format"] == 1
        assert loaded["config"] == bundle["config"]
        assert loaded["epoch"] == 3 and loaded["classes"] == [4, 8, 15] and loaded["sampler"] == bundle["sampler"]
        for key, value in bundle["model"].items():
            assert torch.equal(loaded["model"][key], value) and loaded["model"][key].dtype == value.dtype
        draws()  # move every generator on
        set_rng_state(loaded["rng"])
        assert draws() == expected


def test_truncated_bundle_raises(tmp_path):
    path = save_bundle({"config": {}, "epoch": 1, "model": {"w": torch.randn(100, 100)}}, tmp_path / "bundle.pt")
    data = path.read_bytes()
    bad = tmp_path / "cut.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.pt"):
        load_bundle(bad)


def test_missing_or_foreign_bundle_raises(tmp_path):
    with pytest.raises(CheckpointError):
        load_bundle(tmp_path / "nothing.pt")
    foreign = tmp_path / "foreign.pt"
    torch.save({"w": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="foreign.pt"):
        load_bundle(foreign)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_bundle_is_refused_without_running(tmp_path, writer):
    pwned = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    write_malicious_pickle(path, pwned, writer, key="model", extra={"format": 1, "config": {}, "epoch": 1})
    with pytest.raises(CheckpointError, match="evil.pt"):
        load_bundle(path)
    assert not pwned.exists()

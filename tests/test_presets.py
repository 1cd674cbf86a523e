"""The photo benchmarks' presets (search_spaces/cub200, cars196, sop, inshop and configs/NAME.yaml).

Fast, no Ray: each preset is the papers' protocol for its dataset (000_4178e6910e81cd2f sec. 4.1: GoogLeNet on
ImageNet weights, 224 px crops, bf16 here; 004_44fc264e74e143df: its C x k), its batches fit the real dataset's fit
classes, its validation folds are enough for the race, and ``--space NAME`` finds it.

End to end (slow: Ray and a driver per preset; they belong in the fault tier): each preset on a generated photo set
of its dataset's layout and shape (tests/photo_data.py, tiny), made tiny by a derived space that replaces only what
a CPU cannot afford (backbone, pretrained weights, image size, epochs, C's range for a dozen classes) and keeps the
rest of the preset's structure; a two-trial study, then ``study.final --study`` on it.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import mlflow
import pytest
import yaml

from study.launch.cli import parse_args
from study.launch.settings import max_classes_per_batch, prepare_space
from study.search.schedulers import ladder
from study.search.spaces import SHIPPED, load_space, parse_space
from trainables.core.config import TrainConfig, held_out_classes

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("cub200", "cars196", "sop", "inshop")
# the real datasets' training classes (000 sec. 4: CUB 100, Cars196 98, SOP 11,318; In-shop's list_eval_partition.txt: 3,997 items)
TRAINING_CLASSES = {"cub200": 100, "cars196": 98, "sop": 11_318, "inshop": 3_997}
# the generated sets (tests/photo_data.py): scale and size scale giving a dozen or more training classes of small photos
TINY = {"cub200": (0.06, 0.1), "cars196": (0.06, 0.06), "sop": (0.0016, 0.1), "inshop": (0.005, 0.15)}


@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_is_the_papers_protocol_for_its_dataset(name):
    space = load_space(name)
    fixed = space.fixed
    assert space.path == str(SHIPPED / f"{name}.yaml") and space.final_budget_factor == 2
    assert fixed["dataset"] == name and fixed["val_split"] == "classes"
    assert fixed["backbone"] in ("googlenet", "resnet50") and fixed["pretrained"] == "imagenet"
    assert fixed["image_size"] == 224 and fixed["precision"] == "bf16"
    searched = {p.name: p for p in space.params}
    assert {"loss", "alpha", "heating", "heating_target", "mean_proxy_weight", "ice_scale", "lr", "new_layer_lr_mult"} <= set(searched)
    assert set(searched["loss"].choices) == {"softmax", "ice"}
    assert searched["alpha"].low <= 16 <= searched["alpha"].high  # 000 sec. 4.1: alpha 16
    assert searched["ice_scale"].low <= 64 <= searched["ice_scale"].high  # 004 Table 2: s = 64
    assert 1.0 in searched["mean_proxy_weight"].choices and 0.01 in searched["mean_proxy_weight"].choices  # 002 sec. 4.2
    assert 10.0 in searched["new_layer_lr_mult"].choices  # 004 sec. 4.1
    epochs = fixed["epochs"]  # the default scheduler's rungs end at the trials' budget: no extra rung just before it
    assert ladder("budget", epochs, epochs // 4, 4.0) == ((epochs // 4, epochs), (epochs // 4,))


@pytest.mark.parametrize("name", PRESETS)
def test_a_presets_batches_and_race_fit_the_real_dataset(name):
    """The largest C any trial draws is at most the real dataset's fit classes, and the race has at least 3 folds
    (its paired test needs 3; data.validation_folds' arithmetic)."""
    space = load_space(name)
    config = TrainConfig.from_dict(space.fixed, source=name)
    classes = TRAINING_CLASSES[name]
    held_out = held_out_classes(classes, config.val_fraction)
    assert max_classes_per_batch(space) <= classes - held_out
    assert classes // held_out >= 3


@pytest.mark.parametrize("name", PRESETS)
def test_launch_finds_a_preset_by_name_and_its_config_is_the_same_protocol(name):
    space = prepare_space(parse_args(["--space", name]))
    assert space.name == name
    config = TrainConfig.from_dict(yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text()), source=f"configs/{name}.yaml")
    for key in ("dataset", "backbone", "pretrained", "image_size", "precision", "augment", "val_fraction"):
        assert getattr(config, key) == space.fixed[key], key
    assert (config.loss, config.normalization, config.heating, config.alpha, config.heating_target) == ("softmax", "bn", "two_stage", 16, 4)


def tiny_space(name: str, data_root: Path, folder: Path) -> Path:
    """The preset ``name`` with what a CPU cannot afford replaced: small_cnn from scratch on 32 px, 2 epochs, C up to the
    tiny set's fit classes. Every other fixed key, searched key, condition and range stays the preset's."""
    from trainables.core.data import load_dataset

    data = yaml.safe_load((SHIPPED / f"{name}.yaml").read_text())
    data["fixed"].update(backbone="small_cnn", pretrained="none", image_size=32, epochs=2)
    classes = len(load_dataset(name, data_root).train.classes)
    fit = classes - held_out_classes(classes, data["fixed"]["val_fraction"])
    data["params"]["classes_per_batch"] = {"type": "int", "low": 2, "high": fit - fit % 2, "step": 2}
    path = folder / f"{name}_tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    parse_space(data, str(path))  # valid as a whole
    return path


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_runs_a_study_and_its_final_on_its_datasets_layout(name, tmp_path, runs):
    from study.final import cli as final
    from study.launch import cli as launch
    from tests.photo_data import MAKERS

    data_root = tmp_path / "data"
    scale, size_scale = TINY[name]
    MAKERS[name](data_root, scale=scale, size_scale=size_scale)
    space = tiny_space(name, data_root, tmp_path)
    study = f"preset-{name}"
    argv = ["--space", str(space), "--data-root", str(data_root), "--num-samples", "2", "--study-name", study, "--seed", "0"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert launch.main([*argv, "--ray-cpus", "2", "--cpus-per-trial", "1"]) == 0, out.getvalue()
        assert final.main(["--study", study, "--seeds", "1"]) == 0, out.getvalue()

    assert "the top trials raced over validation folds" in out.getvalue()  # the preset's protocol: the race names the pick
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()], f"tags.study_name = '{study}'")
    trials = [r for r in found if r.data.tags.get("kind") == "trial"]
    assert len(trials) == 2 and all(r.info.status == "FINISHED" for r in trials)
    preset = load_space(name).fixed
    for run in trials:  # what the trials trained with is the preset's, but for the tiny replacements
        params = run.data.params
        inactive = run.data.tags["inactive_params"].split(",")
        for key in ("dataset", "precision", "augment", "val_fraction", "weight_decay"):
            assert params[key] == str(preset[key]), key
        # heating's start applies to a heated softmax trial only; on any other it is named inactive, not logged
        assert params["heating_start"] == str(preset["heating_start"]) if "heating_start" not in inactive else "heating_start" not in params
        assert (params["backbone"], params["image_size"], params["epochs"]) == ("small_cnn", "32", "2")
        assert "val_recall_at_1" in run.data.metrics
    seeds = [r for r in found if r.data.tags.get("kind") == "final_seed"]
    assert len(seeds) == 1 and seeds[0].info.status == "FINISHED"
    assert seeds[0].data.params["epochs"] == "4"  # final_budget_factor 2
    assert 0 <= seeds[0].data.metrics["test_recall_at_1"] <= 1

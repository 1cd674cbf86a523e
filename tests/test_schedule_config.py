"""Tests of the schedules, TrainConfig validation, checkpoint bundles and engine determinism.

References: schedule values worked out by hand (000_4178e6910e81cd2f: train at alpha = 16,
then fine-tune at 4 with the learning rate x 0.1); config errors checked by the key they must
name; checkpoint round trips compared with the original objects and fresh RNG draws; the engine
compared with a second, independent run and with an uninterrupted run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from tests.conftest import write_malicious_pickle
from trainables.core import schedule
from trainables.core.checkpoint import (
    CheckpointError,
    load_bundle,
    rng_state,
    save_bundle,
    set_rng_state,
)
from trainables.core.config import ConfigError, TrainConfig

# -- schedules -------------------------------------------------------------------------------


def cfg(**values) -> TrainConfig:
    return TrainConfig.from_dict(
        {"epochs": 40, "alpha": 16.0, "heating_target": 4.0, "heating_start": 0.75, "heating_lr_factor": 0.1, **values}
    )


def test_schedule_none():
    config = cfg(heating="none")
    for epoch in (0, 10, 29, 30, 39):
        assert schedule.alpha_at(config, epoch) == 16.0
        assert schedule.lr_factor_at(config, epoch) == 1.0


def test_schedule_two_stage():
    config = cfg(heating="two_stage")
    for epoch in range(30):
        assert schedule.alpha_at(config, epoch) == pytest.approx(16.0), epoch
        assert schedule.lr_factor_at(config, epoch) == pytest.approx(1.0), epoch
    for epoch in range(30, 40):
        assert schedule.alpha_at(config, epoch) == pytest.approx(4.0), epoch
        assert schedule.lr_factor_at(config, epoch) == pytest.approx(0.1), epoch


def test_schedule_two_stage_never_heats_with_start_one():
    config = cfg(heating="two_stage", heating_start=1.0)
    assert [schedule.alpha_at(config, e) for e in range(40)] == [16.0] * 40


# linear / cosine: heating starts at epoch 0.75 * 40 = 30 and ends at the last epoch, 39;
# progress t = (epoch - 30) / 9.
@pytest.mark.parametrize(
    "epoch, t_linear, t_cosine",
    [
        (0, 0.0, 0.0),
        (29, 0.0, 0.0),
        (30, 0.0, 0.0),
        (32.25, 0.25, 0.5 * (1 - math.cos(math.pi / 4))),  # 0.1464...
        (34.5, 0.5, 0.5),
        (36.75, 0.75, 0.5 * (1 + math.cos(math.pi / 4))),  # 0.8535...
        (39, 1.0, 1.0),
    ],
)
def test_schedule_linear_and_cosine(epoch, t_linear, t_cosine):
    for heating, t in (("linear", t_linear), ("cosine", t_cosine)):
        config = cfg(heating=heating)
        assert schedule.alpha_at(config, epoch) == pytest.approx(16.0 - 12.0 * t, abs=1e-12), (heating, epoch)
        assert schedule.lr_factor_at(config, epoch) == pytest.approx(1.0 - 0.9 * t, abs=1e-12), (heating, epoch)


def test_schedule_linear_values_by_hand():
    config = cfg(heating="linear")
    assert schedule.alpha_at(config, 34.5) == pytest.approx(10.0)
    assert schedule.lr_factor_at(config, 34.5) == pytest.approx(0.55)
    assert schedule.alpha_at(config, 31) == pytest.approx(16.0 - 12.0 / 9)
    assert schedule.alpha_at(config, 39) == pytest.approx(4.0)
    cos = cfg(heating="cosine")
    assert schedule.alpha_at(cos, 32.25) == pytest.approx(14.242640687119286)  # 16 - 12 (1 - 1/sqrt 2)/2


def test_set_lr_scales_base_lr_of_every_group():
    config = cfg(lr=0.01, new_layer_lr_mult=10.0)
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD(schedule.param_groups([a], [b], config))
    assert schedule.set_lr(optimizer, 0.1) == pytest.approx(0.001)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.001, 0.01])


# -- TrainConfig -----------------------------------------------------------------------------


def test_defaults_are_valid():
    config = TrainConfig.from_dict({})
    assert config == TrainConfig()
    assert config.alpha == 16.0 and config.heating_target == 4.0 and config.ice_scale == 64.0
    assert config.batch_size == config.classes_per_batch * config.samples_per_class
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="temprature"):
        TrainConfig.from_dict({"temprature": 0.1})


@pytest.mark.parametrize(
    "key, value",
    [
        ("alpha", 0),
        ("alpha", -1.0),
        ("alpha", float("nan")),
        ("val_fraction", 1.5),
        ("val_fraction", 0.0),
        ("dropout", 1),
        ("heating_start", 2),
        ("embedding_dim", 1),
        ("classes_per_batch", 1),
        ("lr", 0.0),
        ("ice_scale", float("inf")),
        ("weight_decay", -0.1),
        ("momentum", 1.0),
        ("epochs", 0),
        ("loss", "triplet"),
        ("normalization", "batch"),
    ],
)
def test_out_of_range_value_names_key(key, value):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({key: value})
    assert key in str(info.value)


def test_ice_needs_two_samples_per_class():
    with pytest.raises(ConfigError, match="samples_per_class"):
        TrainConfig.from_dict({"loss": "ice", "samples_per_class": 1})
    assert TrainConfig.from_dict({"loss": "softmax", "samples_per_class": 1}).samples_per_class == 1


def test_heating_target_above_alpha_is_refused():
    with pytest.raises(ConfigError, match="heating_target"):
        TrainConfig.from_dict({"alpha": 4.0, "heating_target": 8.0})
    # without heating the target is unused
    assert TrainConfig.from_dict({"alpha": 4.0, "heating_target": 8.0, "heating": "none"}).alpha == 4.0


def test_string_coercion():
    config = TrainConfig.from_dict({"alpha": "16", "learn_alpha": "true", "weight_norm": "False", "epochs": "3", "embedding_dim": 32.0})
    assert config.alpha == 16.0 and isinstance(config.alpha, float)
    assert config.learn_alpha is True and config.weight_norm is False
    assert config.epochs == 3 and isinstance(config.epochs, int)
    assert config.embedding_dim == 32 and isinstance(config.embedding_dim, int)


@pytest.mark.parametrize(
    "key, value",
    [
        ("classes_per_batch", True),
        ("epochs", 2.5),
        ("epochs", "three"),
        ("alpha", "hot"),
        ("alpha", False),
        ("learn_alpha", 1),
        ("loss", 3),
    ],
)
def test_bad_types_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        TrainConfig.from_dict({key: value})


def test_not_a_mapping():
    with pytest.raises(ConfigError):
        TrainConfig.from_dict([("alpha", 16)])


def test_config_is_frozen():
    config = TrainConfig.from_dict({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.alpha = 4.0  # type: ignore[misc]
    changed = config.replace(alpha=32.0)
    assert changed.alpha == 32.0 and config.alpha == 16.0
    with pytest.raises(ConfigError, match="alpha"):
        config.replace(alpha=0)


# -- checkpoint bundles ----------------------------------------------------------------------


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


# -- engine: determinism and resumption -----------------------------------------------------


@pytest.fixture
def one_thread():
    # a tiny CNN on an oversubscribed CPU is many times slower with several intra-op threads
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_fit_is_deterministic_and_resumes(one_thread):
    from trainables.core.data import load_dataset
    from trainables.core.engine import fit

    config = TrainConfig.from_dict(dict(dataset="synthetic", epochs=2, classes_per_batch=8, samples_per_class=2, embedding_dim=16))
    cpu = torch.device("cpu")

    def run(**kwargs):
        history, bundles = {}, {}

        def on_epoch(epoch, metrics, state):
            history[epoch] = dict(metrics)
            bundles[epoch] = copy.deepcopy(state.bundle())

        final = fit(config, on_epoch, mode="study", device=cpu, **kwargs)
        return final, history, bundles

    first, hist_a, bundles = run()  # loads the synthetic data itself
    splits = load_dataset("synthetic", None, 0)
    second, hist_b, _ = run(splits=splits)
    assert sorted(hist_a) == [1, 2]
    for epoch in (1, 2):
        assert hist_a[epoch]["train_loss"] == hist_b[epoch]["train_loss"]
        assert math.isfinite(hist_a[epoch]["train_loss"])
    val_keys = [k for k in hist_a[2] if k.startswith("val_")]
    assert "val_recall_at_1" in val_keys
    assert {k: hist_a[2][k] for k in val_keys} == {k: hist_b[2][k] for k in val_keys}
    assert first.metrics["train_loss"] == second.metrics["train_loss"]
    # the engine applies the schedule of each (0-based) epoch to the loss and the optimizer
    for epoch in (1, 2):
        assert hist_a[epoch]["alpha"] == pytest.approx(schedule.alpha_at(config, epoch - 1))
        assert hist_a[epoch]["lr"] == pytest.approx(config.lr * schedule.lr_factor_at(config, epoch - 1))
    assert hist_a[1]["alpha"] == pytest.approx(16.0)

    assert bundles[1]["epoch"] == 1
    resumed, hist_r, _ = run(splits=splits, resume=bundles[1])
    assert sorted(hist_r) == [2]  # only the remaining epoch is trained
    assert hist_r[2]["train_loss"] == pytest.approx(hist_a[2]["train_loss"], abs=1e-6)
    for key in val_keys:
        assert hist_r[2][key] == pytest.approx(hist_a[2][key], abs=1e-6), key
    assert resumed.epoch == 2

"""Numbers out of range (reliability issue 33, finding 6): every numeric config key has the range its consumer accepts.

The bounds below are written by hand from the consumers: faiss's k-means takes its seed as a C int (2**31 - 1 =
2147483647; 2**31 raises OverflowError), the loss and the optimizer compute in float32 (largest 3.40282e+38),
fractions and probabilities lie in [0, 1] or (0, 1). TrainConfig.from_dict refuses a value outside its key's range
naming the key, the value and the bound; a search space's bounds, choices and grid values are refused before Ray
starts, naming the file and the place in it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from study.search.spaces import SpaceError, load_space
from trainables.core import config
from trainables.core.config import ConfigError, TrainConfig

# (key, refused value, the bound the message must show), each one step outside the range
OUTSIDE = [
    ("seed", 2**31, "[0, 2147483647]"),
    ("seed", -1, "[0, 2147483647]"),
    ("epochs", 0, "[1, 100000]"),
    ("epochs", 100_001, "[1, 100000]"),
    ("embedding_dim", 8193, "[2, 8192]"),
    ("backbone_width", 0, "[1, 4096]"),
    ("classes_per_batch", 1, "[2, 1024]"),
    ("classes_per_batch", 1025, "[2, 1024]"),
    ("samples_per_class", 0, "[1, 64]"),
    ("samples_per_class", 65, "[1, 64]"),
    ("image_size", 7, "0 (the dataset's default) or an integer in [8, 1024]"),
    ("image_size", 1025, "[8, 1024]"),
    ("alpha", 1e39, "(0, 3.40282e+38]"),
    ("ice_scale", 0.0, "(0, 3.40282e+38]"),
    ("heating_target", float("inf"), "(0, 3.40282e+38]"),
    ("lr", float("nan"), "(0, 3.40282e+38]"),
    ("lr", 0.0, "(0, 3.40282e+38]"),
    ("heating_lr_factor", 0.0, "(0, 3.40282e+38]"),
    ("weight_decay", -1e-9, "[0, 3.40282e+38]"),
    ("mean_proxy_weight", 1e39, "[0, 3.40282e+38]"),
    ("new_layer_lr_mult", -1.0, "[0, 3.40282e+38]"),
    ("heating_start", 1.01, "[0, 1]"),
    ("lr_decay_start", -0.01, "[0, 1]"),
    ("momentum", 1.0, "[0, 1)"),
    ("dropout", 1.0, "[0, 1)"),
    ("val_fraction", 1.0, "(0, 1)"),
    ("val_fraction", 0.0, "(0, 1)"),
    ("val_fold", -1, "[0, 10000]"),
    ("augment", 4.01, "[0, 4]"),
    ("seed", 10**400, "[0, 2147483647]"),  # beyond float's range: math.isfinite and float() raise OverflowError
    ("lr", 10**400, "(0, 3.40282e+38]"),
]

# (key, value at the edge of the range): accepted
INSIDE = [
    ("seed", 2**31 - 1),
    ("seed", 0),
    ("epochs", 100_000),
    ("embedding_dim", 8192),
    ("backbone_width", 1),
    ("classes_per_batch", 1024),
    ("samples_per_class", 64),
    ("image_size", 0),
    ("image_size", 1024),
    ("alpha", 3.4e38),
    ("weight_decay", 0.0),
    ("heating_start", 1.0),
    ("momentum", 0.0),
    ("val_fraction", 0.999),
    ("augment", 4.0),
]


INTEGERS = {"classes_per_batch", "samples_per_class", "embedding_dim", "backbone_width", "epochs", "seed", "image_size", "val_fold"}
FLOATS = {"alpha", "heating_target", "heating_start", "heating_lr_factor", "ice_scale", "mean_proxy_weight", "dropout", "lr"}
FLOATS |= {"lr_decay_start", "weight_decay", "momentum", "new_layer_lr_mult", "augment", "val_fraction"}


def test_every_integer_and_float_key_has_a_range():
    assert {f.name for f in dataclasses.fields(TrainConfig) if f.type == "int"} == INTEGERS
    assert {f.name for f in dataclasses.fields(TrainConfig) if f.type == "float"} == FLOATS
    assert set(config.RANGES) == INTEGERS | FLOATS
    assert {key for key, _, _ in OUTSIDE} == INTEGERS | FLOATS  # every range is tried from outside below


@pytest.mark.parametrize(("key", "value", "bound"), OUTSIDE, ids=[f"{k}={v}" for k, v, _ in OUTSIDE])
def test_a_value_outside_its_range_is_refused_naming_key_value_and_bound(key, value, bound):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({key: value}, source="run.yaml")
    message = str(info.value)
    assert message.startswith(f"run.yaml: {key}={value!r} is not allowed; expected "), message
    assert bound in message, message


@pytest.mark.parametrize(("key", "value"), INSIDE, ids=[f"{k}={v}" for k, v in INSIDE])
def test_a_value_at_the_edge_of_its_range_is_accepted(key, value):
    assert getattr(TrainConfig.from_dict({key: value}), key) == value


def test_every_seed_faiss_rejects_is_refused_before_training():
    """A study whose every trial failed: its seed reached faiss's k-means (a C int) only at the first evaluation."""
    with pytest.raises(ConfigError, match=r"seed=4294967295 is not allowed; expected an integer in \[0, 2147483647\]"):
        TrainConfig.from_dict({"seed": 2**32 - 1})


# -- search spaces: the same ranges, checked where the file says them ------------------------------------------------


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


LR = {"lr": {"type": "float", "low": 0.001, "high": 0.01}}

SPACES = [
    # (id, space, where the message points, the refused value, the bound)
    ("seed_high", {"params": {"seed": {"type": "int", "low": 0, "high": 2**32}}}, "params.seed.high", "4294967296", "[0, 2147483647]"),
    ("seed_low", {"params": {"seed": {"type": "int", "low": -5, "high": 10}}}, "params.seed.low", "-5", "[0, 2147483647]"),
    ("epochs_high", {"params": {"epochs": {"type": "int", "low": 1, "high": 10**6}}}, "params.epochs.high", "1000000", "[1, 100000]"),
    (
        "fraction_high_never_drawn",
        {"params": {"val_fraction": {"type": "float", "low": 0.1, "high": 1.0}}},
        "params.val_fraction.high",
        "1.0",
        "(0, 1)",
    ),
    (
        "image_size_range_through_zero",
        {"params": {"image_size": {"type": "int", "low": 0, "high": 64}}},
        "params.image_size.low",
        "0",
        "[8, 1024]",
    ),
    ("seed_beyond_float", {"params": {"seed": {"type": "int", "low": 0, "high": 10**400}}}, "params.seed.high", "1000", "[0, 2147483647]"),
    ("lr_beyond_float", {"params": {"lr": {"type": "float", "low": 0.1, "high": 10**400}}}, "params.lr.high", "1000", "(0, 3.40282e+38]"),
    (
        "seed_choice",
        {"params": {"seed": {"type": "categorical", "choices": [0, 2**32]}}},
        "params.seed.choices",
        "4294967296",
        "2147483647",
    ),
    ("dim_choice_string", {"params": {"embedding_dim": ["64", "9000"]}}, "params.embedding_dim.choices", "'9000'", "[2, 8192]"),
    ("seed_grid", {"grid": {"seed": [0, 2**32]}}, "grid.seed", "4294967296", "[0, 2147483647]"),
    ("batch_grid", {"grid": {"samples_per_class": [4, 100]}}, "grid.samples_per_class", "100", "[1, 64]"),
    ("budget_factor_high", {"final_budget_factor": 101, "params": LR}, "final_budget_factor", "101", "[1, 100]"),
    ("budget_factor_inf", {"final_budget_factor": float("inf"), "params": LR}, "final_budget_factor", "inf", "[1, 100]"),
    ("budget_factor_low", {"final_budget_factor": 0.5, "params": LR}, "final_budget_factor", "0.5", "[1, 100]"),
]


@pytest.mark.parametrize(("spec", "where", "value", "bound"), [c[1:] for c in SPACES], ids=[c[0] for c in SPACES])
def test_a_space_bound_outside_its_keys_range_is_refused_where_the_file_says_it(tmp_path, spec, where, value, bound):
    path = write(tmp_path, spec)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {where}: {value}"), message
    assert "; expected " in message and bound in message, message
    assert "\n" not in message


def test_final_epochs_beyond_the_epochs_range_are_refused(tmp_path):
    """20 x 10000 trial epochs = 200000 final epochs, above epochs' 100000: study.final could not train the pick."""
    path = write(tmp_path, {"fixed": {"epochs": 10_000}, "final_budget_factor": 20, "params": LR})
    with pytest.raises(SpaceError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(f"{path}: final_budget_factor: 20"), message
    assert "200000" in message and "[1, 100000]" in message, message
    assert load_space(write(tmp_path, {"fixed": {"epochs": 5_000}, "final_budget_factor": 20, "params": LR})).final_epochs(5_000) == 100_000


def test_a_space_inside_the_ranges_loads(tmp_path):
    spec = {
        "final_budget_factor": 100,
        "fixed": {"epochs": 3},
        "params": {
            "seed": {"type": "int", "low": 0, "high": 2**31 - 1},
            "image_size": {"type": "categorical", "choices": [0, 16, 1024]},
            "val_fraction": {"type": "float", "low": 0.1, "high": 0.9},
        },
    }
    space = load_space(write(tmp_path, spec))
    assert space.final_budget_factor == 100.0 and space.final_epochs(3) == 300

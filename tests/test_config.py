"""Tests of TrainConfig validation: each error checked by the key it must name.

Allowed values of choice keys are config's names of what each registry builds (checked against
the registries here); the registries' own tests are beside each (test_losses, test_models,
test_optimizers, test_data).
"""

from __future__ import annotations

import dataclasses

import pytest

from trainables.core import config
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import DATASETS
from trainables.core.losses import LOSSES
from trainables.core.models import BACKBONES, NORMALIZATIONS
from trainables.core.optimizers import OPTIMIZERS


@pytest.mark.parametrize(
    ("key", "registry", "choices"),
    [
        ("loss", LOSSES, config.LOSS_CHOICES),
        ("normalization", NORMALIZATIONS, config.NORMALIZATION_CHOICES),
        ("optimizer", OPTIMIZERS, config.OPTIMIZER_CHOICES),
        ("backbone", BACKBONES, config.BACKBONE_CHOICES),
        ("dataset", DATASETS, config.DATASET_CHOICES),
    ],
)
def test_each_name_config_allows_is_built_by_its_registry_and_nothing_else(key, registry, choices):
    assert tuple(registry) == choices
    with pytest.raises(ConfigError, match=f"{key}='nope' is not allowed; expected one of {', '.join(choices)}"):
        TrainConfig.from_dict({key: "nope"})


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
        ("augment", -0.5),
        ("augment", 4.5),
        ("augment", float("nan")),
        ("val_split", "alphabet"),
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

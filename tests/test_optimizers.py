"""Tests of trainables.core.optimizers: each registered name builds its torch optimizer with the config's values."""

from __future__ import annotations

import pytest
import torch

from trainables.core.config import ConfigError, TrainConfig
from trainables.core.optimizers import OPTIMIZERS, build_optimizer

EXPECTED = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def groups() -> list[dict]:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    return [{"params": [a], "lr": 0.01, "base_lr": 0.01}, {"params": [b], "lr": 0.1, "base_lr": 0.1}]


def test_registry_names_the_config_choices():
    assert set(OPTIMIZERS) == set(EXPECTED)
    for name in OPTIMIZERS:
        assert TrainConfig.from_dict({"optimizer": name}).optimizer == name
    with pytest.raises(ConfigError, match="optimizer.*one of sgd, adam, adamw"):
        TrainConfig.from_dict({"optimizer": "lamb"})


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_build_optimizer_keeps_groups_and_config_values(name):
    config = TrainConfig.from_dict({"optimizer": name, "weight_decay": 0.01, "momentum": 0.5})
    optimizer = build_optimizer(groups(), config)
    assert type(optimizer) is EXPECTED[name]
    assert [g["lr"] for g in optimizer.param_groups] == [0.01, 0.1]
    assert [g["base_lr"] for g in optimizer.param_groups] == [0.01, 0.1]  # kept for schedule.set_lr
    assert all(g["weight_decay"] == 0.01 for g in optimizer.param_groups)
    if name == "sgd":
        assert all(g["momentum"] == 0.5 for g in optimizer.param_groups)

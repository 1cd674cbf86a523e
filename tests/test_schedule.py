"""Tests of trainables.core.schedule: heating and learning-rate factors worked out by hand.

Reference: 000_4178e6910e81cd2f: train at alpha = 16, then fine-tune at 4 with the learning
rate x 0.1.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainables.core import schedule
from trainables.core.config import TrainConfig


def cfg(**values) -> TrainConfig:
    return TrainConfig.from_dict(
        {"epochs": 40, "alpha": 16.0, "heating_target": 4.0, "heating_start": 0.75, "heating_lr_factor": 0.1, **values}
    )


def test_schedule_none():
    config = cfg(heating="none", lr_schedule="constant")
    for epoch in (0, 10, 29, 30, 39):
        assert schedule.alpha_at(config, epoch) == 16.0
        assert schedule.lr_factor_at(config, epoch) == 1.0
    stepped = cfg(heating="none", lr_schedule="step")  # the lr drop needs no heating
    assert [schedule.lr_factor_at(stepped, e) for e in (29.9, 30)] == pytest.approx([1.0, 0.1])
    assert schedule.alpha_at(stepped, 39) == 16.0


def test_schedule_two_stage():
    config = cfg(heating="two_stage", lr_schedule="step")
    for epoch in range(30):
        assert schedule.alpha_at(config, epoch) == pytest.approx(16.0), epoch
        assert schedule.lr_factor_at(config, epoch) == pytest.approx(1.0), epoch
    for epoch in range(30, 40):
        assert schedule.alpha_at(config, epoch) == pytest.approx(4.0), epoch
        assert schedule.lr_factor_at(config, epoch) == pytest.approx(0.1), epoch


def test_schedule_two_stage_never_heats_with_start_one():
    config = cfg(heating="two_stage", heating_start=1.0)
    assert [schedule.alpha_at(config, e) for e in range(40)] == [16.0] * 40


# linear / cosine: heating starts at 0.75 of the 40-epoch budget, epoch 30, and ends with the budget
# (the per-step schedule reaches the target at epoch 40); progress t = (epoch - 30) / 10.
@pytest.mark.parametrize(
    "epoch, t_linear, t_cosine",
    [
        (0, 0.0, 0.0),
        (29, 0.0, 0.0),
        (30, 0.0, 0.0),
        (32.5, 0.25, 0.5 * (1 - math.cos(math.pi / 4))),  # 0.1464...
        (35, 0.5, 0.5),
        (37.5, 0.75, 0.5 * (1 + math.cos(math.pi / 4))),  # 0.8535...
        (40, 1.0, 1.0),
    ],
)
def test_schedule_linear_and_cosine(epoch, t_linear, t_cosine):
    for heating, t in (("linear", t_linear), ("cosine", t_cosine)):
        config = cfg(heating=heating, lr_schedule="step")
        assert schedule.alpha_at(config, epoch) == pytest.approx(16.0 - 12.0 * t, abs=1e-12), (heating, epoch)
        assert schedule.lr_factor_at(config, epoch) == pytest.approx(1.0 if epoch < 30 else 0.1, abs=1e-12), (heating, epoch)


def test_schedule_linear_values_by_hand():
    config = cfg(heating="linear")
    assert schedule.alpha_at(config, 35) == pytest.approx(10.0)
    assert schedule.alpha_at(config, 31) == pytest.approx(16.0 - 12.0 / 10)
    assert schedule.alpha_at(config, 39) == pytest.approx(16.0 - 12.0 * 0.9)
    assert schedule.alpha_at(config, 40) == pytest.approx(4.0)
    cos = cfg(heating="cosine")
    assert schedule.alpha_at(cos, 32.5) == pytest.approx(14.242640687119286)  # 16 - 12 (1 - 1/sqrt 2)/2


def test_set_lr_scales_base_lr_of_every_group():
    config = cfg(lr=0.01, new_layer_lr_mult=10.0)
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD(schedule.param_groups([a], [b], config))
    assert schedule.set_lr(optimizer, 0.1) == pytest.approx(0.001)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.001, 0.01])

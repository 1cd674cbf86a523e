"""trainables.cadence: which epochs of a trial carry a checkpoint, on a clock the test sets by hand."""

from __future__ import annotations

import pytest

from trainables.cadence import CheckpointCadence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def taken(every_s: float, epoch_ends: list[float]) -> list[bool]:
    """take() after epochs ending at these times (seconds after the trial's start at t = 100)."""
    clock = Clock()
    cadence = CheckpointCadence(every_s, clock=clock)
    out = []
    for t in epoch_ends:
        clock.now = 100.0 + t
        out.append(cadence.take())
    return out


def test_zero_checkpoints_every_epoch():
    assert taken(0.0, [0.0, 0.0, 1.0, 1.0]) == [True, True, True, True]


def test_at_most_one_checkpoint_per_period_counted_from_the_last_one():
    # every 10 s from the start at 0: 5 no, 10 yes (last=10), 15 no, 19.9 no, 21 yes (last=21), 30 no, 31 yes
    assert taken(10.0, [5, 10, 15, 19.9, 21, 30, 31]) == [False, True, False, False, True, False, True]


def test_epochs_longer_than_the_period_are_each_checkpointed():
    assert taken(60.0, [75, 150, 225]) == [True, True, True]


@pytest.mark.parametrize("every_s", [-1.0, float("nan"), float("inf")])
def test_a_period_that_is_not_finite_seconds_is_refused(every_s):
    with pytest.raises(ValueError, match="checkpoint_every_s"):
        CheckpointCadence(every_s)

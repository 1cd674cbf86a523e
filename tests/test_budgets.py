"""Budget-aware schedules and the ladder of budgets (trainables/core/schedule.py, budgets.py).

References: schedule values worked out by hand for small budgets; the ladder's
last budget checked against a direct ``engine.fit`` to that budget (a promoted
trial must end exactly where a trial trained straight to the budget ends).
"""

from __future__ import annotations

import math

import pytest
import torch

from trainables.core import schedule
from trainables.core.budgets import LadderState, fit_budgets, rung_budgets
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import load_dataset
from trainables.core.engine import fit


def cfg(**values) -> TrainConfig:
    base = {"alpha": 16.0, "heating_target": 4.0, "heating_start": 0.75, "heating_lr_factor": 0.1, "lr_decay_start": 0.75}
    return TrainConfig.from_dict({**base, **values})


# -- budgets -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("max_epochs", "grace", "eta", "expected"),
    [(12, 4, 3, [4, 12]), (36, 4, 3, [4, 12, 36]), (30, 2, 3, [2, 6, 18, 30]), (8, 8, 3, [8]), (10, 1, 2, [1, 2, 4, 8, 10])],
)
def test_rung_budgets_by_hand(max_epochs, grace, eta, expected):
    assert rung_budgets(max_epochs, grace, eta) == expected


def test_rung_budgets_refuse_bad_arguments():
    with pytest.raises(ValueError, match="grace_period"):
        rung_budgets(4, 5, 3)
    with pytest.raises(ValueError, match="reduction_factor"):
        rung_budgets(12, 2, 1.0)


# -- schedules scale to the budget -------------------------------------------------------------------
def test_two_stage_heating_and_step_lr_start_at_the_same_fraction_of_every_budget():
    for budget, start in ((4, 3), (8, 6), (12, 9), (30, 22)):  # floor(0.75 * budget)
        c = cfg(heating="two_stage", lr_schedule="step", epochs=budget)
        assert schedule.alpha_at(c, start - 0.01) == 16.0 and schedule.lr_factor_at(c, start - 0.01) == 1.0
        assert schedule.alpha_at(c, start) == 4.0 and schedule.lr_factor_at(c, start) == pytest.approx(0.1)
        assert schedule.shared_prefix(c) == start


def test_linear_and_cosine_lr_by_hand():
    c = cfg(heating="none", lr_schedule="linear", epochs=4)  # decays over [3, 4]
    assert [schedule.lr_factor_at(c, e) for e in (0, 2.9, 3.0, 3.5, 3.75, 4.0)] == pytest.approx([1, 1, 1, 0.5, 0.25, 0])
    c = cfg(heating="none", lr_schedule="linear", lr_decay_start=0.0, epochs=10)  # linear-to-zero over the budget
    assert [schedule.lr_factor_at(c, e) for e in (0, 2.5, 5, 9)] == pytest.approx([1, 0.75, 0.5, 0.1])
    assert schedule.shared_prefix(c) == 0
    c = cfg(heating="none", lr_schedule="cosine", epochs=8)  # decays over [6, 8]
    assert schedule.lr_factor_at(c, 7.0) == pytest.approx(0.5)
    assert schedule.lr_factor_at(c, 6.5) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert schedule.lr_factor_at(cfg(lr_schedule="constant", epochs=8), 7.9) == 1.0


def test_gradual_heating_by_hand():
    c = cfg(heating="linear", lr_schedule="constant", epochs=8)  # alpha 16 -> 4 over [6, 8]
    assert [schedule.alpha_at(c, e) for e in (5.9, 6.0, 7.0, 7.5, 8.0)] == pytest.approx([16, 16, 10, 7, 4])
    c = cfg(heating="cosine", lr_schedule="constant", epochs=8)
    assert schedule.alpha_at(c, 7.0) == pytest.approx(10.0)


def test_shared_prefix_is_the_earliest_tail_start():
    assert schedule.shared_prefix(cfg(heating="two_stage", heating_start=0.5, lr_schedule="step", epochs=12)) == 6
    assert schedule.shared_prefix(cfg(heating="none", lr_schedule="constant", epochs=12)) == 12
    assert schedule.shared_prefix(cfg(loss="ice", heating="two_stage", heating_start=0.25, lr_schedule="cosine", epochs=12)) == 9
    assert schedule.shared_prefix(cfg(heating="two_stage", heating_start=1.0, lr_schedule="constant", epochs=12)) == 12


def test_lr_schedule_keys_are_validated():
    with pytest.raises(ConfigError, match="lr_schedule"):
        cfg(lr_schedule="exponential")
    with pytest.raises(ConfigError, match="lr_decay_start"):
        cfg(lr_decay_start=1.5)


# -- the ladder --------------------------------------------------------------------------------------
SMALL = dict(dataset="synthetic", classes_per_batch=8, samples_per_class=2, embedding_dim=16, heating="two_stage", lr_schedule="step")


@pytest.fixture(scope="module")
def splits():
    return load_dataset("synthetic", None, 0)


def ladder(config, budgets, splits, state=None, stop_after=None):
    seen, states = [], []

    def on_epoch(metrics, ladder_state):
        seen.append(dict(metrics))
        states.append(ladder_state)
        if stop_after is not None and ladder_state.epochs_trained == stop_after:
            raise KeyboardInterrupt  # an interruption after this epoch's report

    try:
        fit_budgets(config, budgets, on_epoch, state=state, mode="study", splits=splits, device=torch.device("cpu"))
    except KeyboardInterrupt:
        pass
    return seen, states


def test_each_rung_sees_a_finished_schedule_and_a_promotion_continues_before_the_tail(splits):
    config = TrainConfig.from_dict({**SMALL, "epochs": 4})
    seen, _ = ladder(config, [2, 4], splits)
    # budget 2: epochs 1-2; its prefix is floor(0.75 * 2) = 1 epoch, so budget 4 trains epochs 2, 3, 4
    assert [(m["budget"], m["epoch"], m["epochs_trained"]) for m in seen] == [(2, 1, 1), (2, 2, 2), (4, 2, 3), (4, 3, 4), (4, 4, 5)]
    assert [m["completed_budget"] for m in seen] == [0, 2, 2, 2, 4]
    assert [m.get("objective_step") for m in seen] == [None, 2, None, None, 4]
    for m in seen:
        end = m["epoch"] == m["budget"]
        # at each decision alpha and lr are the schedule's end values for that budget
        assert m["alpha_now"] == pytest.approx(4.0 if end else 16.0), m
        assert m["lr_now"] == pytest.approx(config.lr * (0.1 if end else 1.0)), m
    assert seen[2]["epoch"] == 2 and seen[2]["alpha_now"] == 16.0  # the budget-4 run is not heated at its epoch 2


def test_the_last_budget_ends_where_a_direct_run_to_it_ends(splits, monkeypatch):
    torch.set_num_threads(1)
    config = TrainConfig.from_dict({**SMALL, "epochs": 4})
    seen, _ = ladder(config, [2, 4], splits)
    direct = {}
    fit(config, lambda epoch, metrics, run: direct.update({epoch: dict(metrics)}), mode="study", splits=splits, device=torch.device("cpu"))
    last = seen[-1]
    assert last["train_loss"] == pytest.approx(direct[4]["train_loss"], rel=1e-6)
    assert last["val_recall_at_1"] == pytest.approx(direct[4]["val_recall_at_1"])
    assert last["val_map_at_r"] == pytest.approx(direct[4]["val_map_at_r"], rel=1e-6)


def test_an_interrupted_ladder_resumes_to_the_same_end(splits):
    torch.set_num_threads(1)
    config = TrainConfig.from_dict({**SMALL, "epochs": 6})
    whole, _ = ladder(config, [2, 6], splits)
    for stop in (1, 2, 3):  # inside budget 2, at its end, inside budget 6
        first, states = ladder(config, [2, 6], splits, stop_after=stop)
        assert states[-1].epochs_trained == stop
        rest, _ = ladder(config, [2, 6], splits, state=states[-1])
        combined = first + rest
        assert [(m["budget"], m["epoch"]) for m in combined] == [(m["budget"], m["epoch"]) for m in whole], stop
        assert combined[-1]["train_loss"] == pytest.approx(whole[-1]["train_loss"], rel=1e-6), stop
        assert combined[-1]["epochs_trained"] == whole[-1]["epochs_trained"] == 2 + 5


def test_a_schedule_with_no_shared_prefix_restarts_the_next_budget_from_scratch(splits):
    config = TrainConfig.from_dict({**SMALL, "epochs": 3, "heating": "none", "lr_schedule": "linear", "lr_decay_start": 0.0})
    seen, _ = ladder(config, [1, 3], splits)
    assert [(m["budget"], m["epoch"]) for m in seen] == [(1, 1), (3, 1), (3, 2), (3, 3)]
    assert seen[0]["lr_now"] < 0.1 * config.lr  # linear to zero within the one-epoch budget


def test_single_budget_reports_every_epoch_as_an_objective_step(splits):
    config = TrainConfig.from_dict({**SMALL, "epochs": 2})
    seen, states = ladder(config, [2], splits)
    assert [m["objective_step"] for m in seen] == [1, 2]
    assert isinstance(states[-1], LadderState) and states[-1].completed_budget == 2

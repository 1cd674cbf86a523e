"""Picking the best configuration over extra seeds (study/selection.py), against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest

from study.interrupts import StopSignals
from study.selection import extra_seeds, select, top_complete, with_seed


def test_top_complete_orders_by_mode_and_skips_missing_values():
    values = {0: 0.91, 1: float("nan"), 2: 0.95, 3: None, 4: 0.93, 5: 0.95}
    assert top_complete(values, 3, "max") == [2, 5, 4]
    assert top_complete(values, 2, "min") == [0, 4]
    assert top_complete({}, 3, "max") == []


def test_extra_seeds_follow_the_configs_seed():
    assert extra_seeds({"seed": 7, "lr": 0.1}, 2) == [8, 9]
    assert extra_seeds({}, 1) == [1]
    assert with_seed({"seed": 0, "lr": 0.1}, 3) == {"seed": 3, "lr": 0.1}


def test_select_by_mean_with_the_lead_in_standard_errors():
    # A: 0.96, 0.95, 0.97 -> mean 0.96, sd 0.01, se 0.01/sqrt(3); B: 0.965, 0.935, 0.95 -> mean 0.95, sd 0.015
    selection = select({1: [0.965, 0.935, 0.95], 0: [0.96, 0.95, 0.97]}, "max")
    assert [c.key for c in selection.ranking] == [0, 1]
    assert selection.winner.mean == pytest.approx(0.96)
    assert selection.winner.sem == pytest.approx(0.01 / math.sqrt(3))
    se = math.sqrt(0.01**2 / 3 + 0.015**2 / 3)
    assert selection.lead == pytest.approx(0.01)
    assert selection.lead_in_se == pytest.approx(0.01 / se)  # 0.96
    assert selection.verdict().startswith("within noise")
    # B steadier at 0.95, 0.945, 0.955: sd 0.005, lead 0.01 / sqrt((0.01^2 + 0.005^2) / 3) = 1.55 standard errors
    selection = select({0: [0.96, 0.95, 0.97], 1: [0.95, 0.945, 0.955]}, "max")
    assert selection.lead_in_se == pytest.approx(0.01 / math.sqrt((0.01**2 + 0.005**2) / 3))
    assert selection.verdict().startswith("likely")


def test_a_higher_single_score_loses_to_a_better_mean():
    # trial 3 was best in the study (0.97) but its extra seeds fall back; trial 5 is steadier
    selection = select({3: [0.97, 0.94, 0.94], 5: [0.96, 0.96, 0.96]}, "max")
    assert selection.winner.key == 5  # mean 0.96 against 0.95
    assert selection.lead_in_se == pytest.approx(0.01 / math.sqrt(0.0003 / 3))  # trial 5 has sd 0: se from trial 3 alone
    assert selection.verdict().startswith("likely")


def test_select_min_mode_and_noise_verdict():
    selection = select({0: [0.30, 0.36], 1: [0.31, 0.33]}, "min")
    assert selection.winner.key == 1  # mean 0.32 < 0.33
    assert selection.lead == pytest.approx(0.01)
    assert selection.verdict().startswith("within noise")


def test_select_single_candidate_and_no_candidates():
    assert select({4: [0.9]}, "max").verdict() == "one candidate: no comparison"
    with pytest.raises(ValueError, match="no candidates"):
        select({}, "max")


# -- the confirmation stage of study.launch, with the Tuner replaced by a stand-in ------------------
def test_confirm_best_reruns_the_top_trials_with_extra_seeds_and_ranks_by_mean(monkeypatch):
    from types import SimpleNamespace

    import optuna

    from study import launch

    study = optuna.create_study(direction="maximize")
    for number, value in enumerate([0.90, 0.97, 0.95, 0.96]):
        study.add_trial(
            optuna.trial.create_trial(
                value=value, params={}, distributions={}, user_attrs={"config": {"lr": 0.001 * (number + 1), "seed": 0}}
            )
        )
    rerun = {0.002: 0.92, 0.004: 0.96, 0.003: 0.95}  # trial 1 (0.97) falls back on its extra seed; trial 3 holds
    asked, confirms = [], {}

    class FakeTuner:
        def __init__(self, jobs):  # {config_key: the Optuna trial it re-runs}
            asked.extend(json.loads(key) for key in jobs)
            confirms.update({json.loads(key)["lr"]: number for key, number in jobs.items()})

        def fit(self):
            return [SimpleNamespace(config=c, metrics={"val_recall_at_1": rerun[c["lr"]]}, error=None) for c in asked]

    monkeypatch.setattr(launch, "confirmation_tuner", lambda settings, recorder, jobs: FakeTuner(jobs))
    settings = SimpleNamespace(confirm_top=3, confirm_seeds=1, mode="max", metric="val_recall_at_1", space=SimpleNamespace(is_grid=False))
    selection = launch.confirm_best(settings, study, recorder=None, stops=StopSignals())
    assert study.user_attrs["selection"]["ranking"][0]["trial"] == 3  # kept in the Optuna storage for study.sync
    assert sorted((c["lr"], c["seed"]) for c in asked) == [(0.002, 1), (0.003, 1), (0.004, 1)]  # trials 1, 3, 2 with seed 0 + 1
    assert confirms == {0.002: 1, 0.003: 2, 0.004: 3}  # each re-run names the trial it confirms
    assert [c.key for c in selection.ranking] == [3, 2, 1]  # means 0.96, 0.95, 0.945
    assert selection.winner.scores == (0.96, 0.96)
    settings.confirm_seeds = 0
    assert launch.confirm_best(settings, study, recorder=None, stops=StopSignals()) is None


def test_a_selection_record_round_trips():
    from study.selection import selection_from_record, selection_record

    selection = select({0: [0.96, 0.95, 0.97], 1: [0.95, 0.945, 0.955]}, "max")
    again = selection_from_record(selection_record(selection), "max")
    assert again == selection

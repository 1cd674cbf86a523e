"""Picking the best configuration over extra seeds (study/selection.py), against hand-computed values."""

from __future__ import annotations

import math

import pytest

from study.selection import select, top_complete
from study.trial import extra_seeds, with_seed


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


@pytest.mark.parametrize(
    ("unfinished", "expected"),
    [(0, [1, 3, 2]), (1, [1, 3]), (2, [1]), (3, []), (5, [])],
)
def test_rerun_candidates_are_the_trials_no_unfinished_trial_can_push_out_of_the_top(unfinished, expected):
    from study.selection import rerun_candidates

    values = {0: 0.90, 1: 0.97, 2: 0.95, 3: 0.96}  # best first: 1, 3, 2, 0
    assert rerun_candidates(values, 3, "max", 1, unfinished) == expected
    assert rerun_candidates({0: 2.0, 1: 1.0, 2: 3.0}, 2, "min", 1, 1) == [1]


def test_nothing_is_a_rerun_candidate_without_seeds_or_a_second_finite_value():
    from study.selection import rerun_candidates

    assert rerun_candidates({0: 0.9, 1: 0.8}, 3, "max", 0) == []
    assert rerun_candidates({0: 0.9, 1: float("nan")}, 3, "max", 1) == []
    assert rerun_candidates({0: 0.9, 1: 0.8}, 3, "max", 2) == [0, 1]


def test_rerun_candidates_stay_in_the_final_top_whatever_the_unfinished_trials_score():
    """By brute force: for every outcome of 2 unfinished trials, the candidates are in the final top 3."""
    import itertools

    from study.selection import rerun_candidates

    values = {0: 0.5, 1: 0.7, 2: 0.6, 3: 0.2}
    settled = rerun_candidates(values, 3, "max", 1, unfinished=2)
    for a, b in itertools.product([0.1, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9], repeat=2):
        final = top_complete({**values, 4: a, 5: b}, 3, "max")
        assert set(settled) <= set(final)
    assert settled == [1]


# -- the selection of study.launch, from the Tuner's results with their re-runs ------------------
def test_selection_ranks_the_top_trials_by_the_mean_of_their_re_runs():
    from types import SimpleNamespace

    import optuna

    from study import launch
    from study.trial import confirmation_config

    study = optuna.create_study(direction="maximize")
    for number, value in enumerate([0.90, 0.97, 0.95, 0.96]):
        study.add_trial(
            optuna.trial.create_trial(
                value=value, params={}, distributions={}, user_attrs={"config": {"lr": 0.001 * (number + 1), "seed": 0}}
            )
        )
    rerun = {1: 0.92, 3: 0.96, 2: 0.95, 0: 0.99}  # trial 1 (0.97) falls back on its extra seed; trial 3 holds
    configs = {n: study.trials[n].user_attrs["config"] for n in rerun}

    def outcome(config, value, error=None):
        return SimpleNamespace(config=config, metrics={"val_recall_at_1": value}, error=error)

    results = [outcome(configs[n], study.trials[n].value) for n in range(4)]  # the search's own trials
    results += [outcome(confirmation_config(configs[n], 1, n), v) for n, v in rerun.items()]  # trial 0 is not in the top 3
    results.append(outcome(confirmation_config(configs[2], 2, 2), 0.1, error=RuntimeError("lost")))  # a failed re-run counts nothing
    settings = SimpleNamespace(record=SimpleNamespace(confirm_top=3, mode="max", metric="val_recall_at_1"), rerun_seeds=1)
    selection = launch.selection_of(settings, study, results)
    assert study.user_attrs["selection"]["ranking"][0]["trial"] == 3  # kept in the Optuna storage for study.sync
    assert [c.key for c in selection.ranking] == [3, 2, 1]  # means 0.96, 0.95, 0.945
    assert selection.winner.scores == (0.96, 0.96) and selection.ranking[2].scores == (0.97, 0.92)
    settings.rerun_seeds = 0  # a grid, or --confirm-seeds 0
    assert launch.selection_of(settings, study, results) is None


def test_a_selection_record_round_trips():
    from study.selection import selection_from_record, selection_record

    selection = select({0: [0.96, 0.95, 0.97], 1: [0.95, 0.945, 0.955]}, "max")
    again = selection_from_record(selection_record(selection), "max")
    assert again == selection

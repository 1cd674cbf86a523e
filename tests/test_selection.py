"""The race of the top trials over validation folds (study/search/race.py), against hand-computed values.

The t distribution's tail has closed forms for 1 and 2 degrees of freedom, so the p-values here are computed by
hand: df 1: P(T > t) = 1/2 - atan(t) / pi; df 2: P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2.
"""

from __future__ import annotations

import math

import pytest

from study.launch.tuner import replay_race
from study.search.race import (
    BUDGET,
    CLEAR,
    FOLDS,
    RaceRules,
    holm,
    paired_p_value,
    race,
    race_selection,
    seed_selection,
    selection_from_record,
    selection_record,
    top_complete,
)
from study.search.trial import CONFIRMS_KEY, FOLD_KEY, race_config, race_table


def sf_df1(t: float) -> float:
    return 0.5 - math.atan(t) / math.pi


def sf_df2(t: float) -> float:
    return (1 - t / math.sqrt(t * t + 2)) / 2


# A leads B a little, fold by fold, and C by far. The first test comes at 3 folds (FIRST_TEST). By hand (d = A - other):
# after folds 0-2: d(A, C) = 0.10, 0.10, 0.10 (sd 0: p 0); d(A, B) = 0.01, 0.005, 0.005: mean 0.006667, sd 0.0028868,
#   t = 0.006667 / (0.0028868 / sqrt 3) = 4.0, df 2 -> p = 0.02860; Holm over 2: C 0 x 2 = 0, B 0.0286 x 1 -> both dropped
# after folds 0, 1 only (no test yet): d(A, B) = 0.01, 0.005: t = 0.0075 / (0.0035355 / sqrt 2) = 3.0, df 1 -> p = 0.1024
TABLE = {
    1: {0: 0.90, 1: 0.91, 2: 0.92, 3: 0.93},  # A
    2: {0: 0.89, 1: 0.905, 2: 0.915, 3: 0.92},  # B
    3: {0: 0.80, 1: 0.81, 2: 0.82, 3: 0.83},  # C
}
OPEN = RaceRules("max", folds=4, budget_epochs=math.inf, epochs_per_run=10)


def test_top_complete_orders_by_mode_and_skips_missing_values():
    values = {0: 0.91, 1: float("nan"), 2: 0.95, 3: None, 4: 0.93, 5: 0.95}
    assert top_complete(values, 3, "max") == [2, 5, 4]
    assert top_complete(values, 2, "min") == [0, 4]
    assert top_complete({}, 3, "max") == []


def test_a_re_run_holds_out_another_fold_from_another_seed():
    config = {"seed": 7, "lr": 0.1}
    assert race_config(config, 2, 5) == {"seed": 9, "lr": 0.1, FOLD_KEY: 2, CONFIRMS_KEY: 5}
    assert race_config({}, 1, 0) == {"seed": 1, FOLD_KEY: 1, CONFIRMS_KEY: 0}
    assert config == {"seed": 7, "lr": 0.1}  # the trial's own config is left as it was


def test_the_race_table_puts_the_trials_own_score_at_fold_0():
    table = race_table({4: 0.9, 6: 0.8, 7: 0.7}, [4, 6], {(4, 1): 0.85, (6, 2): math.nan, (7, 1): 0.5})
    assert table == {4: {0: 0.9, 1: 0.85}, 6: {0: 0.8, 2: table[6][2]}} and math.isnan(table[6][2])


# -- the paired test ----------------------------------------------------------------------------
def test_paired_p_value_against_the_t_tails_by_hand():
    assert paired_p_value([0.90, 0.91], [0.89, 0.905], "max") == pytest.approx(sf_df1(3.0))
    assert paired_p_value([0.90, 0.91, 0.92], [0.89, 0.905, 0.915], "max") == pytest.approx(sf_df2(4.0))
    # mode min: lower is better, so the same numbers the other way round
    assert paired_p_value([0.89, 0.905, 0.915], [0.90, 0.91, 0.92], "min") == pytest.approx(sf_df2(4.0))
    # a leader behind on average: a p-value above 1/2
    assert paired_p_value([0.89, 0.905, 0.915], [0.90, 0.91, 0.92], "max") == pytest.approx(1 - sf_df2(4.0))


def test_paired_p_value_with_equal_differences_and_with_one_fold():
    assert paired_p_value([0.9, 0.8], [0.8, 0.7], "max") == 0.0  # ahead by 0.1 on both folds: no spread
    assert paired_p_value([0.8, 0.7], [0.8, 0.7], "max") == 1.0  # tied on both
    assert paired_p_value([0.9], [0.1], "max") == 1.0  # one fold proves nothing


def test_holm_step_down_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04, raised to the running max 0.06
    assert holm({7: 0.01, 8: 0.04, 9: 0.03}) == pytest.approx({7: 0.03, 9: 0.06, 8: 0.06})
    assert holm({1: 0.6, 2: 0.7}) == pytest.approx({1: 1.0, 2: 1.0})  # capped at 1
    assert holm({}) == {}


# -- the race -----------------------------------------------------------------------------------
def test_the_race_drops_the_clearly_beaten_at_its_first_test_and_stops_when_one_is_left():
    state = race(TABLE, OPEN)
    assert state.stopped == CLEAR and state.alive == (1,) and state.next_fold is None
    assert state.folds_done == 3  # fold 3 was never needed
    assert state.dropped[3] == (3, 0.0)  # C, by its constant lag
    assert state.dropped[2] == (3, pytest.approx(sf_df2(4.0)))  # B: Holm's factor 1 for the larger of two p-values


def test_no_candidate_is_dropped_before_the_first_test():
    one_round = {k: {f: v for f, v in scores.items() if f < 2} for k, scores in TABLE.items()}
    state = race(one_round, OPEN)
    assert state.alive == (1, 2, 3) and state.next_fold == 2 and state.stopped == ""  # waits for fold 2: no test yet
    assert state.p_values == {} and state.dropped == {}
    # with a first test at 2 folds, C (p 0) would go now and B stay: p = 0.1024 (df 1), Holm's x 1 after C's 0
    early = race(one_round, RaceRules("max", folds=4, budget_epochs=math.inf, epochs_per_run=10, first_test=2))
    assert early.alive == (1, 2) and early.p_values == pytest.approx({2: sf_df1(3.0)})


def test_the_race_stops_when_the_next_round_would_overspend_the_budget():
    # round 1: 3 runs of 10 epochs; round 2 would make 6 runs = 60 epochs
    state = race(TABLE, RaceRules("max", folds=4, budget_epochs=59, epochs_per_run=10))
    assert state.stopped == BUDGET and state.alive == (1, 2, 3) and state.folds_done == 2
    assert race(TABLE, RaceRules("max", folds=4, budget_epochs=60, epochs_per_run=10)).stopped == CLEAR


def test_round_1_runs_whatever_the_budget_and_the_race_stops_when_the_folds_run_out():
    first = race({k: {0: v[0]} for k, v in TABLE.items()}, RaceRules("max", folds=4, budget_epochs=1, epochs_per_run=10))
    assert first.next_fold == 1 and first.alive == (1, 2, 3)
    state = race(TABLE, RaceRules("max", folds=2, budget_epochs=math.inf, epochs_per_run=10))
    assert state.stopped == FOLDS and state.alive == (1, 2, 3) and state.folds_done == 2


def test_a_failed_re_run_drops_its_candidate_and_mode_min_races_the_other_way():
    table = {1: {0: 0.9, 1: math.nan}, 2: {0: 0.8, 1: 0.85}, 3: {0: 0.79, 1: 0.86}}  # 2 and 3 alike
    state = race(table, RaceRules("max", folds=2, budget_epochs=math.inf, epochs_per_run=1))
    assert 1 in state.dropped and math.isnan(state.dropped[1][1]) and state.alive == (2, 3)
    losses = {k: {f: 1 - v for f, v in scores.items()} for k, scores in TABLE.items()}  # lower is better
    assert race(losses, RaceRules("min", folds=4, budget_epochs=math.inf, epochs_per_run=10)).alive == (1,)


# -- the verdict --------------------------------------------------------------------------------
def test_a_clear_race_says_so_with_its_p_values():
    selection = race_selection(TABLE, OPEN)
    assert [c.key for c in selection.ranking] == [1, 2, 3]  # the winner, then B and C (both dropped at 3 folds), by mean
    assert selection.winner.folds == (0, 1, 2) and selection.winner.mean == pytest.approx(0.91)  # the folds it was judged on
    assert selection.ranking[1].dropped_after == 3 and selection.ranking[2].dropped_after == 3
    assert selection.verdict() == (
        f"clear: over 3 validation folds the winner beats every other candidate (paired t-test, Holm p <= {sf_df2(4.0):.3f})"
    )


def test_an_undecided_race_never_claims_more_than_its_test():
    one_round = {k: {f: v for f, v in scores.items() if f < 2} for k, scores in TABLE.items()}
    selection = race_selection(one_round, RaceRules("max", folds=4, budget_epochs=30, epochs_per_run=10))
    assert selection.stopped == BUDGET and [c.key for c in selection.ranking] == [1, 2, 3]
    # lead of A over B, paired: d = 0.01, 0.005 -> 0.0075, 3.0 standard errors (not a test: df 1 is not tested)
    assert selection.lead == pytest.approx(0.0075) and selection.lead_in_se == pytest.approx(3.0)
    verdict = selection.verdict()
    assert verdict.startswith("undecided: the confirmation budget is spent after 2 folds, before the race's first test (at 3 folds)")
    assert "leads by 0.0075" in verdict and "best mean of 3 candidates" in verdict and "clear" not in verdict
    # after a test that drops no one, the verdict gives its p-value: A against B on 3 folds with B level on fold 2
    level = {1: {0: 0.90, 1: 0.91, 2: 0.92}, 2: {0: 0.89, 1: 0.905, 2: 0.93}}
    tied = race_selection(level, RaceRules("max", folds=3, budget_epochs=math.inf, epochs_per_run=10))
    assert tied.stopped == FOLDS and tied.verdict().startswith("undecided: the validation folds ran out after 3 folds")
    # d = 0.01, 0.005, -0.01: mean 0.001667, sd 0.010408, t = 0.2774, df 2 -> p = 0.4037
    assert f"Holm p = {sf_df2(0.001667 / (0.010408 / math.sqrt(3))):.2f}" in tied.verdict()


def test_the_tie_is_every_candidate_the_race_kept_the_winner_first():
    """What study.final --members tied trains: a clear race's winner alone; an undecided race's survivors by mean (the
    candidates its test dropped left out); a record from before the race, its winner alone."""
    assert race_selection(TABLE, OPEN).tied == (1,)  # B and C dropped at the first test
    one_round = {k: {f: v for f, v in scores.items() if f < 2} for k, scores in TABLE.items()}
    assert race_selection(one_round, RaceRules("max", folds=4, budget_epochs=30, epochs_per_run=10)).tied == (1, 2, 3)
    # C lags by 0.1 on every fold (p 0, dropped); B is level with A on fold 2 (p 0.40, kept): the tie is A and B
    split = {1: {0: 0.90, 1: 0.91, 2: 0.92}, 2: {0: 0.89, 1: 0.905, 2: 0.93}, 3: {0: 0.80, 1: 0.81, 2: 0.82}}
    selection = race_selection(split, RaceRules("max", folds=3, budget_epochs=math.inf, epochs_per_run=10))
    assert selection.tied == (1, 2) and selection.ranking[-1].dropped_after == 3
    old = {"ranking": [{"trial": 0, "scores": [0.96, 0.95]}, {"trial": 1, "scores": [0.95, 0.955]}]}
    assert selection_from_record(old, "max").tied == (0,)


def test_a_selection_record_round_trips_and_an_old_seed_record_still_reads():
    selection = race_selection(TABLE, OPEN)
    assert selection_from_record(selection_record(selection), "max") == selection
    # a study recorded before the race: seed re-runs, judged by the lead over the standard error of the means
    old = {"ranking": [{"trial": 0, "scores": [0.96, 0.95, 0.97]}, {"trial": 1, "scores": [0.95, 0.945, 0.955]}]}
    again = selection_from_record(old, "max")
    assert again == seed_selection({0: [0.96, 0.95, 0.97], 1: [0.95, 0.945, 0.955]}, "max")
    assert again.lead_in_se == pytest.approx(0.01 / math.sqrt((0.01**2 + 0.005**2) / 3))  # 1.55
    assert again.verdict().startswith("likely") and again.winner.folds == ()


@pytest.mark.parametrize(
    ("unfinished", "expected"),
    [(0, [1, 3, 2]), (1, [1, 3]), (2, [1]), (3, []), (5, [])],
)
def test_rerun_candidates_are_the_trials_no_unfinished_trial_can_push_out_of_the_top(unfinished, expected):
    from study.search.race import rerun_candidates

    values = {0: 0.90, 1: 0.97, 2: 0.95, 3: 0.96}  # best first: 1, 3, 2, 0
    assert rerun_candidates(values, 3, "max", unfinished) == expected
    assert rerun_candidates({0: 2.0, 1: 1.0, 2: 3.0}, 2, "min", 1) == [1]


def test_nothing_races_without_a_second_finite_value():
    from study.search.race import rerun_candidates

    assert rerun_candidates({0: 0.9, 1: float("nan")}, 3, "max") == []
    assert rerun_candidates({0: 0.9, 1: 0.8}, 3, "max") == [0, 1]


def test_rerun_candidates_stay_in_the_final_top_whatever_the_unfinished_trials_score():
    """By brute force: for every outcome of 2 unfinished trials, the candidates are in the final top 3."""
    import itertools

    from study.search.race import rerun_candidates

    values = {0: 0.5, 1: 0.7, 2: 0.6, 3: 0.2}
    settled = rerun_candidates(values, 3, "max", unfinished=2)
    for a, b in itertools.product([0.1, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9], repeat=2):
        final = top_complete({**values, 4: a, 5: b}, 3, "max")
        assert set(settled) <= set(final)
    assert settled == [1]


# -- the selection of study.launch, from the Tuner's results with their re-runs ------------------
def test_the_study_replays_the_race_on_the_tuners_results():
    from types import SimpleNamespace

    import optuna

    study = optuna.create_study(direction="maximize")
    for number, value in enumerate([0.90, 0.97, 0.95, 0.96]):
        attrs = {"config": {"lr": 0.001 * (number + 1), "seed": 0}, "epochs_trained": 10}
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, user_attrs=attrs))
    configs = {n: study.trials[n].user_attrs["config"] for n in range(4)}

    def outcome(config, value, error=None):
        return SimpleNamespace(config=config, metrics={"val_recall_at_1": value}, error=error)

    results = [outcome(configs[n], study.trials[n].value) for n in range(4)]  # the search's own trials
    rerun = {1: 0.92, 3: 0.96, 2: 0.945}  # trial 1 (0.97) falls back on fold 1; trial 3 holds
    results += [outcome(race_config(configs[n], 1, n), v) for n, v in rerun.items()]
    results.append(outcome(race_config(configs[0], 1, 0), 0.99))  # trial 0 is not a candidate: not counted
    record = SimpleNamespace(confirm_top=3, mode="max", metric="val_recall_at_1", val_folds=5)
    settings = SimpleNamespace(record=record, confirm_budget=0.25, max_epochs=10)  # 40 epochs searched: 10 for the race
    selection = replay_race(settings, study, results)
    assert study.user_attrs["selection"]["ranking"][0]["trial"] == 3  # kept in the Optuna storage for study.sync
    assert [c.key for c in selection.ranking] == [3, 2, 1]  # means 0.96, 0.9475, 0.945
    assert selection.winner.scores == (0.96, 0.96) and selection.ranking[2].scores == (0.97, 0.92)
    assert selection.stopped == BUDGET  # round 2 would make 6 runs of 10 epochs, over 10
    settings.confirm_budget = 0  # a grid, or --confirm-budget 0
    assert replay_race(settings, study, results) is None


def test_planned_runs_of_a_race_nobody_leaves_by_hand():
    from study.search.race import planned_runs

    # the default study at val_fraction 0.2: about 194 epochs searched, 16-epoch re-runs of 3 candidates over 5 folds
    assert planned_runs(3, 5, 0.5, 194, 16) == 6  # round 2: 6 x 16 = 96 <= 97; round 3: 144 > 97
    assert planned_runs(3, 5, 0.25, 194, 16) == 3  # round 1 only: 96 > 48.5
    assert planned_runs(3, 5, 10, 194, 16) == 12  # every fold: 4 rounds
    assert planned_runs(3, 2, 10, 194, 16) == 3  # one fold to race on
    assert planned_runs(3, 5, 0, 194, 16) == 0 and planned_runs(3, 1, 1, 194, 16) == 0  # no budget, no second fold


def test_the_next_round_starts_early_only_where_no_test_or_budget_can_stop_it():
    from study.search.race import ahead

    first = {1: {0: 0.90, 1: 0.91}, 2: {0: 0.89}, 3: {0: 0.80, 1: 0.81}}  # round 1: 2's re-run still trains
    state = race(first, OPEN)
    assert state.next_fold == 1
    scores = {(1, 1): 0.91, (3, 1): 0.81}
    assert ahead(state, OPEN, scores) == [(1, 2), (3, 2)]  # fold 2 ends below the first test (3 folds): nobody can drop
    # rounds 1 and 2 for 3 candidates are 6 runs of 10 epochs: a budget of 59 stops round 2, so nothing starts early
    assert ahead(state, RaceRules("max", folds=4, budget_epochs=59, epochs_per_run=10), scores) == []
    assert ahead(state, RaceRules("max", folds=2, budget_epochs=math.inf, epochs_per_run=10), scores) == []  # no fold 2
    two = race({k: {**v, 2: 0.5} if k != 2 else {0: 0.89, 1: 0.9} for k, v in first.items()}, OPEN)
    assert two.next_fold == 2 and ahead(two, OPEN, {(1, 2): 0.5}) == []  # round 3 would follow the first test


def test_a_re_run_of_a_race_on_alphabets_holds_out_an_alphabet_fold():
    assert race_config({"seed": 0, "val_split": "classes"}, 3, 4, "alphabets") == {
        "seed": 3, "val_split": "alphabets", FOLD_KEY: 3, CONFIRMS_KEY: 4,
    }  # fmt: skip

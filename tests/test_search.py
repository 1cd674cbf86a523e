"""Fast unit tests of the trial-outcome rule (study/outcome.py) and the Optuna searcher (study/search/searcher.py).

No Ray cluster: the searcher is driven by hand, as Ray Tune drives it (suggest, on_trial_result per
epoch, on_trial_complete with the last result), against an in-memory Optuna storage or a journal file.
"""

from __future__ import annotations

import math
import pickle

import optuna
import pytest
from optuna.trial import TrialState

from study.search.journal import open_storage
from study.search.searcher import OptunaSearcher
from study.search.spaces import parse_space
from study.search.trial import COMPLETE, FAIL, PRUNED, epochs_done, trial_outcome

METRIC, EPOCHS = "val_recall_at_1", 3
SEARCHED = {
    "fixed": {"dataset": "synthetic", "epochs": EPOCHS},
    "params": {"lr": {"type": "float", "low": 0.001, "high": 0.01, "log": True}},
}
GRID = {"fixed": {"dataset": "synthetic", "epochs": EPOCHS}, "grid": {"lr": [0.001, 0.01]}}


# -- the outcome rule ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("last_result", "error", "expected"),
    [
        ({METRIC: 0.5, "training_iteration": 3}, False, COMPLETE),
        ({METRIC: 0.5, "training_iteration": 4}, False, COMPLETE),
        ({METRIC: 0.5, "training_iteration": 2}, False, PRUNED),
        ({METRIC: 0, "training_iteration": 1}, False, PRUNED),
        ({METRIC: 0.5, "training_iteration": 3}, True, FAIL),
        ({METRIC: float("nan"), "training_iteration": 3}, False, FAIL),
        ({METRIC: float("inf"), "training_iteration": 3}, False, FAIL),
        ({METRIC: None, "training_iteration": 3}, False, FAIL),
        ({METRIC: True, "training_iteration": 3}, False, FAIL),
        ({"training_iteration": 3}, False, FAIL),
        ({}, False, FAIL),
        (None, False, FAIL),
        # a budget-aware trainable: completed_budget, not the count of reports, says whether the schedule finished
        ({METRIC: 0.5, "training_iteration": 5, "completed_budget": 1}, False, PRUNED),
        ({METRIC: 0.5, "training_iteration": 6, "completed_budget": 3}, False, COMPLETE),
        ({METRIC: 0.5, "training_iteration": 3, "completed_budget": 0}, False, PRUNED),
    ],
)
def test_trial_outcome(last_result, error, expected):
    assert trial_outcome(last_result, error=error, metric=METRIC, max_epochs=EPOCHS) == expected


def test_epochs_done_prefers_completed_budget():
    assert epochs_done(None) == 0
    assert epochs_done({"training_iteration": 4}) == 4
    assert epochs_done({"training_iteration": 4, "completed_budget": 2}) == 2


# -- the searcher ---------------------------------------------------------------------
def new_searcher(storage, data=SEARCHED, name="s") -> OptunaSearcher:
    space = parse_space(data, "test.yaml")
    if name not in optuna.get_all_study_names(open_storage(storage)):
        optuna.create_study(study_name=name, storage=open_storage(storage), direction="maximize")
    return OptunaSearcher(space, storage, name, metric=METRIC, mode="max", max_epochs=EPOCHS, seed=0)


def result(step: int, value: float | None = None) -> dict:
    return {"training_iteration": step, METRIC: 0.1 * step if value is None else value}


def run_epochs(searcher: OptunaSearcher, trial_id: str, epochs: int) -> None:
    for step in range(1, epochs + 1):
        searcher.on_trial_result(trial_id, result(step))


@pytest.fixture
def searcher() -> OptunaSearcher:
    return new_searcher(optuna.storages.InMemoryStorage())


def stored(searcher: OptunaSearcher) -> dict[str, optuna.trial.FrozenTrial]:
    return {t.user_attrs["tune_trial_id"]: t for t in searcher.study.get_trials()}


def test_suggest_asks_one_trial_per_tune_trial(searcher):
    first, second = searcher.suggest("a"), searcher.suggest("b")
    assert first["dataset"] == "synthetic" and first["epochs"] == EPOCHS and 0.001 <= first["lr"] <= 0.01
    trials = stored(searcher)
    assert set(trials) == {"a", "b"} and searcher.numbers == {"a": trials["a"].number, "b": trials["b"].number}
    assert trials["a"].user_attrs["config"] == first and trials["b"].user_attrs["config"] == second
    assert {t.state for t in trials.values()} == {TrialState.RUNNING}
    assert trials["a"].params == {"lr": first["lr"]}


def test_full_schedule_is_complete_with_every_epoch_as_intermediate_value(searcher):
    searcher.suggest("a")
    run_epochs(searcher, "a", EPOCHS - 1)
    searcher.on_trial_complete("a", result(EPOCHS))  # Tune hands the last result only to on_trial_complete
    trial = stored(searcher)["a"]
    assert trial.state == TrialState.COMPLETE and trial.value == pytest.approx(0.3)
    assert trial.intermediate_values == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})


def test_early_stop_is_pruned_at_the_last_epoch(searcher):
    searcher.suggest("a")
    run_epochs(searcher, "a", 2)
    searcher.on_trial_complete("a", result(2))
    trial = stored(searcher)["a"]
    assert trial.state == TrialState.PRUNED
    assert trial.intermediate_values == pytest.approx({1: 0.1, 2: 0.2})


@pytest.mark.parametrize(
    ("last", "error", "steps"),
    [
        (result(EPOCHS), True, [1, 2, 3]),  # its last epoch was measured before it raised
        (result(EPOCHS, float("nan")), False, [1, 2]),  # a NaN epoch is not an intermediate value
        ({"training_iteration": EPOCHS}, False, [1, 2]),
        (None, False, [1, 2]),
    ],
)
def test_error_or_non_finite_metric_fails(searcher, last, error, steps):
    searcher.suggest("a")
    run_epochs(searcher, "a", 2)
    searcher.on_trial_complete("a", last, error=error)
    trial = stored(searcher)["a"]
    assert trial.state == TrialState.FAIL and trial.value is None
    assert trial.intermediate_values == pytest.approx({step: 0.1 * step for step in steps})


def test_a_step_is_stored_once_and_a_told_trial_is_left_alone(searcher):
    searcher.suggest("a")
    searcher.on_trial_result("a", result(1, 0.5))
    searcher.on_trial_result("a", result(1, 0.9))  # the same epoch again (a trial retried from its checkpoint)
    searcher.on_trial_complete("a", result(EPOCHS, 0.7))
    searcher.on_trial_result("a", result(EPOCHS + 1, 0.1))
    searcher.on_trial_complete("a", result(1, 0.2), error=True)  # told once: later calls change nothing
    searcher.on_trial_result("unknown", result(1))
    searcher.on_trial_complete("unknown", result(1))
    trial = stored(searcher)["a"]
    assert trial.state == TrialState.COMPLETE and trial.value == pytest.approx(0.7)
    assert trial.intermediate_values == pytest.approx({1: 0.5, 3: 0.7})


def test_grid_space_finishes_after_its_points():
    searcher = new_searcher(optuna.storages.InMemoryStorage(), GRID)
    configs = [searcher.suggest("a"), searcher.suggest("b")]
    assert sorted(c["lr"] for c in configs) == [0.001, 0.01]
    assert searcher.suggest("c") == searcher.FINISHED
    searcher.on_trial_complete("a", result(EPOCHS))
    searcher.on_trial_complete("b", result(EPOCHS))  # the last grid point: GridSampler asks the study to stop
    assert [t.state for t in searcher.study.get_trials()] == [TrialState.COMPLETE, TrialState.COMPLETE]


def test_save_and_restore_continue_the_same_optuna_trials(tmp_path):
    """A driver restart: Ray unpickles the searcher (without its study) and restores its saved state."""
    url = f"journal:{tmp_path / 'journal.log'}"
    before = new_searcher(url)
    for trial_id in ("running", "done", "doomed"):
        before.suggest(trial_id)
    before.on_trial_result("running", result(1))
    run_epochs(before, "done", 2)
    before.on_trial_complete("done", result(2))
    state = tmp_path / "searcher-state.pkl"
    before.save(str(state))
    before.on_trial_result("running", result(2, 0.25))  # reported after the last save, before the driver died

    after = pickle.loads(pickle.dumps(before))  # what Tune keeps of the searcher object itself
    assert after._study is None
    after = new_searcher(url)
    after.restore(str(state))
    assert after.numbers == before.numbers
    after.on_trial_result("running", result(2, 0.9))  # recomputed from the checkpoint: the stored value stays
    after.on_trial_complete("running", result(EPOCHS))
    after.on_trial_result("done", result(3))  # told before the restart: left alone
    after.on_trial_complete("doomed", None, error=True)

    trials = {t.user_attrs["tune_trial_id"]: t for t in optuna.load_study(study_name="s", storage=open_storage(url)).trials}
    assert len(trials) == 3
    assert trials["running"].state == TrialState.COMPLETE and trials["running"].value == pytest.approx(0.3)
    assert trials["running"].intermediate_values == pytest.approx({1: 0.1, 2: 0.25, 3: 0.3})
    assert trials["done"].state == TrialState.PRUNED and trials["done"].intermediate_values == pytest.approx({1: 0.1, 2: 0.2})
    assert trials["doomed"].state == TrialState.FAIL and not trials["doomed"].intermediate_values
    assert all(not math.isnan(v) for t in trials.values() for v in t.intermediate_values.values())


def test_a_restored_searcher_fails_the_optuna_trials_asked_for_after_its_last_save(tmp_path):
    """The resume's reconciliation, from the searcher's own state (saved with each of Tune's snapshots): an Optuna trial
    still RUNNING that the searcher asked for after its last save was never in Tune's snapshot either, so no restored
    trial continues it: the restore tells it FAIL. The trials it saved as live stay RUNNING and continue; those told
    before the kill stay as told."""
    url = f"journal:{tmp_path / 'journal.log'}"
    before = new_searcher(url)
    for trial_id in ("running", "done"):
        before.suggest(trial_id)
    run_epochs(before, "done", 2)
    before.on_trial_complete("done", result(2))
    state = tmp_path / "searcher-state.pkl"
    before.save(str(state))
    before.suggest("late")  # asked after the last save, then the driver was killed
    after = new_searcher(url)
    after.restore(str(state))
    trials = {t.user_attrs["tune_trial_id"]: t for t in optuna.load_study(study_name="s", storage=open_storage(url)).trials}
    assert {k: t.state for k, t in trials.items()} == {"running": TrialState.RUNNING, "done": TrialState.PRUNED, "late": TrialState.FAIL}
    assert list(after._live) == ["running"]


def test_a_restored_searcher_counts_the_trials_that_ended_after_its_last_save(tmp_path):
    """Tune's snapshot (and the searcher's state saved with it) can be older than the Optuna journal: a trial asked
    for and ended after it is told in the journal, recorded, and in no restored Tune trial. The restored searcher
    counts it among the study's trials, so a study of 3 trials asks for 3 in all, not a 4th in its place (a full
    disk's torn state, resumed from its last good copy, once ended with 7 trials of 6)."""
    from ray.tune.search import Searcher

    storage = f"journal:{tmp_path / 'journal.log'}"
    before = racing(storage, trials=3, budget=0.0)
    before.suggest("a")
    before.suggest("b")
    before.save(str(tmp_path / "state.pkl"))
    before.suggest("late")  # asked for after the last save, and ended before the driver was killed
    finish(before, "late", 0.5)
    after = pickle.loads(pickle.dumps(before))
    after.restore(str(tmp_path / "state.pkl"))
    assert set(after.numbers) == {"a", "b", "late"} and set(after._live) == {"a", "b"}
    assert after.suggest("c") == Searcher.FINISHED
    assert [t.state for t in after.study.get_trials()] == [TrialState.RUNNING, TrialState.RUNNING, TrialState.COMPLETE]


def test_a_restored_searcher_does_not_suggest_again_the_configs_its_seed_gave_before(tmp_path):
    """A resumed study opens its sampler anew with the study's seed. Seeded as the first run was, its random start
    would draw the first run's configs again (a resumed study once re-ran trials 0-2's configs as trials 6-8); it is
    seeded by the seed and the trials already stored instead. A fresh study keeps the seed as given."""
    url = f"journal:{tmp_path / 'journal.log'}"
    before = new_searcher(url)
    first = [before.suggest(tid)["lr"] for tid in ("a", "b")]
    assert new_searcher(f"journal:{tmp_path / 'other.log'}").suggest("x")["lr"] == first[0]  # the seed, as given
    before.save(str(tmp_path / "state.pkl"))
    after = new_searcher(url)
    after.restore(str(tmp_path / "state.pkl"))
    later = [after.suggest(tid)["lr"] for tid in ("c", "d")]
    assert not set(later) & set(first), (first, later)


def test_a_restored_grid_searcher_asks_for_each_point_once(tmp_path):
    """GridSampler shuffles its points by its seed and gives trial k the k-th: a resumed grid keeps the study's seed
    (a seed moved by the trials stored, as TPE's is, would shuffle anew and repeat points the first run had)."""
    grid = {"fixed": {"dataset": "synthetic", "epochs": EPOCHS}, "grid": {"lr": [0.001, 0.002, 0.003, 0.005, 0.007, 0.01]}}
    url = f"journal:{tmp_path / 'journal.log'}"
    before = new_searcher(url, grid)
    first = [before.suggest(tid)["lr"] for tid in "abc"]
    before.save(str(tmp_path / "state.pkl"))
    after = new_searcher(url, grid)
    after.restore(str(tmp_path / "state.pkl"))
    later = [after.suggest(tid)["lr"] for tid in "def"]
    assert sorted(first + later) == grid["grid"]["lr"], (first, later)
    assert after.suggest("g") == after.FINISHED


def test_restored_grid_searcher_still_knows_how_many_points_it_asked_for(tmp_path):
    url = f"journal:{tmp_path / 'journal.log'}"
    before = new_searcher(url, GRID)
    before.suggest("a")
    before.suggest("b")
    before.save(str(tmp_path / "state.pkl"))
    after = new_searcher(url, GRID)
    after.restore(str(tmp_path / "state.pkl"))
    assert after.suggest("c") == after.FINISHED


# -- a ladder of budgets (trainables.core.budgets): intermediate values at the budgets only ------
def ladder_results(budgets: list[int], values: dict[int, float]) -> list[dict]:
    """What the ladder trainable reports with budgets [1, 3]: epochs 1 | (prefix 0) 1, 2, 3 of budget 3."""
    out, trained, completed = [], 0, 0
    for budget in budgets:
        for epoch in range(1, budget + 1):
            trained += 1
            completed = budget if epoch == budget else completed
            r = {"training_iteration": trained, "budget": budget, "epoch": epoch, "completed_budget": completed, "epochs_trained": trained}
            r[METRIC] = values[budget] if epoch == budget else 0.01 * epoch  # mid-schedule values must not reach Optuna
            if epoch == budget:
                r["objective_step"] = budget
            out.append(r)
    return out


def test_a_pruned_ladder_trial_has_intermediate_values_at_the_budgets_it_finished(searcher):
    searcher.suggest("a")
    reports = ladder_results([1, 3], {1: 0.4, 3: 0.7})[:2]  # stopped by the scheduler after budget 1 and one more epoch
    for r in reports:
        searcher.on_trial_result("a", r)
    searcher.on_trial_complete("a", reports[-1])
    (trial,) = searcher.study.get_trials()
    assert trial.state == TrialState.PRUNED
    assert trial.intermediate_values == {1: 0.4}
    assert trial.user_attrs["epochs"] == 1 and trial.user_attrs["epochs_trained"] == 2  # epoch 1 of budget 3 at the end


def test_a_complete_ladder_trial_has_each_budgets_value(searcher):
    searcher.suggest("a")
    reports = ladder_results([1, 3], {1: 0.4, 3: 0.7})
    for r in reports[:-1]:
        searcher.on_trial_result("a", r)
    searcher.on_trial_complete("a", reports[-1])
    (trial,) = searcher.study.get_trials()
    assert trial.state == TrialState.COMPLETE and trial.value == pytest.approx(0.7)
    assert trial.intermediate_values == {1: 0.4, 3: 0.7}
    assert trial.user_attrs["epochs"] == 3 and trial.user_attrs["epochs_trained"] == 4


# -- the race's re-runs, in the search's own Tuner ---------------------------------------------
def racing(storage, trials: int, top: int = 3, budget: float = 0.25, folds: int = 5):
    from study.search.searcher import RacingSearcher

    space = parse_space(SEARCHED, "test.yaml")
    optuna.create_study(study_name="c", storage=open_storage(storage), direction="maximize")
    kwargs = {"metric": METRIC, "mode": "max", "max_epochs": EPOCHS, "seed": 0}
    return RacingSearcher(space, storage, "c", trials=trials, top=top, budget=budget, folds=folds, **kwargs)


def finish(searcher, trial_id: str, value: float) -> None:
    searcher.on_trial_complete(trial_id, result(EPOCHS, value))


def test_a_top_trial_races_once_no_running_trial_can_push_it_out_of_the_top():
    """5 trials, top 3. Trials a-c end with 0.5, 0.9, 0.7 while d and e run: d and e can push each trial down two
    places, so only the best (b) is sure to stay in the top 3 -> b re-runs on fold 1 first; c waits for d."""
    from ray.tune.search import Searcher

    from study.search.trial import CONFIRMS_KEY, FOLD_KEY

    searcher = racing(optuna.storages.InMemoryStorage(), trials=5, folds=2)  # one fold to race on: one round
    configs = {tid: searcher.suggest(tid) for tid in "abcde"}
    numbers = searcher.numbers
    for tid, value in zip("abc", (0.5, 0.9, 0.7), strict=True):
        finish(searcher, tid, value)
    first = searcher.suggest("r1")
    assert first == {**configs["b"], "seed": 1, FOLD_KEY: 1, CONFIRMS_KEY: numbers["b"]}
    assert searcher.suggest("r2") is None  # nothing else is settled while d and e run: wait
    finish(searcher, "d", 0.8)  # top 3 now b, d, c; e may still push c out
    assert searcher.suggest("r2") == {**configs["d"], "seed": 1, FOLD_KEY: 1, CONFIRMS_KEY: numbers["d"]}
    assert searcher.suggest("r3") is None
    finish(searcher, "e", 0.95)  # e enters first: the top 3 is e, b, d; c never re-runs
    assert searcher.suggest("r3") == {**configs["e"], "seed": 1, FOLD_KEY: 1, CONFIRMS_KEY: numbers["e"]}
    assert searcher.suggest("r4") is None  # the race's round 1 still runs
    for tid, value in zip(("r1", "r2", "r3"), (0.9, 0.8, 0.95), strict=True):
        finish(searcher, tid, value)
    assert searcher.suggest("r4") == Searcher.FINISHED  # no fold left to race on
    assert all(t.state.is_finished() for t in searcher.study.get_trials())  # re-runs are not Optuna trials
    assert len(searcher.study.get_trials()) == 5


def test_the_race_runs_round_after_round_drops_the_beaten_and_survives_a_restore(tmp_path):
    """3 trials, all candidates, 4 folds, no budget limit (by hand as tests/test_selection.py's TABLE: the first test,
    at 3 folds, drops B and C). The searcher is saved and restored mid-race, as Ray keeps it with the experiment."""
    from ray.tune.search import Searcher

    from study.search.searcher import RacingSearcher
    from study.search.trial import FOLD_KEY, confirmed_trial

    storage = f"journal:{tmp_path / 'journal.log'}"
    searcher = racing(storage, trials=3, top=3, budget=100.0, folds=4)
    for tid in "abc":
        searcher.suggest(tid)
    scores = {"a": [0.90, 0.91, 0.92], "b": [0.89, 0.905, 0.915], "c": [0.80, 0.81, 0.82]}  # by fold
    for tid in "abc":
        finish(searcher, tid, scores[tid][0])
    trial_of = {searcher.numbers[t]: t for t in "abc"}

    def round_of(s, ids):
        given = [s.suggest(i) for i in ids]
        return {(trial_of[confirmed_trial(c)], c[FOLD_KEY]): i for c, i in zip(given, ids, strict=True)}

    first = round_of(searcher, ["r1", "r2", "r3"])
    assert set(first) == {("a", 1), ("b", 1), ("c", 1)} and searcher.suggest("r4") is None  # nothing has a fold-1 score
    searcher.save(str(tmp_path / "state.pkl"))
    restored = pickle.loads(pickle.dumps(searcher))
    restored.restore(str(tmp_path / "state.pkl"))
    assert isinstance(restored, RacingSearcher) and set(restored.reruns) == {"r1", "r2", "r3"}
    by_trial = {tid: rid for (tid, _), rid in first.items()}
    finish(restored, by_trial["a"], scores["a"][1])
    early = round_of(restored, ["r4"])  # no test before 3 folds: a starts round 2 while b and c train round 1
    assert set(early) == {("a", 2)} and restored.suggest("r5") is None
    for tid in "bc":
        finish(restored, by_trial[tid], scores[tid][1])
    second = {**early, **round_of(restored, ["r5", "r6"])}
    assert set(second) == {("a", 2), ("b", 2), ("c", 2)}
    assert restored.suggest("r7") is None
    for (tid, fold), rid in second.items():
        finish(restored, rid, scores[tid][fold])
    assert restored.suggest("r7") == Searcher.FINISHED  # the test at 3 folds drops c (p 0) and b (p 0.029): a is clear


def test_the_budget_stops_the_race_after_round_1():
    """3 trials of 3 epochs (9 searched), budget 1.0: round 1 (3 runs, 9 epochs) runs whatever the budget; round 2
    would spend 3 x 3 more (18 > 9) -> no second round."""
    from ray.tune.search import Searcher

    searcher = racing(optuna.storages.InMemoryStorage(), trials=3, top=3, budget=1.0, folds=5)
    for tid in "abc":
        searcher.suggest(tid)
    for tid, value in zip("abc", (0.5, 0.51, 0.52), strict=True):
        searcher.on_trial_complete(tid, {**result(EPOCHS, value), "epochs_trained": EPOCHS})
    given = [searcher.suggest(r) for r in ("r1", "r2", "r3")]
    assert all(c is not None and c != Searcher.FINISHED for c in given)
    for rid, value in zip(("r1", "r2", "r3"), (0.5, 0.52, 0.51), strict=True):
        finish(searcher, rid, value)
    assert searcher.suggest("r4") == Searcher.FINISHED


@pytest.mark.parametrize(("budget", "values"), [(0, (0.6, 0.4)), (0.25, (0.6, None))])
def test_nothing_races_without_a_budget_or_with_one_complete_trial(budget, values):
    from ray.tune.search import Searcher

    searcher = racing(optuna.storages.InMemoryStorage(), trials=2, budget=budget)
    searcher.suggest("a"), searcher.suggest("b")
    # budget 0: nothing will ever race; else the search's trials still run, and may make a candidate: wait
    assert searcher.suggest("c") == (Searcher.FINISHED if budget == 0 else None)
    finish(searcher, "a", values[0])
    searcher.on_trial_complete("b", result(1, 0.1) if values[1] is None else result(EPOCHS, values[1]))  # pruned, or complete
    assert searcher.suggest("c") == Searcher.FINISHED


@pytest.mark.parametrize(
    ("kind", "epochs", "grace", "phrase"),
    [
        ("budget", 16, 4, "budget-aware successive halving at budgets 4 (each a finished schedule, within each loss)"),
        ("asha", 16, 2, "stock ASHA at epochs 2, 8 of the full schedule"),
        ("budget", 4, 4, "budget-aware successive halving with no rung before the last epoch: every trial trains its full schedule"),
        ("asha", 8, 8, "stock ASHA with no rung before the last epoch: every trial trains its full schedule"),
        ("fifo", 8, 1, "no early stopping"),
    ],
)
def test_the_header_names_the_rungs_or_says_there_are_none(kind, epochs, grace, phrase):
    """Rungs by hand: eta 4 from grace 4 of 16 epochs is 4 (then 16); from grace 2, 2 and 8. A grace period of all
    the epochs leaves no rung: the header once said "at budgets  (each ...)"."""
    from study.search.schedulers import describe, make_early_stopping

    stopping = make_early_stopping(kind, epochs, grace, 4, "loss" if kind == "budget" else None)
    assert describe(stopping) == phrase


@pytest.mark.parametrize("kind", ["budget", "asha"])
def test_the_halving_schedulers_never_judge_a_re_run_nor_rank_others_against_it(kind):
    """Rung 1 of 4 epochs, eta 2: the cutoff is the median of the rung's recorded values. a (0.9) passes first; the
    re-run's 0.99 would lift the cutoff for b (0.93) to 0.945 and stop it; unrecorded, b passes the cutoff 0.9."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from study.search.schedulers import make_early_stopping
    from study.search.trial import CONFIRMS_KEY

    scheduler = make_early_stopping(kind, 4, 1, 2, "loss" if kind == "budget" else None).scheduler
    scheduler.set_search_properties(METRIC, "max")
    trials = {
        "a": SimpleNamespace(trial_id="a", config={"loss": "ice"}),
        "r": SimpleNamespace(trial_id="r", config={"loss": "ice", CONFIRMS_KEY: 0}),
        "b": SimpleNamespace(trial_id="b", config={"loss": "ice"}),
    }
    for trial in trials.values():
        scheduler.on_trial_add(None, trial)

    def report(tid: str, value: float) -> str:
        return scheduler.on_trial_result(None, trials[tid], {"training_iteration": 1, "completed_budget": 1, METRIC: value})

    assert report("a", 0.9) == TrialScheduler.CONTINUE
    assert report("r", 0.99) == TrialScheduler.CONTINUE
    assert report("r", 0.0) == TrialScheduler.CONTINUE  # never stopped, however low
    assert report("b", 0.93) == TrialScheduler.CONTINUE
    scheduler.on_trial_complete(None, trials["r"], {"training_iteration": 4, "completed_budget": 4, METRIC: 0.99})

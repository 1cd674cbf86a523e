"""Fast unit tests of the trial-outcome rule (study/outcome.py) and the Optuna searcher (study/search.py).

No Ray cluster: the searcher is driven by hand, as Ray Tune drives it (suggest, on_trial_result per
epoch, on_trial_complete with the last result), against an in-memory Optuna storage or a journal file.
"""

from __future__ import annotations

import math
import pickle

import optuna
import pytest
from optuna.trial import TrialState

from study.outcome import COMPLETE, FAIL, PRUNED, epochs_done, trial_outcome
from study.search import OptunaSearcher, open_storage
from study.spaces import parse_space

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
    assert trial.user_attrs["epochs_trained"] == 2


def test_a_complete_ladder_trial_has_each_budgets_value(searcher):
    searcher.suggest("a")
    reports = ladder_results([1, 3], {1: 0.4, 3: 0.7})
    for r in reports[:-1]:
        searcher.on_trial_result("a", r)
    searcher.on_trial_complete("a", reports[-1])
    (trial,) = searcher.study.get_trials()
    assert trial.state == TrialState.COMPLETE and trial.value == pytest.approx(0.7)
    assert trial.intermediate_values == {1: 0.4, 3: 0.7}
    assert trial.user_attrs["epochs_trained"] == 4


def test_fixed_configs_hand_out_each_config_once_and_survive_a_restore(tmp_path):
    from ray.tune.search import Searcher

    from study.search import FixedConfigs

    configs = [{"loss": "ice", "ice_scale": 32.0, "seed": 1}, {"loss": "softmax", "alpha": 8.0, "seed": 1}]
    searcher = FixedConfigs(configs)
    assert searcher.suggest("a") == configs[0]
    assert searcher.suggest("a") == configs[0]  # asked again for the same trial: the same config
    searcher.save(str(tmp_path / "state.json"))
    restored = FixedConfigs([])
    restored.restore(str(tmp_path / "state.json"))
    assert restored.suggest("b") == configs[1]
    assert restored.suggest("c") == Searcher.FINISHED

"""Study utilization (study/records/utilization.py) against values computed by hand, and its readers on in-memory records."""

from __future__ import annotations

import datetime
import math
from types import SimpleNamespace

import pytest
from mlflow.store.entities import PagedList

from study.records import utilization as u


def test_both_spellings_of_the_timings_map_to_one_name():
    assert u.epoch_times({"time_epoch_s": 3.0, "time_eval_s": 1.0, "loss": 7.0}) == {"epoch_s": 3.0, "eval_s": 1.0}
    assert u.epoch_times({"time/epoch_s": 3.0, "time/data": 0.5}) == {"epoch_s": 3.0, "data_s": 0.5}
    assert u.epoch_times({"time_epoch_s": float("nan"), "time_train_s": "x"}) == {}


def test_epoch_seconds_falls_back_to_train_plus_eval():
    assert u.epoch_seconds({"time_epoch_s": 10.0, "time_train_s": 8.0, "time_eval_s": 1.5}) == 10.0
    assert u.epoch_seconds({"time/train_s": 8.0, "time/eval_s": 1.5}) == 9.5
    assert u.epoch_seconds({"time_train_s": 8.0}) == 8.0  # an epoch without evaluation
    assert u.epoch_seconds({"val_recall_at_1": 0.9}) == 0.0


def test_utilization_by_hand():
    # two slots, 100 s of wall time: trial a trained 3 epochs of 20 s, trial b 2 epochs of 30 s (one in the new spelling)
    trials = {
        "a": [{"time_epoch_s": 20.0}, {"time_epoch_s": 20.0}, {"time_epoch_s": 20.0}],
        "b": [{"time_epoch_s": 30.0}, {"time/epoch_s": 30.0}],
    }
    result = u.study_utilization(trials, wall_s=100.0, slots=2, startup_s=6.5)
    assert result.in_trial_s == 120.0
    assert result.slot_s == 200.0
    assert result.utilization == pytest.approx(0.6)  # 120 / (100 x 2)
    assert result.overhead_s == 80.0
    assert result.trials == 2
    metrics = result.as_metrics()
    assert metrics["utilization"] == pytest.approx(0.6) and metrics["startup_s"] == 6.5 and metrics["utilization_slots"] == 2.0
    assert "utilization 0.60" in result.describe() and "start-up 6.5 s" in result.describe()


def test_empty_wall_time_gives_nan():
    assert math.isnan(u.study_utilization({}, wall_s=0.0, slots=2).utilization)


@pytest.mark.parametrize(
    ("kwargs", "slots"),
    [
        ({"max_concurrent": 2}, 2),
        ({"max_concurrent": 8, "cpus": 2, "cpus_per_trial": 1}, 2),
        ({"max_concurrent": 8, "cpus": 16, "cpus_per_trial": 3}, 5),
        ({"max_concurrent": 8, "cpus": 16, "cpus_per_trial": 1, "gpus": 1, "gpus_per_trial": 0.25}, 4),
        ({"max_concurrent": 1, "cpus": 16}, 1),
        ({"max_concurrent": 4, "cpus": 0.5, "cpus_per_trial": 1}, 1),  # never fewer than one slot
    ],
)
def test_concurrent_slots(kwargs, slots):
    assert u.concurrent_slots(**kwargs) == slots


class FakeMlflow:
    """search_runs and get_metric_history of MlflowClient, over in-memory runs."""

    def __init__(self, runs: dict[str, tuple[str, dict[str, list[tuple[int, float]]]]]) -> None:
        self.runs = runs  # run id -> (kind, metric key -> [(step, value)])

    def search_runs(self, experiment_ids, filter_string="", max_results=1000, page_token=None):
        assert "tags.mlflow.parentRunId = 'parent'" in filter_string
        runs = [
            SimpleNamespace(
                info=SimpleNamespace(run_id=run_id),
                data=SimpleNamespace(tags={"kind": kind}, metrics={k: points[-1][1] for k, points in history.items()}),
            )
            for run_id, (kind, history) in self.runs.items()
        ]
        return PagedList(runs, None)  # one page: MLflow's reply type, whose token says there is no next page

    def get_metric_history(self, run_id, key):
        # logged at time 1000 s + step (milliseconds in MLflow)
        return [SimpleNamespace(step=step, value=value, timestamp=(1000 + step) * 1000) for step, value in self.runs[run_id][1][key]]


def test_epochs_from_mlflow_sums_each_child_runs_history():
    client = FakeMlflow(
        {
            "r1": ("trial", {"time_epoch_s": [(1, 10.0), (2, 11.0)], "val_recall_at_1": [(1, 0.5), (2, 0.6)]}),
            "r2": ("confirmation", {"time/epoch_s": [(1, 12.0)], "time/eval_s": [(1, 2.0)]}),
            "r3": ("other", {"time_epoch_s": [(1, 99.0)]}),
        }
    )
    epochs = u.epochs_from_mlflow(client, "0", "parent")
    assert sorted(epochs) == ["r1", "r2"]
    assert epochs["r2"] == [{"epoch_s": 12.0, "eval_s": 2.0}]
    result = u.study_utilization(epochs, wall_s=20.0, slots=2)
    assert result.in_trial_s == 33.0 and result.utilization == pytest.approx(33.0 / 40.0)
    assert sorted(u.epochs_from_mlflow(client, "0", "parent", kinds=("trial",))) == ["r1"]
    # a resumed session from t = 1002 s on: only r1's second epoch was trained in it
    assert u.epochs_from_mlflow(client, "0", "parent", since=1002.0) == {"r1": [{"epoch_s": 11.0}]}


def test_epochs_from_mlflow_counts_a_retrained_tail_as_time_in_the_trial():
    """A ladder trial (budgets 2, 4 after 1 epoch of prefix): steps 1-4, and budget 4's epoch 2 under ``retrained/``."""
    history = {"time/epoch_s": [(1, 10.0), (2, 11.0), (3, 13.0), (4, 14.0)], "retrained/time/epoch_s": [(2, 12.0)]}
    epochs = u.epochs_from_mlflow(FakeMlflow({"r1": ("trial", history)}), "0", "parent")
    assert epochs == {"r1": [{"epoch_s": 10.0}, {"epoch_s": 11.0}, {"epoch_s": 12.0}, {"epoch_s": 13.0}, {"epoch_s": 14.0}]}
    assert [m.value for m in u.every_epoch(FakeMlflow({"r1": ("trial", history)}), "r1", "time/epoch_s")] == [10, 11, 12, 13, 14]


def test_spans_from_optuna_by_hand():
    t0 = datetime.datetime(2025, 1, 1, 12, 0, 0)
    trials = [
        SimpleNamespace(number=0, datetime_start=t0, datetime_complete=t0 + datetime.timedelta(seconds=42.5)),
        SimpleNamespace(number=1, datetime_start=t0, datetime_complete=None),  # still running
    ]
    study = SimpleNamespace(get_trials=lambda deepcopy=False: trials)
    assert u.spans_from_optuna(study) == {0: 42.5}


def test_spans_from_a_real_optuna_study():
    import optuna

    study = optuna.create_study()
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    spans = u.spans_from_optuna(study)
    assert sorted(spans) == [0, 1] and all(s >= 0 for s in spans.values())

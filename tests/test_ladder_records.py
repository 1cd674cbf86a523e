"""A trial on a ladder of budgets as MLflow records it: one point per epoch of its schedule, the retrained tail apart.

The results are the ladder's own (``trainables.surrogate.ladder_places`` walks the protocol of
``trainables.core.budgets.fit_budgets``; ``tests/test_surrogate.py`` checks they agree), turned into ops by the study's
MLflow callback and written by the real ``TrialRecorder`` to ``FakeMlflow``. With budgets [8, 12] and the default
schedule (``shared_prefix(8)`` = floor(0.75 x 8) = 6), budget 12 continues after epoch 6: epochs 7 and 8 are trained
twice, 14 epochs in all.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from study.launch.callbacks import MlflowTrials
from study.records.trials import LOST_EPOCHS_TAG
from tests.test_records import FakeMlflow, recorder_for
from trainables.core.config import TrainConfig
from trainables.surrogate import ladder_places, surrogate_metrics

METRIC, BUDGETS, EPOCHS = "val_recall_at_1", [8, 12], 12
CONFIG = TrainConfig.from_dict({"dataset": "synthetic", "epochs": EPOCHS})


def ladder_results() -> list[dict]:
    """The Tune results of a trial trained through BUDGETS: (budget, epoch) (8, 1) ... (8, 8), (12, 7) ... (12, 12)."""
    return [
        {
            **surrogate_metrics(CONFIG, place.budget, place.epoch),
            **place.report_keys(single_budget=False),
            "time/epoch_s": 1.0,
            "training_iteration": place.epochs_trained,
            "node": "n1",
        }
        for place in ladder_places(CONFIG, BUDGETS)
    ]


def trial_ops(results: list[dict], trial_id: str = "a", end: str = "complete") -> list[dict]:
    """The ops the study's MLflow callback submits for a trial that reports ``results`` and then ends."""
    ops: list[dict] = []
    callback = MlflowTrials(SimpleNamespace(submit=ops.append), METRIC, EPOCHS)
    trial = SimpleNamespace(trial_id=trial_id, config=CONFIG.to_dict(), last_result=None)
    callback.on_trial_start(0, [], trial)
    for result in results:
        callback.on_trial_result(0, [], trial, result)
        trial.last_result = result
    if end == "complete":
        callback.on_trial_complete(0, [], trial)
    else:
        callback.on_trial_error(0, [], trial)
    return ops


def history(fake: FakeMlflow, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in fake.history.get((run.info.run_id, key), [])]


def logged(fake: FakeMlflow) -> dict[str, list[tuple[int, float]]]:
    """Every metric the trial's run holds: {name: [(step, value), ...]}, in the order logged."""
    (run,) = fake.trials().values()
    return {key: history(fake, run, key) for run_id, key in fake.history if run_id == run.info.run_id}


def test_a_promoted_trial_logs_each_epoch_of_its_schedule_once_and_its_retrained_tail_apart(tmp_path):
    fake = FakeMlflow()
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})
    results = ladder_results()
    recorder = recorder_for(fake, tmp_path / "spool.jsonl")
    for op in trial_ops(results):
        recorder.submit(op)
    (run,) = fake.trials().values()
    by_place = {(r["budget"], r["epoch"]): r for r in results}

    # the main curves: steps 1 to 12 once each, budget 8's epochs 1-8, then budget 12's 9-12
    main = [by_place[8, e] for e in range(1, 9)] + [by_place[12, e] for e in range(9, 13)]
    for key in (METRIC, "train_loss", "lr_now", "time/epoch_s"):
        assert history(fake, run, key) == [(r["epoch"], r[key]) for r in main], key  # was steps 1 to 14
    assert run.data.metrics[METRIC] == by_place[12, 12][METRIC]  # its latest value is the final budget's
    assert history(fake, run, "budget") == [(e, 8.0) for e in range(1, 9)] + [(e, 12.0) for e in range(9, 13)]
    assert "epoch" not in run.data.metrics and "objective_step" not in run.data.metrics  # the step says the epoch

    # budget 12's epochs 7 and 8, trained again after budget 8's prefix: their own names, the run's tag
    for key in (METRIC, "train_loss", "lr_now", "budget", "completed_budget"):
        assert history(fake, run, f"retrained/{key}") == [(e, by_place[12, e][key]) for e in (7, 8)], key
    assert run.data.tags["retrained_epochs"] == "7-8"
    # every epoch trained, the retrained ones too: the key the recorder tells what it has logged by
    assert history(fake, run, "epochs_trained") == [(r["epoch"], float(r["epochs_trained"])) for r in results]
    assert [v for _, v in history(fake, run, "epochs_trained")] == list(map(float, range(1, 15)))
    assert LOST_EPOCHS_TAG not in run.data.tags and run.info.status == "FINISHED"


def test_a_replayed_or_resumed_ladder_writes_no_epoch_twice_and_loses_none(tmp_path):
    """The spool replayed after a kill (a fresh recorder, nothing in memory), and a trial resumed from its checkpoint
    in the retrained tail (its epochs from there reported again): MLflow holds what one clean pass wrote."""
    results, spool = ladder_results(), tmp_path / "spool.jsonl"
    clean = FakeMlflow()
    clean.create_run("0", tags={"kind": "study", "study_name": "s"})
    for op in trial_ops(results):
        recorder_for(clean, spool).submit(op)
    expected = logged(clean)

    fake = FakeMlflow()
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})
    ops = trial_ops(results)
    first = recorder_for(fake, spool)
    for op in ops[: 1 + 9]:  # the start and 9 epochs trained: budget 12's epoch 7, retrained
        first.submit(op)
    killed = logged(fake)
    assert killed["retrained/train_loss"] == [(7, results[8]["train_loss"])]
    assert fake.trials()["a"].data.tags["retrained_epochs"] == "7"
    second = recorder_for(fake, spool)  # the resumed driver: its trial goes on from its checkpoint at epoch 8 of budget 8
    for op in ops[:1] + ops[1 + 8 :]:
        second.submit(op)
    third = recorder_for(fake, spool)  # and the whole spool applied once more
    for op in ops:
        third.submit(op)
    got = logged(fake)
    assert got == expected  # was: epochs 7 and 8 of budget 12 logged at steps 9 and 10, then replays skipped
    assert all(len(points) == len({s for s, _ in points}) for key, points in got.items() if key != "epochs_trained")
    assert Counter(s for s, _ in got["epochs_trained"]) == Counter({7: 2, 8: 2} | {s: 1 for s in (1, 2, 3, 4, 5, 6, 9, 10, 11, 12)})
    (run,) = fake.trials().values()
    assert run.data.tags["retrained_epochs"] == "7-8" and LOST_EPOCHS_TAG not in run.data.tags


def test_epochs_of_a_lost_attempt_are_counted_in_epochs_trained(tmp_path):
    """A driver killed after 10 epochs trained (budget 12's epoch 8, retrained); the resumed trial goes on from its
    checkpoint after budget 8 and fails after one epoch: the run keeps the 10th epoch once and tags it lost."""
    results, spool = ladder_results(), tmp_path / "spool.jsonl"
    fake = FakeMlflow()
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})
    first = recorder_for(fake, spool)
    for op in trial_ops(results[:10])[:-1]:  # no end: the driver was killed
        first.submit(op)
    resumed = recorder_for(fake, spool)
    for op in trial_ops(results[8:9], end="error"):  # budget 12's epoch 7 again, 9 epochs trained, then the failure
        resumed.submit(op)
    (run,) = fake.trials().values()
    assert run.data.tags[LOST_EPOCHS_TAG] == "10-10" and run.info.status == "FAILED"
    assert [s for s, _ in history(fake, run, "train_loss")] == list(range(1, 9))
    assert [s for s, _ in history(fake, run, "retrained/train_loss")] == [7, 8]

"""Fast unit tests of what a study records (study/records/ending.py): the trial recorder with its spool, and the end of a study.

MLflow is replaced by ``FakeMlflow``, an in-memory client with the calls the recorder makes, which can
be switched off to act as an unreachable tracking server.
"""

from __future__ import annotations

import copy as copy_module
import csv
import json
import pickle
import re
import select
import signal
import subprocess
import sys
import threading
from collections import Counter
from types import SimpleNamespace

import optuna
import pytest
from mlflow.store.entities import PagedList
from optuna.trial import TrialState

from study.interrupts import StudyInterrupted
from study.launch.callbacks import MlflowTrials
from study.records import ending as records
from study.records import parent
from study.records.trials import TrialRecorder
from tests.conftest import ROOT
from trainables.core.config import TrainConfig


class FakeMlflow:
    """The MlflowClient calls of study.records.ending, kept in memory; ``down = True`` makes every call raise."""

    def __init__(self) -> None:
        self.runs: dict[str, SimpleNamespace] = {}
        self.history: dict[tuple[str, str], list[SimpleNamespace]] = {}
        self.down = False
        self.calls: Counter[str] = Counter()

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if self.down:
            raise ConnectionError("Connection refused")

    def create_run(self, experiment_id, tags=None, run_name=None):
        self._call("create_run")
        run_id = f"run{len(self.runs)}"
        info = SimpleNamespace(run_id=run_id, status="RUNNING", experiment_id=experiment_id)
        self.runs[run_id] = SimpleNamespace(info=info, data=SimpleNamespace(tags=dict(tags or {}), params={}, metrics={}))
        return self.runs[run_id]

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._call("log_batch")
        data = self.runs[run_id].data
        data.params.update({p.key: p.value for p in params})
        data.tags.update({t.key: t.value for t in tags})
        for m in metrics:
            data.metrics[m.key] = m.value
            self.history.setdefault((run_id, m.key), []).append(SimpleNamespace(step=m.step, value=m.value))

    def set_tag(self, run_id, key, value):
        self._call("set_tag")
        self.runs[run_id].data.tags[key] = value

    def set_terminated(self, run_id, status="FINISHED"):
        self._call("set_terminated")
        self.runs[run_id].info.status = status

    def get_run(self, run_id):
        self._call("get_run")
        return self.runs[run_id]

    def search_runs(self, experiment_ids, filter_string="", max_results=1000, page_token=None):
        self._call("search_runs")
        wanted = dict(re.findall(r"tags\.([\w.]+) = '([^']*)'", filter_string))
        return PagedList([r for r in self.runs.values() if all(r.data.tags.get(k) == v for k, v in wanted.items())], None)

    def get_metric_history(self, run_id, key):
        self._call("get_metric_history")
        return list(self.history.get((run_id, key), []))

    # for a test's eyes only
    def trials(self) -> dict[str, SimpleNamespace]:
        return {r.data.tags["trial_id"]: r for r in self.runs.values() if r.data.tags.get("kind") == "trial"}

    def steps(self, run, key: str = "train_loss") -> list[int]:
        return [m.step for m in self.history.get((run.info.run_id, key), [])]


@pytest.fixture
def mlflow_fake() -> FakeMlflow:
    fake = FakeMlflow()
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})  # the parent run, run0
    return fake


def recorder_for(fake: FakeMlflow, spool) -> TrialRecorder:
    return TrialRecorder("http://mlflow.test", "0", "run0", "s", str(spool), connect=lambda uri: fake)


def start(trial_id: str) -> dict:
    return {"op": "start", "trial_id": trial_id, "config": {"lr": 0.01, "dataset": "synthetic"}}


def epoch(trial_id: str, step: int) -> dict:
    return {
        "op": "result",
        "trial_id": trial_id,
        "step": step,
        "metrics": {"train_loss": 1.0 / step, "val_recall_at_1": 0.1 * step},
        "tags": {"device": "cpu"},
        "time_ms": 1000 * step,
        "config": {"lr": 0.01, "dataset": "synthetic"},
    }


def complete(trial_id: str, state: str = "COMPLETE") -> dict:
    return {"op": "complete", "trial_id": trial_id, "tags": {"trial_state": state}, "config": {}}


def test_one_run_per_trial_with_its_params_and_epochs(tmp_path, mlflow_fake):
    recorder = recorder_for(mlflow_fake, tmp_path / "spool.jsonl")
    for op in (start("a"), epoch("a", 1), start("b"), epoch("a", 2), epoch("b", 1), complete("a")):
        recorder.submit(op)
    trials = mlflow_fake.trials()
    assert set(trials) == {"a", "b"} and mlflow_fake.calls["create_run"] == 3  # the parent and one run per trial
    a, b = trials["a"], trials["b"]
    assert a.data.tags["mlflow.parentRunId"] == "run0" and a.data.tags["study_name"] == "s"
    resolved = TrainConfig.from_dict({"lr": 0.01, "dataset": "synthetic"}).to_dict()  # defaults filled in
    # heated-up softmax with Adam and an fc embedding: ICE's scale, SGD's momentum and the dropout did not apply
    assert a.data.params == {k: str(v) for k, v in resolved.items() if k not in ("ice_scale", "momentum", "dropout")}
    assert a.data.tags["inactive_params"] == "ice_scale,dropout,momentum"
    assert a.data.tags["mlflow.runName"] == "trial-a"  # no Optuna storage on this parent: no number to name it by
    assert mlflow_fake.steps(a) == [1, 2] and mlflow_fake.steps(a, "val_recall_at_1") == [1, 2]
    assert a.data.tags["device"] == "cpu" and a.data.tags["trial_state"] == "COMPLETE"
    assert (a.info.status, b.info.status) == ("FINISHED", "RUNNING")
    assert not (tmp_path / "spool.jsonl").exists()


def test_error_op_fails_the_run(tmp_path, mlflow_fake):
    recorder = recorder_for(mlflow_fake, tmp_path / "spool.jsonl")
    recorder.submit(start("a"))
    recorder.submit({"op": "error", "trial_id": "a", "tags": {"failure_reason": "boom", "trial_state": "FAIL"}, "config": {}})
    run = mlflow_fake.trials()["a"]
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == "boom"


def test_a_restarted_driver_finds_the_run_and_never_logs_a_step_twice(tmp_path, mlflow_fake):
    first = recorder_for(mlflow_fake, tmp_path / "spool.jsonl")
    for op in (start("a"), epoch("a", 1), epoch("a", 2)):
        first.submit(op)
    second = recorder_for(mlflow_fake, tmp_path / "spool.jsonl")  # a resumed study: nothing in memory
    for op in (start("a"), epoch("a", 2), epoch("a", 3), epoch("a", 3)):  # the trial continues from its epoch-1 checkpoint
        second.submit(op)
    trials = mlflow_fake.trials()
    assert list(trials) == ["a"] and mlflow_fake.calls["create_run"] == 2
    assert mlflow_fake.steps(trials["a"]) == [1, 2, 3]


def test_records_wait_in_the_spool_while_mlflow_is_down(tmp_path, mlflow_fake, caplog):
    spool = tmp_path / "spool" / "s.jsonl"
    recorder = recorder_for(mlflow_fake, spool)
    recorder.submit(start("a"))
    mlflow_fake.down = True
    for op in (epoch("a", 1), epoch("a", 2), complete("a")):
        recorder.submit(op)
    kept = [json.loads(line) for line in spool.read_text().splitlines()]
    assert [op["op"] for op in kept] == ["result", "result", "complete"] and [op.get("step") for op in kept[:2]] == [1, 2]
    assert [e["event"] for e in recorder.events()] == ["unreachable"]
    assert "unreachable" in caplog.text  # a warning of study.records.trials's logger
    assert mlflow_fake.steps(mlflow_fake.trials()["a"]) == []

    calls = sum(mlflow_fake.calls.values())
    assert recorder.flush() is False  # within retry_every_s of the last try: MLflow is not asked again
    assert sum(mlflow_fake.calls.values()) == calls

    mlflow_fake.down = False
    assert recorder.flush(force=True) is True
    run = mlflow_fake.trials()["a"]
    assert mlflow_fake.steps(run) == [1, 2] and run.info.status == "FINISHED"
    assert not spool.exists()
    assert [e["event"] for e in recorder.events()] == ["unreachable", "reachable again"]


def test_a_new_recorder_writes_what_an_earlier_one_kept(tmp_path, mlflow_fake):
    """What `python -m study.sync` and a resumed study do with the spool of a driver that ended during an outage."""
    spool = tmp_path / "s.jsonl"
    mlflow_fake.down = True
    gone = recorder_for(mlflow_fake, spool)
    for op in (start("a"), epoch("a", 1), complete("a", "PRUNED")):
        gone.submit(op)
    assert len(spool.read_text().splitlines()) == 3 and mlflow_fake.trials() == {}
    mlflow_fake.down = False
    later = recorder_for(mlflow_fake, spool)
    assert later.flush(force=True) is True
    run = mlflow_fake.trials()["a"]
    assert mlflow_fake.steps(run) == [1] and run.data.tags["trial_state"] == "PRUNED" and run.info.status == "FINISHED"
    assert later.flush(force=True) is True and mlflow_fake.calls["create_run"] == 2  # applying again writes nothing twice


def test_recorder_pickles_without_its_client_and_queue(tmp_path, mlflow_fake):
    recorder = TrialRecorder("http://mlflow.test", "0", "run0", "s", str(tmp_path / "s.jsonl"))
    recorder._client, recorder.run_ids = mlflow_fake, {"a": "run1"}
    state = recorder.__getstate__()
    assert "_client" not in state and "run_ids" not in state and "_writer" not in state
    assert pickle.loads(pickle.dumps(recorder)).run_ids == {}


# -- the background writer (what the study's Tune callback uses) ---------------------------
class GatedMlflow(FakeMlflow):
    """A FakeMlflow whose ``log_batch`` waits for ``gate`` (at most ``limit_s``): an MLflow write that takes long."""

    def __init__(self, limit_s: float = 60.0) -> None:
        super().__init__()
        self.gate, self.entered, self.limit_s = threading.Event(), threading.Event(), limit_s
        self.inside = 0  # log_batch calls under way

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.inside += 1
        self.entered.set()
        self.gate.wait(self.limit_s)
        try:
            return super().log_batch(run_id, metrics, params, tags)
        finally:
            self.inside -= 1


def spooled(spool) -> list[tuple]:
    return [(op["op"], op.get("step")) for op in map(json.loads, spool.read_text().splitlines())]


def one_trial() -> list[dict]:
    """Trial a's start, two epochs and its end: the records of one short trial."""
    return [start("a"), epoch("a", 1), epoch("a", 2), complete("a")]


ALL_OPS = [("start", None), ("result", 1), ("result", 2), ("complete", None)]  # one_trial() as spooled() reads it


def test_with_the_writer_submit_returns_while_mlflow_writes_and_the_spool_holds_every_op(tmp_path):
    fake, spool = GatedMlflow(), tmp_path / "spool" / "s.jsonl"
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})
    recorder = recorder_for(fake, spool)
    recorder.start_writer()
    try:
        for op in one_trial():
            recorder.submit(op)
        assert fake.entered.wait(60)  # the writer is in its first write (the start's params) ...
        assert fake.inside == 1 and fake.runs["run1"].data.params == {}  # ... not done with it: submit did not wait
        assert spooled(spool) == ALL_OPS  # every op is on disk, in order, before it is applied
    finally:
        fake.gate.set()
        recorder.close_writer()
    assert recorder.flush(force=True) is True
    run = fake.trials()["a"]
    assert fake.steps(run) == [1, 2] and run.info.status == "FINISHED" and run.data.params["lr"] == "0.01"
    assert not spool.exists()
    recorder.submit(epoch("a", 3))  # closed: written before submit returns again
    assert fake.steps(run) == [1, 2, 3] and not spool.exists()


KILLED_DRIVER = """
import sys, threading
from tests.test_records import GatedMlflow, one_trial, recorder_for
fake = GatedMlflow(limit_s=600)
fake.create_run("0", tags={"kind": "study", "study_name": "s"})
recorder = recorder_for(fake, sys.argv[1])
recorder.start_writer()
for op in one_trial():
    recorder.submit(op)
fake.entered.wait(600)
print("submitted", flush=True)
threading.Event().wait()
"""


@pytest.mark.faults
def test_a_driver_killed_while_its_writer_waits_on_mlflow_leaves_every_record_in_the_spool(tmp_path, mlflow_fake):
    spool = tmp_path / "s.jsonl"
    driver = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, str(spool)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:  # a driver whose submit waited for MLflow would never say so
        assert select.select([driver.stdout], [], [], 120)[0], "the driver did not return from submit within 120 s"
        assert driver.stdout.readline().strip() == "submitted"
    finally:
        driver.kill()
        driver.wait(60)
    assert spooled(spool) == ALL_OPS
    later = recorder_for(mlflow_fake, spool)  # a resumed study or `python -m study.sync`
    assert later.flush(force=True) is True
    run = mlflow_fake.trials()["a"]
    assert mlflow_fake.steps(run) == [1, 2] and run.info.status == "FINISHED" and not spool.exists()


class WatchedMlflow(FakeMlflow):
    """A FakeMlflow that says when a call failed (``failed``) and when a run ended (``finished``)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed, self.finished = threading.Event(), threading.Event()

    def _call(self, name: str) -> None:
        if self.down:
            self.failed.set()
        super()._call(name)

    def set_terminated(self, run_id, status="FINISHED"):
        super().set_terminated(run_id, status)
        self.finished.set()


def test_with_the_writer_an_outage_keeps_records_and_the_writer_writes_them_when_mlflow_returns(tmp_path):
    fake, spool = WatchedMlflow(), tmp_path / "s.jsonl"
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})
    recorder = recorder_for(fake, spool)
    recorder.retry_every_s = 0.05
    fake.down = True
    recorder.start_writer()
    for op in one_trial():
        recorder.submit(op)  # never raises: MLflow's errors are the writer's
    assert fake.failed.wait(60)  # the writer tried while MLflow was down
    assert spooled(spool) == ALL_OPS and fake.trials() == {}
    fake.down = False
    assert fake.finished.wait(60)  # it tried again by itself and wrote all of it
    recorder.close_writer()
    assert fake.steps(fake.trials()["a"]) == [1, 2] and not spool.exists()
    assert [e["event"] for e in recorder.events()] == ["unreachable", "reachable again"]


def test_a_recorder_with_a_writer_pickles_and_copies_without_it(tmp_path, mlflow_fake):
    """Tune's callbacks are copies: their ops go to the spool for the driver's writer, and once it is closed they are written at once."""
    recorder = TrialRecorder("http://mlflow.test", "0", "run0", "s", str(tmp_path / "s.jsonl"))  # connects with MlflowClient
    recorder.start_writer()
    callback = MlflowTrials(recorder, "val_recall_at_1", 4)
    copies = (pickle.loads(pickle.dumps(recorder)), copy_module.deepcopy(callback).recorder)
    recorder.connect = lambda uri: mlflow_fake
    for copy in copies:
        assert copy._writer is None and copy.run_ids == {}
        copy.connect = lambda uri: mlflow_fake
        copy.submit(start(f"copy{id(copy)}"))  # the driver's writer applies it
    recorder.close_writer()
    assert recorder.flush(force=True) is True
    assert {f"copy{id(copy)}" for copy in copies} <= set(mlflow_fake.trials())
    copies[0].submit(start("later"))  # no writer runs: written at once
    assert "later" in mlflow_fake.trials()


# -- a study that stops early, and one that ends ----------------------------------------
@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (RuntimeError("disk full"), "FAILED", "disk full"),
        (KeyboardInterrupt(), "KILLED", "interrupted by SIGINT"),
        (StudyInterrupted(signal.SIGTERM), "KILLED", "interrupted by SIGTERM"),
    ],
)
def test_stopped_on_failure_marks_the_runs_and_reraises(tmp_path, mlflow_fake, error, status, reason):
    recorder = recorder_for(mlflow_fake, tmp_path / "s.jsonl")
    for op in (start("a"), start("b"), complete("b")):
        recorder.submit(op)
    with pytest.raises(type(error)), parent.stopped_on_failure(mlflow_fake, "0", "run0"):
        raise error
    trials = mlflow_fake.trials()
    assert trials["a"].info.status == "FAILED" and trials["a"].data.tags["failure_reason"] == f"study stopped: {reason}"
    assert trials["b"].info.status == "FINISHED"  # a finished trial keeps its status
    assert mlflow_fake.runs["run0"].info.status == status and mlflow_fake.runs["run0"].data.tags["failure_reason"] == reason


def test_stopped_on_failure_lets_a_study_that_ends_well_alone(mlflow_fake):
    with parent.stopped_on_failure(mlflow_fake, "0", "run0"):
        pass
    assert mlflow_fake.runs["run0"].info.status == "RUNNING" and sum(mlflow_fake.calls.values()) == 1


def test_summarize_study_counts_and_picks_the_best_complete_trial():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    for number, (state, steps) in enumerate(
        [(TrialState.COMPLETE, [0.2, 0.4]), (TrialState.PRUNED, [0.9]), (TrialState.COMPLETE, [0.3, 0.6]), (TrialState.FAIL, [])]
    ):
        trial = study.ask()
        trial.set_user_attr("config", {"lr": number})
        for step, value in enumerate(steps, start=1):
            trial.report(value, step)
        study.tell(trial, steps[-1] if state == TrialState.COMPLETE else None, state=state)
    summary = records.summarize_study(study, "max", 12.0)
    assert summary.metrics == {
        "n_trials": 4,
        "n_complete": 2,
        "n_pruned": 1,
        "n_failed": 1,
        "wall_time_s": 12.0,
        "epochs_spent": 5.0,
    }
    assert summary.best.number == 2 and summary.best_config == {"lr": 2}  # the pruned trial's 0.9 does not count
    assert records.summarize_study(study, "min", 0.0).best.number == 0


def test_a_driver_recorder_that_flushed_before_the_tuner_writes_what_the_callbacks_copy_kept(tmp_path, mlflow_fake):
    """A resumed study: the driver's recorder flushes before Tune restores its callbacks (a copy), and again at the end."""
    spool = tmp_path / "spool" / "s.jsonl"
    driver = recorder_for(mlflow_fake, spool)
    assert driver.flush(force=True) is True  # launch.restored_tuner: nothing kept yet
    callback = copy_module.deepcopy(driver)  # Tuner.restore unpickles the callbacks
    callback.start_writer()
    mlflow_fake.down = True  # MLflow goes away near the end of the study
    for op in (start("a"), epoch("a", 1), complete("a")):
        callback.submit(op)
    callback.close_writer()
    assert callback.flush(force=True) is False  # on_experiment_end: kept in the spool
    mlflow_fake.down = False
    assert driver.queued() == 3
    assert driver.flush(force=True) is True  # records.finish_study
    run = mlflow_fake.trials()["a"]
    assert mlflow_fake.steps(run) == [1] and run.info.status == "FINISHED" and not spool.exists()


def test_a_torn_last_line_of_the_spool_is_skipped_and_ended_before_the_next_op(tmp_path):
    fake, spool = GatedMlflow(), tmp_path / "s.jsonl"
    fake.create_run("0", tags={"kind": "study", "study_name": "s"})
    recorder = recorder_for(fake, spool)
    recorder.start_writer()
    try:
        recorder.submit(start("a"))
        assert fake.entered.wait(60)  # the writer holds the start's write: the file is not rewritten meanwhile
        with open(spool, "a") as f:
            f.write('{"op": "result", "trial_id": "a", "st')  # an append torn by a full disk or a kill
        recorder.submit(epoch("a", 1))
        lines = spool.read_text().splitlines()
        assert len(lines) == 2 and json.loads(lines[-1])["step"] == 1  # on a line of its own: the torn tail was cut off ...
        assert (tmp_path / "s.jsonl.torn").read_text().startswith('{"op": "result", "trial_id": "a", "st')  # ... and kept
        assert recorder_for(fake, spool).queued() == 2  # what a later driver reads: the torn op (never acknowledged) skipped
    finally:
        fake.gate.set()
        recorder.close_writer()
    assert recorder.flush(force=True) is True
    assert fake.steps(fake.trials()["a"]) == [1] and not spool.exists()


def test_the_driver_closes_its_writer_and_a_copy_leaves_its_ops_to_it(tmp_path, mlflow_fake):
    """The driver owns the one writer: a copy's submit while it runs leaves the op to it; close_writer stops the thread."""
    recorder = recorder_for(mlflow_fake, tmp_path / "s.jsonl")
    copy = copy_module.deepcopy(recorder)
    recorder.start_writer()
    thread = recorder._writer
    assert copy.flush(force=True) is False  # the driver's writer holds the spool
    copy.submit(start("a"))
    recorder.close_writer()
    assert not thread.is_alive() and recorder._writer is None and copy._writer is None
    assert recorder.flush(force=True) is True and "a" in mlflow_fake.trials()


# -- costs that must not grow with the study (issue 27: thousands of trials) ---------------------------------------
def test_a_backlog_is_written_with_one_log_batch_per_run_not_per_epoch(tmp_path, mlflow_fake):
    """10 trials of 10 epochs kept during an outage: written with one batch per run (its params at creation, then all
    its epochs and tags), not one call per epoch; every epoch once, in order."""
    recorder = recorder_for(mlflow_fake, tmp_path / "s.jsonl")
    mlflow_fake.down = True
    for t in range(10):
        for op in (start(f"t{t}"), *(epoch(f"t{t}", step) for step in range(1, 11)), complete(f"t{t}")):
            recorder.submit(op)
    mlflow_fake.down = False
    mlflow_fake.calls.clear()
    assert recorder.flush(force=True) is True
    assert mlflow_fake.calls["log_batch"] == 10 + 10  # was 10 + 100 + the tags, one call per epoch
    assert all(mlflow_fake.steps(run) == list(range(1, 11)) for run in mlflow_fake.trials().values())
    assert {run.info.status for run in mlflow_fake.trials().values()} == {"FINISHED"}


def test_reconnecting_reads_the_logged_epochs_of_the_runs_it_writes_to_only(tmp_path, mlflow_fake):
    """A resumed study's recorder with 50 runs already written reads back the last epoch of the one run it continues,
    not the metric history of every run of the study."""
    first = recorder_for(mlflow_fake, tmp_path / "s.jsonl")
    for t in range(50):
        first.submit(start(f"t{t}"))
        first.submit(epoch(f"t{t}", 1))
    later = recorder_for(mlflow_fake, tmp_path / "s.jsonl")
    mlflow_fake.calls.clear()
    later.submit(epoch("t7", 1))  # a retried epoch: already logged
    later.submit(epoch("t7", 2))
    assert mlflow_fake.calls["get_metric_history"] == 1  # was 50: every run's history at connect
    assert mlflow_fake.steps(mlflow_fake.trials()["t7"]) == [1, 2]


class CountingStudy:
    """An Optuna study's get_trials as the recorder uses it, counting the trials read from it."""

    def __init__(self) -> None:
        self.trials: list[SimpleNamespace] = []
        self.read = 0

    def get_trials(self, deepcopy=False):
        study = self

        class Reads(list):
            def __getitem__(self, index):
                part = list.__getitem__(self, index)
                study.read += len(part) if isinstance(index, slice) else 1
                return part

        return Reads(self.trials)


def test_the_optuna_number_of_each_new_trial_is_found_reading_each_optuna_trial_once(tmp_path, mlflow_fake):
    """200 trials named one after another: 200 Optuna trials read in all (was every trial per new trial: 20,100)."""
    recorder, study = recorder_for(mlflow_fake, tmp_path / "s.jsonl"), CountingStudy()
    recorder._study = study
    for n in range(200):
        study.trials.append(SimpleNamespace(number=n, state=TrialState.RUNNING, user_attrs={"tune_trial_id": f"t{n}"}))
        assert recorder.optuna_number(f"t{n}") == n
    assert study.read == 200


def test_a_trial_never_named_reads_again_only_while_it_runs(tmp_path, mlflow_fake):
    """A resumed study whose first driver was killed inside an ask: its Optuna trial 0 ended FAIL without a Tune trial
    id, and will never get one. 200 trials named after it read 201 Optuna trials in all (was every trial from trial 0
    on per new trial: 20,300). An unnamed trial still RUNNING (asked, not named yet) is read again until it is."""
    recorder, study = recorder_for(mlflow_fake, tmp_path / "s.jsonl"), CountingStudy()
    recorder._study = study
    study.trials.append(SimpleNamespace(number=0, state=TrialState.FAIL, user_attrs={}))
    for n in range(1, 201):
        study.trials.append(SimpleNamespace(number=n, state=TrialState.RUNNING, user_attrs={"tune_trial_id": f"t{n}"}))
        assert recorder.optuna_number(f"t{n}") == n
    assert study.read == 201
    study.trials.append(SimpleNamespace(number=201, state=TrialState.RUNNING, user_attrs={}))  # asked, being named
    study.trials.append(SimpleNamespace(number=202, state=TrialState.RUNNING, user_attrs={"tune_trial_id": "t202"}))
    assert recorder.optuna_number("t202") == 202 and study.read == 203
    study.trials[201].user_attrs["tune_trial_id"] = "t201"
    assert recorder.optuna_number("t201") == 201 and study.read == 205  # read again from the trial being named


def test_the_study_description_ends_with_its_retrained_pick_and_a_later_retraining_replaces_it():
    from study.records.ending import FINAL_MARK, with_final

    note = "**Pick of study s: trial-3** (loss `ice`)\n\nRetrain it: `python -m study.final --study s`"
    summary = {"test_recall_at_1_mean": 0.8471, "test_recall_at_1_std": 0.0123, "test_nmi_mean": 0.9, "test_nmi_std": 0.0}
    once = with_final(note, summary, 3, 32, "models:/s-embedding/1")
    assert once == (
        note + f"\n\n{FINAL_MARK}: 3 seed(s) of 32 epochs on every training class, scored on the test classes: "
        "recall_at_1 0.8471 +- 0.0123, nmi 0.9000 +- 0.0000. Model: `models:/s-embedding/1`."
    )
    again = with_final(once, {"test_recall_at_1_mean": 0.85, "test_recall_at_1_std": 0.0}, 1, 32, "runs:/r/embedding-seed0")
    assert again.startswith(note + "\n\n" + FINAL_MARK) and again.count(FINAL_MARK) == 1 and "0.8500" in again and "0.8471" not in again
    joint = with_final(note, summary | {"ensemble_test_recall_at_1": 0.8612}, 3, 32, "models:/m-e")
    assert "nmi 0.9000 +- 0.0000; the seeds as one model (their embeddings side by side): recall_at_1 0.8612. Model: `models:/m-e`." in (
        joint
    )


def test_epochs_of_an_attempt_the_last_one_did_not_reach_are_kept_once_and_tagged(tmp_path, mlflow_fake):
    """A driver killed at epoch 3 of a trial with no checkpoint; resumed, the trial starts over and is pruned at epoch 2
    (the rung's decision can differ in the resumed study). Its run keeps epochs 1-3 once each, and says that epoch 3
    came from the attempt that was cut short; a trial that continued past what it had logged gets no such tag."""
    first = recorder_for(mlflow_fake, tmp_path / "spool.jsonl")
    for op in (start("a"), epoch("a", 1), epoch("a", 2), epoch("a", 3), start("b"), epoch("b", 1), epoch("b", 2)):
        first.submit(op)
    second = recorder_for(mlflow_fake, tmp_path / "spool.jsonl")  # the resumed driver
    for op in (start("a"), epoch("a", 1), epoch("a", 2), complete("a", "PRUNED")):
        second.submit(op)
    for op in (start("b"), epoch("b", 2), epoch("b", 3), complete("b")):  # b continues from its epoch-1 checkpoint
        second.submit(op)
    a, b = mlflow_fake.trials()["a"], mlflow_fake.trials()["b"]
    assert mlflow_fake.steps(a) == [1, 2, 3] and a.data.tags["epochs_of_a_lost_attempt"] == "3-3"
    assert mlflow_fake.steps(b) == [1, 2, 3] and "epochs_of_a_lost_attempt" not in b.data.tags
    assert a.info.status == b.info.status == "FINISHED"


def test_an_optuna_trial_a_kill_left_without_a_run_gets_a_failed_one_once(tmp_path, runs):
    """The loaded suite's rehearsal resume (2026-11-26): the driver was killed after the searcher asked Optuna for a trial
    (its tune_trial_id and config set) and before the trial's first record opened its MLflow run; Tune had not started it,
    so the resume never did. The end of the study gives it a FAILED run with the orphan's reason: MLflow holds one run per
    Optuna trial, and an end of the study written again (study.sync) adds none.

    Also when the kill came while Optuna asked, before the searcher named the trial (bench.resume_scale, 1 of 11 runs of 20
    trials killed at 6: an Optuna trial with no params, no user attrs and no run): its run is keyed
    ``optuna-<number>``."""
    import mlflow

    from study.search.journal import open_storage

    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", f"journal:{tmp_path / 'optuna.log'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("dml-studies", artifact_location=(tmp_path / "artifacts").as_uri())
    parent_id = client.create_run(experiment, run_name="k", tags={"kind": "study", "study_name": "k"}).info.run_id
    study = optuna.create_study(study_name="k", direction="maximize", storage=open_storage(storage))
    lr = optuna.distributions.FloatDistribution(0.001, 0.1)
    recorder = TrialRecorder(uri, experiment, parent_id, "k", str(tmp_path / "spool.jsonl"), optuna_storage=storage)
    for tune_id in ("t0", "t1"):
        trial = study.ask({"lr": lr})
        trial.set_user_attr("tune_trial_id", tune_id)
        trial.set_user_attr("config", {"lr": trial.params["lr"], "dataset": "synthetic"})
    study.ask()  # trial 2: the driver was killed inside this ask, before the searcher drew a config or named it
    for op in (start("t0"), epoch("t0", 1), complete("t0")):  # t1 was asked for, then the driver was killed
        recorder.submit(op)
    study.tell(0, 0.1)
    study.tell(1, state=TrialState.FAIL)  # the restored searcher (restore_state): no Tune trial continues it
    study.tell(2, state=TrialState.FAIL)
    for _ in range(2):  # the end of the study, then a sync of it
        summary = records.finish_study(study, recorder, "val_recall_at_1", "max", 1.0)
        assert summary.mlflow_synced, summary.mlflow_error
    children = {r.data.tags["trial_id"]: r for r in client.search_runs([experiment], "tags.kind = 'trial'")}
    assert sorted(children) == ["optuna-2", "t0", "t1"]
    unnamed = children["optuna-2"]
    assert unnamed.info.status == "FAILED" and unnamed.data.tags["failure_reason"].startswith("orphaned")
    assert unnamed.data.tags["optuna_trial_number"] == "2" and unnamed.data.tags["optuna_state"] == "FAIL"
    assert unnamed.info.run_name == "trial-2-optuna-2" and not unnamed.data.params
    table = client.download_artifacts(parent_id, "trials.csv", str(tmp_path))
    linked = {row["number"]: row["mlflow_run_id"] for row in csv.DictReader(open(table))}
    assert linked == {"0": children["t0"].info.run_id, "1": children["t1"].info.run_id, "2": unnamed.info.run_id}
    unstarted = children["t1"]
    assert unstarted.info.status == "FAILED" and unstarted.data.tags["failure_reason"].startswith("orphaned")
    assert unstarted.data.tags["optuna_trial_number"] == "1" and unstarted.data.tags["optuna_state"] == "FAIL"
    assert unstarted.data.tags["mlflow.parentRunId"] == parent_id and unstarted.info.run_name == "trial-1-t1"
    assert float(unstarted.data.params["lr"]) == study.trials[1].params["lr"]
    assert not client.get_metric_history(unstarted.info.run_id, "train_loss")  # it trained nothing
    assert children["t0"].info.status == "FINISHED" and children["t0"].data.tags["optuna_state"] == "COMPLETE"


def test_a_runs_params_are_the_keys_its_config_trained_with_and_a_tag_names_the_others():
    """Values a trial never used (ICE's scale on a softmax trial, heating on an ICE trial) are not logged, so MLflow's
    tables and compare plots cannot show them as real; the sets below are written out from the rules of the config
    (TrainConfig's docstring), not computed."""
    from study.records.trials import config_params

    ice = {"loss": "ice", "ice_scale": 32.0, "optimizer": "sgd", "lr_schedule": "cosine", "variant": "b"}
    params, tags = config_params(ice)
    unused = {"alpha", "learn_alpha", "heating", "heating_target", "heating_start", "weight_norm", "mean_proxy_weight"}
    unused |= {"heating_lr_factor", "dropout"}  # the step schedule's factor, fc_dropout's rate
    assert set(params) == (set(TrainConfig.keys()) - unused) | {"variant"}  # a variants space's name is always kept
    assert (params["ice_scale"], params["momentum"], params["variant"]) == (32.0, 0.9, "b")
    assert set(tags["inactive_params"].split(",")) == unused and set(tags["active_params"].split(",")) == set(params) - {"variant"}
    plain = {"loss": "softmax", "heating": "none", "optimizer": "sgd", "lr_schedule": "constant", "backbone": "resnet18"}
    params, tags = config_params(plain)
    unused = {"ice_scale", "heating_target", "heating_start", "lr_decay_start", "heating_lr_factor", "dropout", "backbone_width"}
    assert set(params) == set(TrainConfig.keys()) - unused and set(tags["inactive_params"].split(",")) == unused
    assert config_params({"loss": "nosuchloss"}) == ({"loss": "nosuchloss"}, {})  # not a config: logged as given, no tags

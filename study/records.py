"""What a study writes about itself, and reads back: its MLflow parent run, trial records, end-of-study records.

- The parent run (one per study, tags ``kind=study`` and ``study_name``) holds the study's settings as
  params; with ``--resume`` they are read back from it.
- The trial records: one child run per Tune trial, written by the driver only (``TrialRecorder``).
  Each record goes to a spool file (``<runs dir>/spool/NAME.jsonl``) first and is written to MLflow
  by the recorder's writer thread during a study; while MLflow is unreachable the records wait
  there and are written when it returns, at the end of the study, by a resumed study or by
  ``python -m study.sync``.
- The end of a study (``finish_study``): Optuna trials still RUNNING are FAIL, the child runs get
  their Optuna state, and the parent gets best_config.yaml, the trials table, plots and summary metrics.
- A failed or interrupted study (``stopped_on_failure``): its runs still RUNNING are marked stopped.
- Before a resume (``reconcile_before_resume``): Optuna trials no restored Tune trial will continue are FAIL.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlflow
import optuna
from mlflow.entities import Metric, Param, RunTag
from optuna.trial import TrialState

from study import console, tracking
from study.interrupts import signal_name
from study.selection import Selection, selection_from_record, selection_record
from study.tracking import UsageError, child_runs, first_error_line
from trainables.core.config import ConfigError, TrainConfig, applicable_keys


def spool_path(study_name: str) -> str:
    """Where the trial records of ``study_name`` wait while MLflow is unreachable."""
    return str(tracking.runs_dir() / "spool" / f"{study_name}.jsonl")


# ----------------------------------------------------------------------------- the parent run
def resumed_params(uri: str, experiment: str, study_name: str) -> dict[str, str]:
    """The params of an existing study's parent run (what ``--resume`` continues with)."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    parent = tracking.find_study_run(client, found.experiment_id, study_name) if found else None
    if parent is None:
        raise UsageError(
            f"--resume: no study {study_name!r} in MLflow experiment {experiment!r} at {uri}; "
            "expected the --study-name of an interrupted study"
        )
    return dict(parent.data.params)


def existing_parent(client, experiment_id: str, study_name: str, *, resume: bool, experiment: str) -> str | None:
    """The run id of the study's parent run: a resumed study must have one, a new one must not (then None)."""
    parent = tracking.find_study_run(client, experiment_id, study_name)
    if resume and parent is None:
        raise UsageError(f"--resume: no MLflow parent run for study {study_name!r} in experiment {experiment!r} at {client.tracking_uri}")
    if not resume and parent is not None:
        raise UsageError(f"--study-name {study_name}: MLflow already has this study; pass --resume or choose another name")
    return parent.info.run_id if parent is not None else None


def create_parent_run(client, experiment_id: str, study_name: str, space_path: str, params: dict[str, Any]) -> str:
    """The study's MLflow parent run, with ``params`` and the space file as an artifact; returns its run id."""
    tags = {**tracking.reproducibility_tags(), "kind": "study", "study_name": study_name, "space": space_path}
    run_id = client.create_run(experiment_id, run_name=study_name, tags=tags).info.run_id
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    client.log_artifact(run_id, space_path)
    return run_id


@contextlib.contextmanager
def stopped_on_failure(client, experiment_id: str, parent_id: str) -> Iterator[None]:
    """Runs the body; when it raises, the study's runs still RUNNING are marked stopped with the reason, and it re-raises."""
    try:
        yield
    except BaseException as error:
        interrupted = isinstance(error, KeyboardInterrupt)
        reason = f"interrupted by {signal_name(error)}" if interrupted else first_error_line(str(error)) or type(error).__name__
        try:
            ids = [r.info.run_id for r in training_runs(client, experiment_id, parent_id)]
            tracking.fail_orphans(client, ids, f"study stopped: {reason}")
            client.set_tag(parent_id, "failure_reason", reason)
            client.set_terminated(parent_id, status="KILLED" if interrupted else "FAILED")
        except Exception as mlflow_error:  # MLflow itself may be what failed
            print(f"warning: could not mark the study's MLflow runs as stopped ({first_error_line(str(mlflow_error))})", file=sys.stderr)
        raise


def reopen(client, experiment_id: str, parent_id: str) -> None:
    """A resumed study's parent run is RUNNING again; the reason it stopped moves from ``failure_reason`` to ``stopped_before``."""
    runs = [client.get_run(parent_id), *training_runs(client, experiment_id, parent_id)]
    for run in runs:
        reason = run.data.tags.get("failure_reason")
        if reason and (run.info.run_id == parent_id or reason.startswith("study stopped")):
            client.set_tag(run.info.run_id, "stopped_before", reason)
            client.delete_tag(run.info.run_id, "failure_reason")
    client.update_run(parent_id, status="RUNNING")


# ----------------------------------------------------------------------------- trial records
# child runs of a study: the search's trials, and the top trials re-run with extra seeds (study.selection)
TRIAL_KINDS = ("trial", "confirmation")
LOGGED_EVERY_EPOCH = "train_loss"  # a metric of every report: its steps are the epochs a run has recorded
WRITER_STATE = ("_lock", "_wake", "_flushing", "_writer", "_closing")  # TrialRecorder's threads: never pickled or copied
PERSIST_EVERY = 64  # a long drain rewrites the spool after this many applied ops, so a kill replays at most these
RUNNING_WRITERS: weakref.WeakSet = weakref.WeakSet()  # recorders (Tune's copies included) whose writer thread runs


def stop_writers() -> None:
    """Stop every recorder's writer in this process (what each has not applied stays in its spool file).

    The driver calls this when ``Tuner.fit()`` returns or raises: Tune does not call its callbacks'
    ``on_experiment_end`` on every way out, and no record may land after the study marks its runs.
    """
    for recorder in list(RUNNING_WRITERS):
        recorder.close_writer()


def json_or_none(line: str) -> Any:
    """A spool line's op; None for a blank line or one torn by a write that failed or was killed (an op never acknowledged)."""
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


def training_runs(client, experiment_id: str, parent_id: str) -> list:
    """The child runs of a study that train: its trials and its confirmation re-runs (``TRIAL_KINDS``)."""
    return [run for kind in TRIAL_KINDS for run in child_runs(client, experiment_id, parent_id, kind=kind)]


def run_name(kind: str, trial_id: str, number: int | None) -> str:
    """``trial-<Optuna number>-<Tune trial id>``, or ``confirm-<number of the trial it re-runs>-<id>`` for a confirmation run.

    Without a number: ``trial-<id>``, ``confirm-<id>``.
    """
    if kind == "confirmation":
        return f"confirm-{number}-{trial_id}" if number is not None else f"confirm-{trial_id}"
    return f"trial-{number}-{trial_id}" if number is not None else f"trial-{trial_id}"


def resolved_config(config: dict[str, Any]) -> dict[str, Any]:
    """Every TrainConfig key of a trial's config, defaults filled in (the config as given when it does not validate)."""
    try:
        return TrainConfig.from_dict(dict(config), source="trial config").to_dict()
    except ConfigError:
        return dict(sorted(config.items()))


class TrialRecorder:
    """Writes trial events to MLflow as child runs of a study, keeping them locally while MLflow is away.

    Every event is an operation ({"op": "start" | "result" | "complete" | "error", "trial_id": ...}) applied
    in order. When MLflow cannot be reached, operations queue up in the spool file (JSON lines) and are
    applied when it returns. Applying is idempotent: a run is found by its trial_id tag before one is
    created, and an epoch already logged is skipped. ``connect(tracking_uri)`` makes the MLflow client.

    A search trial's run is named ``trial-<Optuna number>-<Tune trial id>`` and logs the trial's full
    resolved config (every TrainConfig key) as params; the Optuna trial gets the run's id as its
    ``mlflow_run_id`` user attribute. The Optuna study is the one in the parent run's ``optuna_storage``.

    With the writer started (``start_writer``, as the study's Tune callback does), ``submit`` only appends the
    operation to the spool file and returns, and one background thread applies the spool to MLflow in order:
    Tune's driver loop, which holds a reporting trial until its callbacks return, never waits on an MLflow
    write. What ``submit`` returned from is in the spool file either way, so a driver killed at any point leaves
    every record for the next flush (applying is idempotent, so a record applied just before the kill is not
    written twice).
    """

    retry_every_s = 15.0

    def __init__(
        self,
        tracking_uri: str,
        experiment_id: str,
        parent_run_id: str,
        study_name: str,
        spool: str,
        connect: Callable[[str], Any] = mlflow.MlflowClient,
    ) -> None:
        self.tracking_uri, self.experiment_id, self.parent_run_id = tracking_uri, experiment_id, parent_run_id
        self.study_name, self.spool, self.connect = study_name, spool, connect
        self._client: Any = None
        self._storage: optuna.storages.BaseStorage | None = None
        self.run_ids: dict[str, str] = {}
        self.logged_step: dict[str, int] = {}
        self.pending: list[dict[str, Any]] | None = None
        self.offline_since: float | None = None
        self.last_attempt = 0.0
        self._threads()

    def _threads(self) -> None:
        """The writer's state: ``_lock`` guards ``pending`` and the spool file, ``_flushing`` lets one flush run at a time."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._flushing = threading.Lock()
        self._writer: threading.Thread | None = None
        self._closing = False

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_client": None, "_storage": None, "pending": None, "run_ids": {}, "logged_step": {}}
        return {k: v for k, v in state.items() if k not in WRITER_STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._threads()  # a copy (Tune's callbacks are copies) or a study's pickled callbacks start without a writer

    # -- the queue --------------------------------------------------------------
    def _load(self) -> list[dict[str, Any]]:
        if self.pending is None:
            self.pending = []
            if os.path.exists(self.spool):
                with open(self.spool) as f:
                    self.pending = [op for op in map(json_or_none, f) if op is not None]
        return self.pending

    def _reread(self) -> None:
        """Without a running writer the spool file is the queue (another recorder of the study may have added to it since)."""
        if self._writer is None:
            self.pending = None

    def _append(self, line: str) -> None:
        """One op at the end of the spool file; a line torn by an earlier append that failed or was killed is ended first."""
        try:
            f = open(self.spool, "a+b")
        except FileNotFoundError:  # the first op of a study: its spool folder is made once
            os.makedirs(os.path.dirname(self.spool) or ".", exist_ok=True)
            f = open(self.spool, "a+b")
        with f:
            if f.seek(0, os.SEEK_END) and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
                f.write(b"\n")
            f.write(line.encode())

    def _persist(self) -> None:
        pending = self._load()
        if not pending:
            if os.path.exists(self.spool):
                os.remove(self.spool)
            return
        os.makedirs(os.path.dirname(self.spool) or ".", exist_ok=True)
        tmp = f"{self.spool}.tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(op) + "\n" for op in pending)
        os.replace(tmp, self.spool)

    def queued(self) -> int:
        """How many operations wait to be written (in memory or in the spool file)."""
        with self._lock:
            self._reread()
            return len(self._load())

    def submit(self, op: dict[str, Any]) -> None:
        """Queue ``op``: it is in the spool file when this returns; without the writer it is also applied (or kept)."""
        line = json.dumps(op) + "\n"
        with self._lock:
            queue = self._load() if self._writer is not None else None  # read before the append, which it would hold
            self._append(line)  # the spool holds every op not yet applied, in order; a failed write queues nothing
            if queue is not None:
                queue.append(op)
                self._wake.notify()
                return
        self.flush()  # reads the spool: this op, after any that another recorder of the study kept

    def flush(self, force: bool = False) -> bool:
        """Apply queued operations in order; True when nothing is left queued."""
        with self._flushing:
            with self._lock:
                self._reread()
                if self.offline_since is not None and not force and time.time() - self.last_attempt < self.retry_every_s:
                    self._persist()
                    return False
            self.last_attempt = time.time()
            applied = 0
            while (op := self._next()) is not None:
                try:
                    self._apply(op)  # outside _lock: submit goes on meanwhile
                except Exception as error:  # MlflowException, connection errors, timeouts: all mean "not written"
                    self._went_offline(error)
                    with self._lock:
                        self._persist()
                    return False
                applied += 1
                with self._lock:
                    self.pending.pop(0)
                    if applied % PERSIST_EVERY == 0:
                        self._persist()
            self._came_back()
            with self._lock:
                self._persist()
            return True

    def _next(self) -> dict[str, Any] | None:
        with self._lock:
            pending = self._load()
            return pending[0] if pending else None

    # -- the background writer ----------------------------------------------------
    def start_writer(self) -> None:
        """From now on ``submit`` returns once the op is in the spool file; a thread applies it (``close_writer`` stops it)."""
        with self._lock:
            if self._writer is not None:
                return
            self._persist()  # the spool file holds exactly what is pending: later ops are appended to it
            self._closing = False
            self._writer = threading.Thread(target=self._write_loop, name="mlflow-trial-records", daemon=True)
            self._writer.start()
            RUNNING_WRITERS.add(self)

    def close_writer(self) -> None:
        """Stop the writer after the flush it is in; what it has not applied stays queued (``flush(force=True)`` next)."""
        with self._lock:
            writer, self._closing = self._writer, True
            self._wake.notify()
        if writer is not None:
            writer.join()  # at most the op being applied: every MLflow call is bounded (tracking.configure_mlflow)
        with self._lock:
            self._writer = None
        RUNNING_WRITERS.discard(self)

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._closing or bool(self._load()))
                if self._closing:
                    return
            try:
                written = self.flush()
            except OSError as error:  # the spool file could not be rewritten (a full disk): its ops stay queued
                print(f"warning: the trial records' spool {self.spool} could not be written ({error}); trying again", flush=True)
                written = False
            if not written:  # MLflow is away: try again after retry_every_s, or stop when closed
                with self._lock:
                    self._wake.wait_for(lambda: self._closing, timeout=self.retry_every_s)

    def _went_offline(self, error: Exception) -> None:
        self._client = None
        if self.offline_since is not None:
            return
        self.offline_since = time.time()
        self._event("unreachable", first_error_line(str(error))[:500])
        print(
            f"warning: MLflow at {self.tracking_uri} is unreachable ({first_error_line(str(error))[:200]}); "
            f"training goes on and records are kept in {self.spool} until it returns",
            flush=True,
        )

    def _came_back(self) -> None:
        events = self.events()
        if self.offline_since is None and not (events and events[-1]["event"] == "unreachable"):
            return
        since = self.offline_since or events[-1]["time"]
        print(f"MLflow at {self.tracking_uri} is reachable again; the kept records are written", flush=True)
        self._event("reachable again", f"after {time.time() - since:.0f} s")
        self.offline_since = None

    def _event(self, what: str, detail: str) -> None:
        """Outages are logged beside the spool (``.events``): Tune works on copies of its callbacks,
        and the study's end summary reads them from there."""
        os.makedirs(os.path.dirname(self.spool) or ".", exist_ok=True)
        with open(f"{self.spool}.events", "a") as f:
            f.write(json.dumps({"time": time.time(), "event": what, "detail": detail}) + "\n")

    def events(self) -> list[dict[str, Any]]:
        if not os.path.exists(f"{self.spool}.events"):
            return []
        with open(f"{self.spool}.events") as f:
            return [json.loads(line) for line in f if line.strip()]

    # -- applying one operation ---------------------------------------------------
    @property
    def client(self):
        """The MLflow client; on (re)connecting, the child runs already written and their last epochs are read back."""
        if self._client is None:
            client = self.connect(self.tracking_uri)
            runs = training_runs(client, self.experiment_id, self.parent_run_id)
            for run in runs:
                trial_id = run.data.tags.get("trial_id")
                if trial_id:
                    self.run_ids[trial_id] = run.info.run_id
                    steps = [m.step for m in client.get_metric_history(run.info.run_id, LOGGED_EVERY_EPOCH)]
                    self.logged_step[trial_id] = max(steps, default=0)
            self._client = client
        return self._client

    @property
    def optuna_storage(self) -> optuna.storages.BaseStorage | None:
        """The Optuna storage of the study (the parent run's ``optuna_storage`` param), or None without one."""
        if self._storage is None:
            from study.search import open_storage

            url = self.client.get_run(self.parent_run_id).data.params.get("optuna_storage")
            self._storage = open_storage(url) if url else None
        return self._storage

    def optuna_number(self, trial_id: str) -> int | None:
        """The number of the Optuna trial the searcher asked for Tune trial ``trial_id`` (None: not an Optuna trial)."""
        storage = self.optuna_storage
        if storage is None:
            return None
        try:
            study_id = storage.get_study_id_from_name(self.study_name)
        except KeyError:
            return None
        found = [t for t in storage.get_all_trials(study_id, deepcopy=False) if t.user_attrs.get("tune_trial_id") == trial_id]
        return found[0].number if found else None

    def _link_optuna_trial(self, number: int, run_id: str) -> None:
        """The Optuna trial names its MLflow run (user attribute ``mlflow_run_id``) while it can still be changed."""
        storage = self.optuna_storage
        trial = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(self.study_name), number)
        try:
            storage.set_trial_user_attr(trial, "mlflow_run_id", run_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # written after the trial ended (records kept during an outage): the run's optuna_trial_number links them

    def _run_id(self, trial_id: str, config: dict[str, Any] | None = None, kind: str = "trial", confirms: int | None = None) -> str:
        """The run of ``trial_id``, created at its first event; ``confirms``: the Optuna trial a confirmation run re-runs."""
        client = self.client
        if trial_id not in self.run_ids:
            number = self.optuna_number(trial_id) if kind == "trial" else confirms
            tags = {"mlflow.parentRunId": self.parent_run_id, "kind": kind, "trial_id": trial_id, "study_name": self.study_name}
            if number is not None:
                tags["optuna_trial_number" if kind == "trial" else "confirms_optuna_trial"] = str(number)
            name = run_name(kind, trial_id, number)
            run = client.create_run(self.experiment_id, tags={**tags, "mlflow.runName": name}, run_name=name)
            if config:
                client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in resolved_config(config).items()])
            if number is not None and kind == "trial":
                self._link_optuna_trial(number, run.info.run_id)
            self.run_ids[trial_id] = run.info.run_id
            self.logged_step[trial_id] = 0
        return self.run_ids[trial_id]

    def _apply(self, op: dict[str, Any]) -> None:
        trial_id = op["trial_id"]
        run_id = self._run_id(trial_id, op.get("config"), op.get("kind", "trial"), op.get("confirms"))
        client = self.client
        if op["op"] == "result":
            step = int(op["step"])
            if step <= self.logged_step.get(trial_id, 0):  # already recorded before a restart: never a duplicated step,
                for key, value in op["tags"].items():  # but its tags (where the trial runs, where it resumed from) are new
                    client.set_tag(run_id, key, value)
                return
            metrics = [Metric(k, float(v), int(op["time_ms"]), step) for k, v in op["metrics"].items()]
            client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in op["tags"].items()])
            self.logged_step[trial_id] = step
        elif op["op"] in ("complete", "error"):
            for key, value in op["tags"].items():
                client.set_tag(run_id, key, value)
            client.set_terminated(run_id, status="FINISHED" if op["op"] == "complete" else "FAILED")


# ----------------------------------------------------------------------------- before a resume
def reconcile_before_resume(study: optuna.Study, experiment_dir: str) -> list[int]:
    """Optuna trials left RUNNING that no restored Tune trial will continue are marked FAIL; returns their numbers.

    The Tune side is the experiment's last snapshot, read with Ray's public ``ExperimentAnalysis``; the
    Optuna side is the ``tune_trial_id`` user attribute the searcher sets on every trial it asks for.
    """
    from ray.tune import ExperimentAnalysis

    restored = ExperimentAnalysis(experiment_dir).trials
    continuing = {t.trial_id for t in restored if t.status not in ("TERMINATED", "ERROR")}
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.user_attrs.get("tune_trial_id") not in continuing:
            study.tell(trial.number, state=TrialState.FAIL)
            failed.append(trial.number)
    return failed


# ----------------------------------------------------------------------------- the end of a study
def epochs_trained(trial: optuna.trial.FrozenTrial) -> int:
    """Epochs a trial trained: a ladder of budgets records them; else one intermediate value per epoch."""
    return int(trial.user_attrs.get("epochs_trained", len(trial.intermediate_values)))


def summarize_study(study: optuna.Study, mode: str, wall_s: float, selection: Selection | None = None) -> dict[str, Any]:
    """Counts, the best complete trial and its config, from the Optuna storage (the study's record of truth).

    With a ``selection`` (the top trials re-run with extra seeds), the best is its winner, not the single best score.
    """
    trials = study.get_trials(deepcopy=False)
    if selection is None and "selection" in study.user_attrs:  # a study synced or finished again after its confirmation runs
        selection = selection_from_record(study.user_attrs["selection"], mode)
    counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value)]
    best = None
    if complete:
        best = max(complete, key=lambda t: t.value) if mode == "max" else min(complete, key=lambda t: t.value)
    if selection is not None:
        best = next(t for t in complete if t.number == selection.winner.key)
    metrics = {
        "n_trials": len(trials),
        "n_complete": counts["COMPLETE"],
        "n_pruned": counts["PRUNED"],
        "n_failed": counts["FAIL"],
        "wall_time_s": wall_s,
        "epochs_spent": float(sum(epochs_trained(t) for t in trials)),
    }
    if selection is not None:
        metrics["confirmation_runs"] = float(sum(len(c.scores) - 1 for c in selection.ranking))
        metrics["selection_lead_in_se"] = selection.lead_in_se
    best_config = best.user_attrs.get("config") if best else None
    return {"metrics": metrics, "best": best, "best_config": best_config, "selection": selection}


def finish_study(
    study: optuna.Study,
    recorder: TrialRecorder,
    metric: str,
    mode: str,
    wall_s: float,
    selection: Selection | None = None,
    usage: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Writes the kept trial records, best config, trials table, plots and summary metrics to the parent run.

    ``usage`` (``slots``, ``startup_s``, ``since``) adds the study's utilization (study.utilization), read from the
    trial runs logged since ``since``; a sync leaves it out.

    When MLflow cannot be reached, nothing is lost: the trial records stay in the spool and the Optuna
    storage holds the rest; ``python -m study.sync --study NAME`` writes them later.
    """
    # the study is over: a trial still RUNNING was orphaned by a killed driver and never continued
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
    summary = summarize_study(study, mode, wall_s, selection)
    summary["mlflow_synced"] = False
    try:
        if not recorder.flush(force=True):
            raise ConnectionError("the kept trial records could not be written")
        if usage is not None:
            add_utilization(summary, recorder, wall_s, **usage)
        write_study_records(study, recorder, metric, summary)
        summary["mlflow_synced"] = True
    except Exception as error:  # any MLflow failure: report, keep, and let the user sync
        summary["mlflow_error"] = first_error_line(str(error)) or type(error).__name__
    summary["outages"] = sum(e["event"] == "unreachable" for e in recorder.events())
    return summary


def describe_optuna_study(study: optuna.Study, parent_run_id: str, space: str, metric: str) -> None:
    """What optuna-dashboard shows of the study: the objective's name, the MLflow parent run and the space.

    Written only where they differ, so calling it again writes nothing.
    """
    attrs = {"mlflow_parent_run_id": parent_run_id, "space": space}
    for key, value in attrs.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)
    if study.metric_names != [metric]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric])


def add_utilization(summary: dict[str, Any], recorder: TrialRecorder, wall_s: float, slots: int, startup_s: float, since: float) -> None:
    """The study's utilization from its trial runs, into the summary and the parent run's metrics."""
    from study import utilization

    epochs = utilization.epochs_from_mlflow(recorder.client, recorder.experiment_id, recorder.parent_run_id, since=since)
    summary["utilization"] = utilization.study_utilization(epochs, wall_s, slots, startup_s)
    summary["metrics"].update(summary["utilization"].as_metrics())


def write_study_records(study: optuna.Study, recorder: TrialRecorder, metric: str, summary: dict[str, Any]) -> None:
    """Optuna's number and state on every child run, then the artifacts and summary metrics on the parent run.

    Tags and metrics that already hold these values are not written again.
    """
    from study.artifacts import study_artifacts

    client, parent_id = recorder.client, recorder.parent_run_id
    parent = client.get_run(parent_id)
    describe_optuna_study(study, parent_id, parent.data.params.get("space", parent.data.tags.get("space", "")), metric)
    children = {r.data.tags.get("trial_id"): r for r in child_runs(client, recorder.experiment_id, parent_id)}
    for t in study.get_trials(deepcopy=False):
        run = children.get(t.user_attrs.get("tune_trial_id"))
        if run is not None:
            tags = {
                "optuna_trial_number": str(t.number),
                "optuna_state": t.state.name,
                "mlflow.runName": run_name("trial", run.data.tags["trial_id"], t.number),
            }
            for key, value in tags.items():
                if run.data.tags.get(key) != value:
                    client.set_tag(run.info.run_id, key, value)
    # a trial or re-run still RUNNING was orphaned by a killed driver (it started after Tune's last snapshot)
    orphans = [run.info.run_id for run in training_runs(client, recorder.experiment_id, parent_id) if run.info.status == "RUNNING"]
    tracking.fail_orphans(client, orphans, "orphaned: its trial was interrupted with the driver and not continued")
    best = summary["best"]
    selection = summary.get("selection")
    with tempfile.TemporaryDirectory() as tmp:
        paths = study_artifacts(study, children, Path(tmp), metric, best)
        if selection is not None:
            paths.append(Path(tmp) / "selection.json")
            paths[-1].write_text(json.dumps(selection_record(selection), indent=1))
        for path in paths:
            client.log_artifact(parent_id, str(path))
    metrics = {k: v for k, v in summary["metrics"].items() if math.isfinite(v)}
    if selection is not None:
        metrics[f"best_mean_{metric}"] = selection.winner.mean
        client.set_tag(parent_id, "best_pick", selection.verdict())
    if best is not None:
        metrics[f"best_{metric}"] = float(best.value)
        client.set_tag(parent_id, "best_trial", best.user_attrs.get("tune_trial_id", str(best.number)))
    for key, value in metrics.items():
        if parent.data.metrics.get(key) != float(value):  # a study synced again: no repeated point
            client.log_metric(parent_id, key, float(value))
    client.set_terminated(parent_id, status="FINISHED")


def print_selection(selection: Selection, metric: str) -> None:
    print(f"the top trials re-run with extra seeds ({metric}: the trial's score, then each extra seed's):")
    for c in selection.ranking:
        sem = f" +- {c.sem:.4f}" if math.isfinite(c.sem) else ""
        print(f"  Optuna #{c.key}: mean {c.mean:.4f}{sem} over {len(c.scores)} ({', '.join(f'{v:.4f}' for v in c.scores)})")
    print(f"pick: Optuna #{selection.winner.key}, {selection.verdict()}")


def print_summary(outcome: dict[str, Any], metric: str) -> None:
    """The human summary of a finished (or synced) study: counts, outages, the best trial and what to run next.

    The commands it prints name this environment's interpreter and tools (``study.console``), so they run as printed.
    """
    m = outcome["metrics"]
    study_name = outcome["study_name"]
    flags = f"--study {study_name} --experiment {outcome['experiment']}"
    if not tracking.is_local_sqlite(outcome["uri"]):
        flags += f" --tracking-uri {outcome['uri']}"
    if outcome.get("outages"):
        print(
            f"\nMLflow was unreachable {outcome['outages']} time(s) during the study; training went on"
            + ("; the records kept meanwhile were written when it returned." if outcome.get("mlflow_synced", True) else ".")
        )
    if not outcome.get("mlflow_synced", True):
        print(
            f"\nwarning: MLflow at {outcome['uri']} could not be written at the end ({outcome.get('mlflow_error')}). Nothing is lost: "
            f"trial records are kept in {spool_path(study_name)} and the trials in the Optuna storage.\n"
            f"write them when MLflow is back:  {console.python_command('study.sync')} {flags}"
        )
    print(
        f"\nstudy {study_name} finished in {m['wall_time_s']:.0f} s: {m['n_trials']} trials, "
        f"{m['n_complete']} complete, {m['n_pruned']} pruned early, {m['n_failed']} failed, {m['epochs_spent']:.0f} epochs trained"
    )
    if outcome.get("utilization") is not None:
        print(outcome["utilization"].describe())
    best = outcome["best"]
    if best is None:
        print("no trial completed; nothing to retrain")
    else:
        if outcome.get("selection") is not None:
            print_selection(outcome["selection"], metric)
        config = TrainConfig.from_dict(outcome["best_config"] or {}, source="best trial")
        print(f"best trial {best.user_attrs.get('tune_trial_id')} (Optuna #{best.number}): {metric} = {best.value:.4f}")
        print(f"its config (best_config.yaml: the keys that apply to loss {config.loss}; every key: resolved_config.yaml):")
        for key in applicable_keys(config):
            print(f"  {key}: {getattr(config, key)}")
        epochs = f"{outcome['final_epochs']} epochs, " if outcome.get("final_epochs") else ""
        print(
            f"\nretrain it on all training classes and test it:  {console.python_command('study.final')} {flags}\n"
            f"  ({epochs}seeds {config.seed}, {config.seed + 1}, {config.seed + 2}; the model of seed {config.seed}, the seed the study "
            f"scored, is registered as {study_name}-embedding: choosing the seed by its test score would tune on the test classes)"
        )
    print(f"open the MLflow UI:  {console.ui_command(outcome['uri'])}")
    log = console.log_path(study_name)
    if log.is_file():
        print(f"warnings and library logs: {log}")

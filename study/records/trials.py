"""The trial records of a study: one MLflow child run per Tune trial, written by the driver only, never lost.

Every trial event is an operation ({"op": "start" | "result" | "complete" | "error", "trial_id": ...}) that
``TrialRecorder.submit`` appends to the study's spool file (``study.lines.Spool``) before anything else. One
writer at a time applies the spool to MLflow, in order, and drops what it applied:

- during a study, the driver's writer thread (``start_writer`` ... ``close_writer``, held by an ``flock`` on
  ``<spool>.writer``), so Tune's loop, which holds a reporting trial until its callbacks return, never waits
  on MLflow. Tune works on copies of its callbacks (and a resumed study on unpickled ones): their ``submit``
  only appends, and the driver's writer picks the op up;
- without a writer (``study.sync``, the end of a study, a test), ``submit`` applies at once (``flush``).

While MLflow is unreachable the operations stay in the spool and are applied when it returns (the writer
retries every ``retry_every_s``), at the end of the study, by a resumed study or by ``python -m study.sync``.
Applying is idempotent: a run is found by its ``trial_id`` tag before one is created, and an epoch already
logged is skipped, so an op applied just before a kill is not written twice.

A result's step is the epoch of the trial's schedule (1 to N). A promoted trial trains its rung's tail again, at steps
its run holds: those epochs go under ``retrained/<name>`` and the tag ``retrained_epochs`` (``RunBatch.add``). What
is logged is told by ``epochs_trained`` (the op's ``trained``), monotone: a ladder's run logs it at every epoch.

This module imports no Ray and no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from typing import IO, Any

import mlflow
import optuna
from mlflow.entities import Metric, Param, RunTag

from study.lines import Spool
from study.records.tracking import child_runs, first_error_line, runs_dir
from study.records.utilization import RETRAINED, epoch_times
from study.search.journal import open_storage
from trainables.core.config import ConfigError, TrainConfig, applicable_keys

log = logging.getLogger(__name__)

# child runs of a study: the search's trials, and the top trials re-run with extra seeds (study.search.race)
TRIAL_KINDS = ("trial", "confirmation")
LOGGED_EVERY_EPOCH = "train_loss"  # a metric of every report: its steps are the epochs a run has recorded
TRAINED = "epochs_trained"  # a ladder's metric of every epoch trained (retrained ones too): its values are monotone
RETRAINED_TAG = "retrained_epochs"  # a run's tag: the steps it holds a retrained epoch at, "3-4" or "2,7-8"
# A run's tag "FIRST-LAST": epochs its MLflow run holds from an attempt that was cut short (a killed driver, a trial
# restarted without a checkpoint of them) and that the trial's last attempt, ended earlier, did not train again
# (in epochs trained: ``epochs_trained``, the steps on one budget)
LOST_EPOCHS_TAG = "epochs_of_a_lost_attempt"
PERSIST_EVERY = 1024  # a long drain drops what it applied from the spool after this many ops, so a kill replays at most these
CHUNK_OPS = 256  # ops applied together: each run's results in a chunk are one MLflow log_batch
MAX_METRICS, MAX_TAGS = 1000, 100  # what one MLflow log_batch takes
UNPICKLED = (
    "_client", "_study", "_storage", "run_ids", "_runs_found", "logged", "_numbers", "_indexed", "applied_epochs",
    "_wake", "_closing", "_writer", "_flushing",
)  # fmt: skip


def spool_path(study_name: str) -> str:
    """Where the trial records of ``study_name`` wait to be written to MLflow: ``<runs dir>/spool/NAME.jsonl``."""
    return str(runs_dir() / "spool" / f"{study_name}.jsonl")


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


def train_config(config: dict[str, Any] | None) -> TrainConfig | None:
    """The TrainConfig of a trial's config keys (a run's params as strings too; other keys, such as a ``variants``
    space's ``variant``, left aside); None when they do not validate."""
    known = set(TrainConfig.keys())
    try:
        return TrainConfig.from_dict({k: v for k, v in (config or {}).items() if k in known}, source="trial config")
    except (ConfigError, TypeError, ValueError):
        return None


ACTIVE_PARAMS_TAG = "active_params"  # the config keys a trial trained with, comma-separated
INACTIVE_PARAMS_TAG = "inactive_params"  # the config keys that did not apply to it: not logged as params


def active_params(config: dict[str, Any] | None) -> tuple[str, ...] | None:
    """The config keys that change how ``config`` (a trial's config, or a run's params as strings) trains, in TrainConfig
    order; None when its config keys do not make a valid TrainConfig (then no key can be said to be unused). Other keys
    (a ``variants`` space's ``variant``) are not config keys: neither active nor inactive."""
    parsed = train_config(config)
    return None if parsed is None else applicable_keys(parsed)


def active_tag(config: dict[str, Any] | None) -> dict[str, str]:
    """``{ACTIVE_PARAMS_TAG: the active keys, comma-separated}`` of a trial's config; {} when it is not a TrainConfig."""
    active = active_params(config)
    return {} if active is None else {ACTIVE_PARAMS_TAG: ",".join(active)}


def config_params(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """A config's params as a run logs them (a trial's, a re-run's, a final seed's), and the tags that name them.

    The params: the keys the config trains with (defaults filled in) and any key that is no config key (a ``variants``
    space's ``variant``). A key that did not apply (the other loss's, a heating target without heating) is left out
    and named in ``inactive_params``: a value the trial never used would look real in MLflow's tables and compare
    plots. A config that does not validate logs as given."""
    parsed = train_config(config)
    if parsed is None:
        return dict(sorted(config.items())), {}
    active = applicable_keys(parsed)
    known = set(TrainConfig.keys())
    params = {**{k: v for k, v in parsed.to_dict().items() if k in active}, **{k: v for k, v in config.items() if k not in known}}
    inactive = [k for k in TrainConfig.keys() if k not in active]
    return params, {ACTIVE_PARAMS_TAG: ",".join(active), INACTIVE_PARAMS_TAG: ",".join(inactive)}


def writer_lock(spool: str, wait: bool) -> IO[str] | None:
    """The spool's writer lock (an ``flock`` on ``<spool>.writer``, released when the returned file is closed);
    None when another writer holds it and ``wait`` is False."""
    os.makedirs(os.path.dirname(spool) or ".", exist_ok=True)
    fh = open(spool + ".writer", "a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        fh.close()
        return None
    return fh


class TrialRecorder:
    """Writes trial events to MLflow as child runs of a study (see the module docstring).

    A search trial's run is named ``trial-<Optuna number>-<Tune trial id>`` and logs the config keys the trial trained
    with as params (``config_params``: the others named in a tag); with the study's ``optuna_storage`` (URL) the Optuna trial gets
    the run's id as its ``mlflow_run_id`` user attribute. ``connect(tracking_uri)`` makes the MLflow client.
    """

    retry_every_s = 15.0
    poll_s = 0.2  # how soon the driver's writer sees an op that a copy of the recorder appended

    def __init__(
        self,
        tracking_uri: str,
        experiment_id: str,
        parent_run_id: str,
        study_name: str,
        spool: str,
        connect: Callable[[str], Any] = mlflow.MlflowClient,
        optuna_storage: str | None = None,
    ) -> None:
        self.tracking_uri, self.experiment_id, self.parent_run_id = tracking_uri, experiment_id, parent_run_id
        self.study_name, self.spool, self.connect, self.optuna_storage = study_name, spool, connect, optuna_storage
        self.queue = Spool(spool)
        self.offline_since: float | None = None
        self.last_attempt = 0.0
        self._fresh()

    def _fresh(self) -> None:
        """What a recorder holds in memory only: the client, what it has written, its writer thread."""
        self._client: Any = None
        self._study: optuna.Study | None = None
        self._storage: optuna.storages.BaseStorage | None = None  # the study's, opened once with it
        self.run_ids: dict[str, str] = {}
        self._runs_found = False  # run_ids holds the runs MLflow had when this connection was made (_find_runs)
        self.logged: dict[str, Logged] = {}  # trial id -> what its run holds, read from MLflow once per connection
        self.reported: dict[str, int] = {}  # trial id -> epochs trained by its last result op applied (its attempt's)
        self.ladder: set[str] = set()  # trial ids whose results log epochs_trained (a ladder of budgets)
        self._numbers: dict[str, int] = {}  # Tune trial id -> Optuna trial number, read from the study once each
        self.applied_epochs: dict[str, list[tuple[int, dict[str, float]]]] = {}  # trial id -> (time_ms, timings) it wrote
        self._indexed = 0  # the Optuna trials read into _numbers
        self._wake, self._closing = threading.Event(), threading.Event()
        self._writer: threading.Thread | None = None
        self._flushing = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in UNPICKLED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh()  # a copy (Tune's callbacks are copies) or an unpickled recorder starts with no writer of its own

    # -- the queue --------------------------------------------------------------
    def queued(self) -> int:
        """How many operations wait in the spool to be written."""
        return len(self.queue.read())

    def submit(self, op: dict[str, Any]) -> None:
        """Queue ``op``: it is in the spool file when this returns; without a running writer it is also applied (or kept)."""
        self.queue.append(op)  # a failed append queues nothing and raises
        if self._writer is not None:
            self._wake.set()
            return
        self.flush()  # the spool's writer, if one runs, applies it; else this applies every op kept, in order

    def flush(self, force: bool = False) -> bool:
        """Apply the queued operations in order; True when nothing is left queued.

        Leaves them (False) while another writer runs, or within ``retry_every_s`` of a failed try unless ``force``.
        """
        with self._flushing:
            held = writer_lock(self.spool, wait=False)
            if held is None:
                return False
            with held:
                return self._drain(force)

    def _drain(self, force: bool) -> bool:
        """Apply the spool (the caller holds the writer lock); False when MLflow failed, the rest kept.

        Ops are applied in chunks of ``CHUNK_OPS`` (``_apply_chunk``: one MLflow batch per run and chunk) and dropped
        from the spool every ``PERSIST_EVERY`` applied, so a kill replays at most these (idempotently).
        """
        if self.offline_since is not None and not force and time.time() - self.last_attempt < self.retry_every_s:
            return False
        self.last_attempt = time.time()
        while ops := self.queue.read():
            done = dropped = 0
            try:
                for start in range(0, len(ops), CHUNK_OPS):
                    self._apply_chunk(ops[start : start + CHUNK_OPS])
                    done = min(start + CHUNK_OPS, len(ops))
                    if done - dropped >= PERSIST_EVERY:
                        self.queue.drop(done - dropped)
                        dropped = done
            except Exception as error:  # MlflowException, connection errors, timeouts: all mean "not written"
                self.queue.drop(done - dropped)
                self._went_offline(error)
                return False
            self.queue.drop(done - dropped)
        self._came_back()
        return True

    # -- the driver's writer ------------------------------------------------------
    def start_writer(self) -> None:
        """From now on ``submit`` (here and in this recorder's copies) returns once the op is in the spool; a thread
        of this recorder applies it. ``close_writer`` stops it. Waits while another process writes this spool."""
        if self._writer is not None:
            return
        self._closing.clear()
        lock = writer_lock(self.spool, wait=True)  # held by the thread until it stops: copies leave their ops to it
        self._writer = threading.Thread(target=self._write_loop, args=(lock,), name="mlflow-trial-records", daemon=True)
        self._writer.start()

    def close_writer(self) -> None:
        """Stop the writer after the op it is applying; what it has not applied stays queued (``flush(force=True)`` next)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            self._closing.set()
            self._wake.set()
            writer.join()  # at most the op being applied: every MLflow call is bounded (tracking.configure_mlflow)

    def _write_loop(self, lock: IO[str]) -> None:
        with lock:
            while not self._closing.is_set():
                try:
                    written = self._drain(force=False)
                except OSError as error:  # the spool could not be rewritten (a full disk): its ops stay queued
                    log.warning("the trial records' spool %s could not be written (%s); trying again", self.spool, error)
                    written = False
                self._wake.wait(self.poll_s if written else self.retry_every_s)
                self._wake.clear()

    # -- outages ------------------------------------------------------------------
    def _went_offline(self, error: Exception) -> None:
        self._client = None
        if self.offline_since is not None:
            return
        self.offline_since = time.time()
        reason = first_error_line(str(error))
        self._event("unreachable", reason[:500])
        log.warning(
            "MLflow at %s is unreachable (%s); training goes on and records are kept in %s until it returns",
            self.tracking_uri,
            reason[:200],
            self.spool,
        )

    def _came_back(self) -> None:
        events = self.events()
        if self.offline_since is None and not (events and events[-1]["event"] == "unreachable"):
            return
        since = self.offline_since or events[-1]["time"]
        log.warning("MLflow at %s is reachable again; the kept records are written", self.tracking_uri)
        self._event("reachable again", f"after {time.time() - since:.0f} s")
        self.offline_since = None

    def _event(self, what: str, detail: str) -> None:
        """Outages are logged beside the spool (``.events``), where the study's end summary reads them."""
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
        """The MLflow client; after (re)connecting, the child runs already written are found again (their trial ids)
        when the first record needs a run (:meth:`_find_runs`)."""
        if self._client is None:
            self._client = self.connect(self.tracking_uri)
            self._runs_found = False
            self.logged.clear()  # read again, run by run, as their ops come (last_logged)
        return self._client

    def _find_runs(self) -> None:
        """The trial ids of the child runs MLflow holds, once per connection, before a record picks or creates its run.
        Not at the connection itself: an end of the study with no record to write (``study.sync`` of a study whose
        spool is empty) then searches its thousands of runs once, not twice (docs/performance.md, measurements behind the
        code)."""
        client = self.client
        if not self._runs_found:
            for run in training_runs(client, self.experiment_id, self.parent_run_id):
                trial_id = run.data.tags.get("trial_id")
                if trial_id:
                    self.run_ids[trial_id] = run.info.run_id
            self._runs_found = True

    def last_logged(self, trial_id: str) -> Logged:
        """What the run of ``trial_id`` has logged, read from MLflow once per connection: on a ladder the history of
        ``epochs_trained`` (a step it holds twice or more was retrained), else (or when it holds none) the steps of
        ``LOGGED_EVERY_EPOCH``, each an epoch trained once."""
        if trial_id not in self.logged:
            run_id = self.run_ids[trial_id]
            history = self.client.get_metric_history(run_id, TRAINED) if trial_id in self.ladder else []
            if history:
                steps = Counter(m.step for m in history)
                retrained = {step for step, n in steps.items() if n > 1}
                self.logged[trial_id] = Logged(int(max(m.value for m in history)), max(steps), frozenset(retrained))
            else:
                last = max((m.step for m in self.client.get_metric_history(run_id, LOGGED_EVERY_EPOCH)), default=0)
                self.logged[trial_id] = Logged(last, last)
        return self.logged[trial_id]

    @property
    def study(self) -> optuna.Study | None:
        """The study's Optuna study (None without an Optuna storage, or when it holds no such study)."""
        if self._study is None and self.optuna_storage:
            with contextlib.suppress(KeyError):
                storage = open_storage(self.optuna_storage)
                self._study = optuna.load_study(study_name=self.study_name, storage=storage)
                self._storage = storage
        return self._study

    def optuna_number(self, trial_id: str) -> int | None:
        """The number of the Optuna trial the searcher asked for Tune trial ``trial_id`` (None: not an Optuna trial).

        Each Optuna trial is read once: a miss reads on from the first running trial that no Tune trial had named yet
        (the searcher names a trial just after asking for it; another searcher's trials never are). An unnamed trial
        that ended never will be named (a driver killed inside the ask, its trial told FAIL on resume): it is not read
        again.
        """
        if trial_id not in self._numbers and self.study is not None:
            trials = self.study.get_trials(deepcopy=False)
            gap = None
            for trial in trials[self._indexed :]:
                named = trial.user_attrs.get("tune_trial_id")
                if named is not None:
                    self._numbers[named] = trial.number
                elif gap is None and not trial.state.is_finished():
                    gap = trial.number
            self._indexed = len(trials) if gap is None else gap
        return self._numbers.get(trial_id)

    def _link_optuna_trial(self, number: int, run_id: str) -> None:
        """The Optuna trial names its MLflow run (user attribute ``mlflow_run_id``) while it can still be changed."""
        storage = self._storage
        try:  # the storage's public interface (BaseStorage): the trial by its study and number
            trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(self.study_name), number)
            storage.set_trial_user_attr(trial_id, "mlflow_run_id", run_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # written after the trial ended (records kept during an outage): the run's optuna_trial_number links them

    def _run_id(self, trial_id: str, config: dict[str, Any] | None = None, kind: str = "trial", number: int | None = None) -> str:
        """The run of ``trial_id``, created at its first event. ``number``: the Optuna trial a confirmation run re-runs;
        for a trial run, its own when the op names it (a trial no Tune trial was named for), else ``optuna_number``."""
        self._find_runs()
        client = self.client
        if trial_id not in self.run_ids:
            if kind == "trial" and number is None:
                number = self.optuna_number(trial_id)
            tags = {"mlflow.parentRunId": self.parent_run_id, "kind": kind, "trial_id": trial_id, "study_name": self.study_name}
            if number is not None:
                tags["optuna_trial_number" if kind == "trial" else "confirms_optuna_trial"] = str(number)
            name = run_name(kind, trial_id, number)
            params, named = config_params(config) if config else ({}, {})
            run = client.create_run(self.experiment_id, tags={**tags, **named, "mlflow.runName": name}, run_name=name)
            if params:
                client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
            if number is not None and kind == "trial":
                self._link_optuna_trial(number, run.info.run_id)
            self.run_ids[trial_id] = run.info.run_id
            self.logged[trial_id] = Logged()
        return self.run_ids[trial_id]

    def _apply_chunk(self, ops: list[dict[str, Any]]) -> None:
        """Apply ``ops`` in order, each run's epochs and tags gathered into one log_batch (written before the run ends)."""
        batches: dict[str, RunBatch] = {}
        for op in ops:
            trial_id = op["trial_id"]
            kind = op.get("kind", "trial")
            run_id = self._run_id(trial_id, op.get("config"), kind, op.get("confirms" if kind != "trial" else "optuna_number"))
            if op["op"] == "result":
                trained = int(op.get("trained", op["step"]))  # a spool written before ops said it: the step
                if TRAINED in op["metrics"]:
                    self.ladder.add(trial_id)
                batch = batches.setdefault(trial_id, RunBatch(run_id, self.last_logged(trial_id)))
                batch.add(int(op["step"]), trained, op["metrics"], int(op["time_ms"]), op["tags"])
                self.reported[trial_id] = trained
            elif op["op"] in ("complete", "error"):
                batch = (batches.pop(trial_id, None) or RunBatch(run_id, self.last_logged(trial_id))).with_tags(op["tags"])
                reported = self.reported.get(trial_id)
                if reported is not None and batch.logged.trained > reported:  # epochs the last attempt did not reach
                    batch.tags[LOST_EPOCHS_TAG] = f"{reported + 1}-{batch.logged.trained}"
                self._write(trial_id, batch)
                self.client.set_terminated(run_id, status="FINISHED" if op["op"] == "complete" else "FAILED")
        for trial_id, batch in batches.items():
            self._write(trial_id, batch)

    def _write(self, trial_id: str, batch: RunBatch) -> None:
        """One run's gathered epochs and tags, in log_batch calls within MLflow's limits; they then count as logged."""
        metrics, tags = batch.metrics, [RunTag(k, v) for k, v in batch.tags.items()]
        for i in range(max(math.ceil(len(metrics) / MAX_METRICS), math.ceil(len(tags) / MAX_TAGS))):
            part = metrics[i * MAX_METRICS : (i + 1) * MAX_METRICS]
            self.client.log_batch(batch.run_id, metrics=part, tags=tags[i * MAX_TAGS : (i + 1) * MAX_TAGS])
        self.logged[trial_id] = batch.logged
        self.applied_epochs.setdefault(trial_id, []).extend(batch.epochs)


def epoch_ranges(steps: frozenset[int]) -> str:
    """Steps as ranges: {2} -> "2", {3, 4} -> "3-4", {2, 7, 8} -> "2,7-8"."""
    runs = [[s for _, s in group] for _, group in groupby(enumerate(sorted(steps)), key=lambda i_s: i_s[1] - i_s[0])]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


@dataclass(frozen=True)
class Logged:
    """What a trial's run holds: ``trained`` epochs (the last op's ``epochs_trained``), its main curves up to ``step``,
    and the steps it holds a retrained epoch at."""

    trained: int = 0
    step: int = 0
    retrained: frozenset[int] = frozenset()


@dataclass
class RunBatch:
    """What a chunk of ops writes to one run: the epochs trained after ``logged``, as MLflow metrics, and tags."""

    run_id: str
    logged: Logged
    metrics: list[Metric] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    epochs: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (time_ms, the epoch's timings) of each new epoch

    def add(self, step: int, trained: int, metrics: dict[str, float], time_ms: int, tags: dict[str, str]) -> None:
        """An epoch's report, at ``step`` (the epoch of its schedule) after ``trained`` epochs: its metrics unless that
        many are logged already (a retried epoch), under ``retrained/`` when the run's curves have that step (the
        tail of a rung trained again by the next budget), and its tags always (where the trial runs, where it resumed
        from)."""
        self.tags.update(tags)
        if trained <= self.logged.trained:
            return
        logged, names = self.logged, {k: k for k in metrics}
        if step <= logged.step:
            retrained = logged.retrained | {step}
            names = {k: k if k == TRAINED else RETRAINED + k for k in metrics}
            self.tags[RETRAINED_TAG] = epoch_ranges(retrained)
            self.logged = Logged(trained, logged.step, retrained)
        else:
            self.logged = Logged(trained, step, logged.retrained)
        self.metrics += [Metric(names[k], float(v), time_ms, step) for k, v in metrics.items()]
        self.epochs.append((time_ms, epoch_times(metrics)))

    def with_tags(self, tags: dict[str, str]) -> RunBatch:
        self.tags.update(tags)
        return self

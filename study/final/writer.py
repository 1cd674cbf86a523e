"""study.final's MLflow writes, kept through an outage of the tracking server: the training never waits on MLflow.

A seed run's creation and its epochs are operations appended to the final's spool file (``study.lines.Spool``,
``runs/spool/<its process lock's name>.jsonl``) before anything else; a thread of the driver applies them in
order and drops what it applied. While the server is away they stay there and the seeds train on; the thread tries
again every ``retry_every_s``. What needs the run itself (its pictures, its model, its end) waits for the server in
``patiently``: each write is tried again once the server answers its health check, and a signal stops the wait.

Applying is idempotent: a run is found by its name and its writer's lock (tag ``owner_lock``) before one is created,
and an epoch's metrics carry the time they were measured, so one applied twice is the same point (MLflow keeps a
metric once per key, step, time and value). A ``study.final`` killed during an outage leaves its spool and its lock
file; the next one on the host (``replay_abandoned``) writes what the spool kept before it marks the runs KILLED.

Imports no torch and no Ray.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import mlflow
from mlflow.entities import Metric, Param

from study.inputs import UsageError, redacted
from study.interrupts import env_set, interruptible
from study.lines import Spool
from study.records import locks, tracking
from study.records.parent import mark_stopped
from study.records.tracking import first_error_line

log = logging.getLogger(__name__)
T = TypeVar("T")


def spool_of(lock: Path) -> Path:
    """The spool of the study.final holding ``lock`` (``runs/locks/final-PID-X.lock``): ``runs/spool/final-PID-X.jsonl``."""
    return lock.parent.parent / "spool" / f"{lock.stem}.jsonl"


def reachable(uri: str) -> bool:
    """Whether the tracking server at ``uri`` answers its health check (a local store always does)."""
    try:
        tracking.check_reachable(uri)
    except UsageError:
        return False
    return True


class FinalWriter:
    """The spooled writes of one study.final (see the module docstring); ``say`` prints a line for the user."""

    retry_every_s = 15.0

    def __init__(self, uri: str, spool: Path, owner_lock: str, say: Callable[[str], None] = print) -> None:
        self.uri, self.owner_lock, self.say = uri, owner_lock, say
        self.queue = Spool(str(spool))
        self.client = mlflow.MlflowClient(uri)
        self.run_ids: dict[str, str] = {}  # a run's key (its name) -> its id, once created
        self.away_since: float | None = None
        self._wake, self._closing, self._applied = threading.Event(), threading.Event(), threading.Condition()
        self._thread: threading.Thread | None = None

    # -- the spooled operations ---------------------------------------------------
    def create_run(self, experiment_id: str, name: str, tags: dict[str, str], params: dict[str, Any]) -> None:
        """Queue the creation of child run ``name`` (its key; unique within one study.final) with ``tags`` and ``params``."""
        self._submit(
            {"op": "create", "key": name, "experiment_id": experiment_id, "tags": tags, "params": {k: str(v) for k, v in params.items()}}
        )

    def log_epoch(self, name: str, step: int, metrics: dict[str, float]) -> None:
        """Queue an epoch's metrics of run ``name``, stamped now."""
        self._submit({"op": "epoch", "key": name, "step": step, "time_ms": int(time.time() * 1000), "metrics": metrics})

    def _submit(self, op: dict[str, Any]) -> None:
        self.queue.append(op)
        if self._thread is None:
            self.drain()
        else:
            self._wake.set()

    def drain(self) -> bool:
        """Apply the queued operations in order; True when none is left (False: MLflow failed, the rest kept)."""
        while ops := self.queue.read():
            done = 0
            try:
                for op in ops:
                    self._apply(op)
                    done += 1
            except Exception as error:  # connection errors, timeouts, a server's 5xx: all mean "not written yet"
                self.queue.drop(done)
                self._went_away(error)
                return False
            self.queue.drop(done)
        self._came_back()
        with self._applied:
            self._applied.notify_all()
        return True

    def _apply(self, op: dict[str, Any]) -> None:
        key = op["key"]
        if op["op"] == "create":
            if self.find_run(key) is None:
                tags = {**op["tags"], "owner_lock": self.owner_lock, "mlflow.runName": key}
                run_id = self.client.create_run(op["experiment_id"], run_name=key, tags=tags).info.run_id
                self.client.log_batch(run_id, params=[Param(k, v) for k, v in op["params"].items()])
                self.run_ids[key] = run_id
        elif op["op"] == "epoch":
            metrics = [Metric(k, float(v), int(op["time_ms"]), int(op["step"])) for k, v in op["metrics"].items()]
            self.client.log_batch(self.find_run(key), metrics=metrics)

    def find_run(self, key: str) -> str | None:
        """The id of run ``key`` written by this study.final's lock, if MLflow has it."""
        if key not in self.run_ids:
            found = tracking.all_pages(
                self.client.search_runs,
                experiment_ids=[e.experiment_id for e in self.client.search_experiments()],
                filter_string=tracking.run_filter({"tags.owner_lock": self.owner_lock, "attributes.run_name": key}),
            )
            if found:
                self.run_ids[key] = found[0].info.run_id
        return self.run_ids.get(key)

    # -- the thread ------------------------------------------------------------------
    def start(self) -> None:
        """From now on the operations are applied by a thread: queuing one never waits on MLflow."""
        self._closing.clear()
        self._thread = threading.Thread(target=self._loop, name="mlflow-final-records", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread after the write it is making (every MLflow call is bounded: tracking.configure_mlflow); an
        empty spool's lock file goes."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._closing.set()
            self._wake.set()
            thread.join()
        if not self.queue.read():
            Path(self.queue.path + ".lock").unlink(missing_ok=True)

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                written = self.drain()
            except OSError as error:  # the spool could not be rewritten (a full disk): its ops stay queued
                log.warning("study.final's spool %s could not be written (%s); trying again", self.queue.path, error)
                written = False
            self._wake.wait(None if written else self.retry_every_s)
            self._wake.clear()

    # -- waiting for the server ------------------------------------------------------
    def run_id(self, name: str) -> str:
        """The id of run ``name``, once the operations queued before are written (waits while MLflow is away)."""
        self.written()
        return self.run_ids[name]

    def written(self) -> None:
        """Returns once every queued operation is written; while MLflow is away it waits (a signal stops it)."""
        with interruptible():
            while self.queue.read():
                if self._thread is None:
                    if not self.drain():
                        self._wait_for_server()
                    continue
                with self._applied:
                    self._applied.wait(1.0)  # the thread tries again every retry_every_s

    def patiently(self, write: Callable[[int], T], what: str) -> T:
        """``write(attempt)``, tried again (attempt 1, 2, ...) while the tracking server does not answer: an error while
        it answers is the write's own and raises (after one more try: it may have come back just then). ``what``
        names the write in the line that says the command waits."""
        attempt, tried_while_up = 0, False
        while True:
            try:
                result = write(attempt)
            except Exception as error:
                if not reachable(self.uri):
                    self._went_away(error, waiting_for=what)
                    with interruptible():
                        self._wait_for_server()
                    tried_while_up = False
                elif tried_while_up:
                    raise
                else:
                    tried_while_up = True
                attempt += 1
                continue
            self._came_back()
            return result

    def leave_run(self, status: str, reason: str | None = None) -> bool:
        """The active (fluent) run ends ``status``, with ``failure_reason`` when given, if the server answers (True);
        else it is only left, RUNNING (False): an error or a signal stops the command, and the next study.final ends it
        (KILLED), or the caller writes its end once the server answers."""
        if reachable(self.uri):
            with contextlib.suppress(Exception):
                if reason:
                    mlflow.set_tag("failure_reason", reason)
                mlflow.end_run(status=status)
                return True
        # end_run takes the run off MLflow's stack before its write, which fails at once here: nothing is left for
        # MLflow's own end at exit to wait on
        with env_set("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"), env_set("MLFLOW_HTTP_REQUEST_TIMEOUT", "1"), contextlib.suppress(Exception):
            mlflow.end_run(status=status)
        return False

    def _wait_for_server(self) -> None:
        while not reachable(self.uri):
            time.sleep(self.retry_every_s)

    def _went_away(self, error: Exception, waiting_for: str | None = None) -> None:
        if self.away_since is not None:
            return
        self.away_since = time.time()
        doing = f"{waiting_for} waits for it" if waiting_for else "training goes on"
        self.say(
            f"MLflow at {redacted(self.uri)} does not answer ({first_error_line(str(error))[:200]}); {doing}, and the "
            f"records wait in {self.queue.path} (Ctrl-C stops the command: the next study.final writes them and ends its runs KILLED)"
        )

    def _came_back(self) -> None:
        if self.away_since is None:
            return
        self.say(f"MLflow at {redacted(self.uri)} answers again after {time.time() - self.away_since:.0f} s; the kept records are written")
        self.away_since = None


def replay_abandoned(uri: str, runs_locks: Path) -> None:
    """Write what the spools of killed study.finals on this host kept (their lock no longer held), before their runs
    are ended KILLED; the spools go once written (one MLflow still cannot take stays, for the next try)."""
    for spool in sorted((runs_locks.parent / "spool").glob("final-*.jsonl")):
        lock = runs_locks / f"{spool.stem}.lock"
        if locks.abandoned(lock) is None:
            continue  # its study.final runs (or left no lock: nothing to tell)
        writer = FinalWriter(uri, spool, str(lock), say=lambda line: None)
        writer.drain()
        writer.close()


def stop_runs(client, writer: FinalWriter, opened: list[str], parent_id: str | None, error: BaseException) -> bool:
    """The child runs named ``opened``, and the parent ``parent_id`` (a final's own), marked stopped by ``error``
    (``mark_stopped``), once what the writer kept is written; False when the server does not answer (nothing marked)."""
    if not reachable(writer.uri):
        return False  # its thread is left to the process's end: it may wait on a server that stalls
    writer.close()
    try:
        writer.drain()
        ids = [writer.run_ids[name] for name in opened if name in writer.run_ids]
        mark_stopped(client, ids, parent_id, error, in_study=False)
    except Exception:  # the server went away while the runs were marked
        return False
    return True


def close_abandoned(client, experiment_id: str) -> None:
    """Runs an earlier ``study.final`` on this host left RUNNING when it was killed (SIGKILL, the machine stopped: no
    handler ran) or stopped while MLflow was away end KILLED, with its holder line as the reason: their owner lock
    (``locks.abandoned``) is no longer held. What such a final's spool kept is written first (``replay_abandoned``).
    Runs of a live ``study.final``, or of another host, are left alone. Says how many it closed."""
    replay_abandoned(client.tracking_uri, tracking.runs_dir() / "locks")
    running = tracking.all_pages(
        client.search_runs,
        experiment_ids=[experiment_id],
        filter_string=tracking.run_filter({"attributes.status": "RUNNING", "tags.owner_host": socket.gethostname()}),
    )
    by_lock: dict[str, list] = {}  # a study.final's runs (its parent and seeds) share its lock: each lock read once
    for run in running:
        by_lock.setdefault(run.data.tags.get("owner_lock", ""), []).append(run)
    closed = []
    for lock, runs in by_lock.items():
        holder = locks.abandoned(lock)
        if holder is None:
            continue
        reason = f"orphaned: the study.final that trained it ({holder}) ended without closing it (killed, or its machine stopped)"
        tracking.fail_orphans(client, [run.info.run_id for run in runs], reason, status="KILLED")
        closed += [run.info.run_name for run in runs]
        Path(lock).unlink(missing_ok=True)  # its runs are closed
    if closed:
        print(f"marked KILLED {len(closed)} run(s) an earlier study.final left RUNNING when it was killed: {', '.join(sorted(closed))}")

"""Ray Tune callbacks of a study: MLflow child runs per trial and live terminal progress.

The driver writes to MLflow (workers never do): one child run per Tune trial
under the study's parent run, with the trial's params, every epoch's metrics
(step = epoch), its node and device, whether ASHA stopped it, and a final
status (FINISHED, or FAILED with the reason). A resumed study reattaches to
the child runs it already has (found by the ``trial_id`` tag) and never logs
an epoch twice. While MLflow is unreachable the records wait in a local spool
file and are written when it returns; nothing is dropped.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from ray.tune import Callback

from study.tracking import child_runs, first_error_line

STRING_KEYS = ("node", "node_ip", "node_id", "device")
SKIP_KEYS = {
    "training_iteration",
    "timestamp",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "hostname",
    "date",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "done",
    "trial_id",
    "config",
}


class TrialRecorder:
    """Writes trial events to MLflow as child runs of a study, keeping them locally while MLflow is away.

    Every event is an operation ({"op": "start" | "result" | "complete" | "error", "trial_id": ...}) applied
    in order. When MLflow cannot be reached, operations queue up in a spool file (JSON lines, one per
    study) and are applied when it returns, by the next event, at the end of the study, by a resumed
    study or by ``python -m study.sync``. Applying is idempotent: a run is found by its trial_id tag before
    one is created, and an epoch already logged is skipped.
    """

    retry_every_s = 15.0

    def __init__(self, tracking_uri: str, experiment_id: str, parent_run_id: str, study_name: str, max_epochs: int, spool: str) -> None:
        self.tracking_uri, self.experiment_id, self.parent_run_id = tracking_uri, experiment_id, parent_run_id
        self.study_name, self.max_epochs, self.spool = study_name, max_epochs, spool
        self._client: mlflow.MlflowClient | None = None
        self.run_ids: dict[str, str] = {}
        self.logged_step: dict[str, int] = {}
        self.pending: list[dict[str, Any]] | None = None
        self.offline_since: float | None = None
        self.last_attempt = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "pending": None, "run_ids": {}, "logged_step": {}}

    # -- the queue --------------------------------------------------------------
    def _load(self) -> list[dict[str, Any]]:
        if self.pending is None:
            self.pending = []
            if os.path.exists(self.spool):
                with open(self.spool) as f:
                    self.pending = [json.loads(line) for line in f if line.strip()]
        return self.pending

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

    def submit(self, op: dict[str, Any]) -> None:
        self._load().append(op)
        self.flush()

    def flush(self, force: bool = False) -> bool:
        """Apply queued operations in order; True when nothing is left queued."""
        pending = self._load()
        if self.offline_since is not None and not force and time.time() - self.last_attempt < self.retry_every_s:
            self._persist()
            return False
        self.last_attempt = time.time()
        while pending:
            try:
                self._apply(pending[0])
            except Exception as error:  # MlflowException, connection errors, timeouts: all mean "not written"
                if self.offline_since is None:
                    self.offline_since = time.time()
                    self._event("unreachable", first_error_line(str(error))[:500])
                    print(
                        f"warning: MLflow at {self.tracking_uri} is unreachable ({first_error_line(str(error))[:200]}); "
                        f"training goes on and records are kept in {self.spool} until it returns",
                        flush=True,
                    )
                self._client = None
                self._persist()
                return False
            pending.pop(0)
        events = self.events()
        if self.offline_since is not None or (events and events[-1]["event"] == "unreachable"):
            since = self.offline_since or events[-1]["time"]
            print(f"MLflow at {self.tracking_uri} is reachable again; the kept records are written", flush=True)
            self._event("reachable again", f"after {time.time() - since:.0f} s")
            self.offline_since = None
        self._persist()
        return True

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
    def client(self) -> mlflow.MlflowClient:
        if self._client is None:
            client = mlflow.MlflowClient(self.tracking_uri)
            for run in child_runs(client, self.experiment_id, self.parent_run_id):
                trial_id = run.data.tags.get("trial_id")
                if trial_id:
                    self.run_ids[trial_id] = run.info.run_id
                    steps = [m.step for m in client.get_metric_history(run.info.run_id, "epoch")]
                    self.logged_step[trial_id] = max(steps, default=0)
            self._client = client
        return self._client

    def _run_id(self, trial_id: str, config: dict[str, Any] | None = None) -> str:
        client = self.client
        if trial_id not in self.run_ids:
            name = f"trial-{trial_id}"
            tags = {
                "mlflow.parentRunId": self.parent_run_id,
                "mlflow.runName": name,
                "kind": "trial",
                "trial_id": trial_id,
                "study_name": self.study_name,
            }
            run = client.create_run(self.experiment_id, tags=tags, run_name=name)
            if config:
                client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(config.items())])
            self.run_ids[trial_id] = run.info.run_id
            self.logged_step[trial_id] = 0
        return self.run_ids[trial_id]

    def _apply(self, op: dict[str, Any]) -> None:
        trial_id = op["trial_id"]
        run_id = self._run_id(trial_id, op.get("config"))
        client = self.client
        if op["op"] == "result":
            step = int(op["step"])
            if step <= self.logged_step.get(trial_id, 0):
                return  # already recorded before a restart: never a duplicated step
            metrics = [Metric(k, float(v), int(op["time_ms"]), step) for k, v in op["metrics"].items()]
            client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in op["tags"].items()])
            self.logged_step[trial_id] = step
        elif op["op"] in ("complete", "error"):
            for key, value in op["tags"].items():
                client.set_tag(run_id, key, value)
            client.set_terminated(run_id, status="FINISHED" if op["op"] == "complete" else "FAILED")


def trial_error_text(trial) -> str | None:
    """The trial's error: Tune writes it to the trial's local folder first and syncs it to storage later."""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path) as f:
            return f.read()
    return trial.get_error() if hasattr(trial, "get_error") else None


class MlflowTrials(Callback):
    """One MLflow child run per trial (see TrialRecorder); the driver is the only writer."""

    def __init__(self, recorder: TrialRecorder) -> None:
        self.recorder = recorder

    def on_trial_start(self, iteration, trials, trial, **info):
        self.recorder.submit({"op": "start", "trial_id": trial.trial_id, "config": dict(trial.config)})

    def on_trial_result(self, iteration, trials, trial, result, **info):
        metrics = {
            k: float(v)
            for k, v in result.items()
            if k not in SKIP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        tags = {k: str(result[k]) for k in STRING_KEYS if k in result}
        op = {
            "op": "result",
            "trial_id": trial.trial_id,
            "step": int(result.get("training_iteration", 0)),
            "metrics": metrics,
            "tags": tags,
            "time_ms": int(time.time() * 1000),
            "config": dict(trial.config),
        }
        self.recorder.submit(op)

    def on_trial_complete(self, iteration, trials, trial, **info):
        epochs = int((trial.last_result or {}).get("training_iteration", 0))
        stopped = epochs < self.recorder.max_epochs
        tags = {"stopped_by_asha": str(stopped).lower(), "trial_state": "PRUNED" if stopped else "COMPLETE"}
        self.recorder.submit({"op": "complete", "trial_id": trial.trial_id, "tags": tags, "config": dict(trial.config)})

    def on_trial_error(self, iteration, trials, trial, **info):
        reason = first_error_line(trial_error_text(trial))
        tags = {"failure_reason": reason, "trial_state": "FAIL", "stopped_by_asha": "false"}
        self.recorder.submit({"op": "error", "trial_id": trial.trial_id, "tags": tags, "config": dict(trial.config)})

    def on_experiment_end(self, trials, **info):
        self.recorder.flush(force=True)


class Progress(Callback):
    """One terminal line whenever a trial reports or ends: states and the best so far."""

    def __init__(self, metric: str, mode: str, max_epochs: int, num_samples: int) -> None:
        self.metric, self.mode, self.max_epochs, self.num_samples = metric, mode, max_epochs, num_samples
        self.started = time.time()
        self.last_line = 0.0

    def _line(self, trials, event: str, force: bool = False) -> None:
        if not force and time.time() - self.last_line < 10:
            return
        self.last_line = time.time()
        counts = {"running": 0, "complete": 0, "pruned": 0, "failed": 0, "pending": 0}
        best = None
        for t in trials:
            epochs = int((t.last_result or {}).get("training_iteration", 0))
            if t.status == "RUNNING":
                counts["running"] += 1
            elif t.status == "ERROR":
                counts["failed"] += 1
            elif t.status == "TERMINATED":
                counts["complete" if epochs >= self.max_epochs else "pruned"] += 1
                value = (t.last_result or {}).get(self.metric)
                if epochs >= self.max_epochs and isinstance(value, (int, float)) and math.isfinite(value):
                    if best is None or (value > best[0] if self.mode == "max" else value < best[0]):
                        best = (value, t.trial_id)
            else:
                counts["pending"] += 1
        best_text = f"best {self.metric} {best[0]:.4f} ({best[1]})" if best else "best: none complete yet"
        elapsed = time.time() - self.started
        print(
            f"[{elapsed:6.0f} s] {len(trials)}/{self.num_samples} trials: {counts['running']} running, "
            f"{counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed | {best_text} | {event}",
            flush=True,
        )

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._line(
            trials, f"{trial.trial_id} epoch {result.get('training_iteration')}: {self.metric} {result.get(self.metric, float('nan')):.4f}"
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        epochs = int((trial.last_result or {}).get("training_iteration", 0))
        self._line(
            trials, f"{trial.trial_id} {'complete' if epochs >= self.max_epochs else f'pruned by ASHA at epoch {epochs}'}", force=True
        )

    def on_trial_error(self, iteration, trials, trial, **info):
        self._line(trials, f"{trial.trial_id} failed", force=True)

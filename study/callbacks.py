"""Ray Tune callbacks of a study: MLflow child runs per trial and live terminal progress.

The driver writes to MLflow (workers never do): one child run per Tune trial
under the study's parent run, with the trial's params, every epoch's metrics
(step = epoch), its node and device, whether ASHA stopped it, and a final
status (FINISHED, or FAILED with the reason). A resumed study reattaches to
the child runs it already has (found by the ``trial_id`` tag) and never logs
an epoch twice.
"""

from __future__ import annotations

import math
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


class MlflowTrials(Callback):
    """One MLflow child run per trial; see the module docstring."""

    def __init__(
        self, tracking_uri: str, experiment_id: str, parent_run_id: str, study_name: str, max_epochs: int, optuna_numbers: Any = None
    ) -> None:
        self.tracking_uri, self.experiment_id, self.parent_run_id = tracking_uri, experiment_id, parent_run_id
        self.study_name, self.max_epochs = study_name, max_epochs
        self.optuna_numbers = optuna_numbers  # callable trial_id -> Optuna trial number, or None
        self._client: mlflow.MlflowClient | None = None
        self.run_ids: dict[str, str] = {}
        self.logged_step: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> mlflow.MlflowClient:
        if self._client is None:
            self._client = mlflow.MlflowClient(self.tracking_uri)
            for run in child_runs(self._client, self.experiment_id, self.parent_run_id):
                trial_id = run.data.tags.get("trial_id")
                if trial_id:
                    self.run_ids[trial_id] = run.info.run_id
                    steps = [m.step for key in ("epoch",) for m in self._client.get_metric_history(run.info.run_id, key)]
                    self.logged_step[trial_id] = max(steps, default=0)
        return self._client

    def run_id(self, trial) -> str:
        client = self.client
        if trial.trial_id not in self.run_ids:
            tags = {
                "mlflow.parentRunId": self.parent_run_id,
                "mlflow.runName": f"trial-{trial.trial_id}",
                "kind": "trial",
                "trial_id": trial.trial_id,
                "study_name": self.study_name,
            }
            number = self.optuna_numbers(trial.trial_id) if self.optuna_numbers else None
            if number is not None:
                tags["optuna_trial_number"] = str(number)
            run = client.create_run(self.experiment_id, tags=tags, run_name=f"trial-{trial.trial_id}")
            params = [Param(k, str(v)[:6000]) for k, v in sorted(trial.config.items())]
            client.log_batch(run.info.run_id, params=params)
            self.run_ids[trial.trial_id] = run.info.run_id
            self.logged_step[trial.trial_id] = 0
        return self.run_ids[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.run_id(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self.run_id(trial)
        step = int(result.get("training_iteration", 0))
        if step <= self.logged_step.get(trial.trial_id, 0):
            return  # already recorded before a restart: never a duplicated step
        now = int(time.time() * 1000)
        metrics = [
            Metric(k, float(v), now, step)
            for k, v in result.items()
            if k not in SKIP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ]
        tags = [RunTag(k, str(result[k])) for k in STRING_KEYS if k in result]
        self.client.log_batch(run_id, metrics=metrics, tags=tags)
        self.logged_step[trial.trial_id] = step

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self.run_id(trial)
        epochs = int((trial.last_result or {}).get("training_iteration", 0))
        stopped = epochs < self.max_epochs
        self.client.set_tag(run_id, "stopped_by_asha", str(stopped).lower())
        self.client.set_tag(run_id, "trial_state", "PRUNED" if stopped else "COMPLETE")
        self.client.set_terminated(run_id, status="FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self.run_id(trial)
        reason = first_error_line(trial.get_error() if hasattr(trial, "get_error") else None)
        self.client.set_tag(run_id, "failure_reason", reason)
        self.client.set_tag(run_id, "trial_state", "FAIL")
        self.client.set_tag(run_id, "stopped_by_asha", "false")
        self.client.set_terminated(run_id, status="FAILED")


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

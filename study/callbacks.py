"""Ray Tune callbacks of a study: MLflow child runs per trial and live terminal progress.

The driver writes to MLflow (workers never do): one child run per Tune trial
under the study's parent run, with the trial's params, every epoch's metrics
(step = epoch), its node and device, how it ended (``trial_state``, from
``study.outcome.trial_outcome``) and a final status (FINISHED, or FAILED with
the reason). How the records reach MLflow, and wait while it is away, is
``study.records.TrialRecorder``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ray.tune import Callback

from study.outcome import COMPLETE, FAIL, PRUNED, epochs_done, is_finite_number, trial_outcome
from study.records import TrialRecorder
from study.tracking import first_error_line

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


def trial_error_text(trial) -> str | None:
    """The trial's error: Tune writes it to the trial's local folder first and syncs it to storage later."""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path) as f:
            return f.read()
    return trial.get_error() if hasattr(trial, "get_error") else None


def result_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of a Tune result, without Tune's bookkeeping."""
    return {k: float(v) for k, v in result.items() if k not in SKIP_KEYS and is_finite_number(v)}


class MlflowTrials(Callback):
    """One MLflow child run per trial (see TrialRecorder); the driver is the only writer."""

    def __init__(self, recorder: TrialRecorder, metric: str, max_epochs: int, kind: str = "trial") -> None:
        self.recorder, self.metric, self.max_epochs, self.kind = recorder, metric, max_epochs, kind

    def submit(self, op: dict[str, Any]) -> None:
        self.recorder.submit({**op, "kind": self.kind})

    def on_trial_start(self, iteration, trials, trial, **info):
        self.submit({"op": "start", "trial_id": trial.trial_id, "config": dict(trial.config)})

    def on_trial_result(self, iteration, trials, trial, result, **info):
        op = {
            "op": "result",
            "trial_id": trial.trial_id,
            "step": int(result.get("training_iteration", 0)),
            "metrics": result_metrics(result),
            "tags": {k: str(result[k]) for k in STRING_KEYS if k in result},
            "time_ms": int(time.time() * 1000),
            "config": dict(trial.config),
        }
        self.submit(op)

    def on_trial_complete(self, iteration, trials, trial, **info):
        state = trial_outcome(trial.last_result, error=False, metric=self.metric, max_epochs=self.max_epochs)
        tags = {"stopped_by_asha": str(state == PRUNED).lower(), "trial_state": state}
        self.submit({"op": "complete", "trial_id": trial.trial_id, "tags": tags, "config": dict(trial.config)})

    def on_trial_error(self, iteration, trials, trial, **info):
        reason = first_error_line(trial_error_text(trial))
        tags = {"failure_reason": reason, "trial_state": FAIL, "stopped_by_asha": "false"}
        self.submit({"op": "error", "trial_id": trial.trial_id, "tags": tags, "config": dict(trial.config)})

    def on_experiment_end(self, trials, **info):
        self.recorder.flush(force=True)


class Progress(Callback):
    """One terminal line whenever a trial reports or ends: states and the best so far."""

    def __init__(self, metric: str, mode: str, max_epochs: int, num_samples: int) -> None:
        self.metric, self.mode, self.max_epochs, self.num_samples = metric, mode, max_epochs, num_samples
        self.started = time.time()
        self.last_line = 0.0

    def _outcome(self, trial) -> str:
        return trial_outcome(trial.last_result, error=trial.status == "ERROR", metric=self.metric, max_epochs=self.max_epochs)

    def _line(self, trials, event: str, force: bool = False) -> None:
        if not force and time.time() - self.last_line < 10:
            return
        self.last_line = time.time()
        counts = {"running": 0, COMPLETE: 0, PRUNED: 0, FAIL: 0, "pending": 0}
        best = None
        for t in trials:
            if t.status in ("TERMINATED", "ERROR"):
                state = self._outcome(t)
                counts[state] += 1
                value = (t.last_result or {}).get(self.metric)
                if state == COMPLETE and (best is None or (value > best[0] if self.mode == "max" else value < best[0])):
                    best = (value, t.trial_id)
            else:
                counts["running" if t.status == "RUNNING" else "pending"] += 1
        best_text = f"best {self.metric} {best[0]:.4f} ({best[1]})" if best else "best: none complete yet"
        print(
            f"[{time.time() - self.started:6.0f} s] {len(trials)}/{self.num_samples} trials: {counts['running']} running, "
            f"{counts[COMPLETE]} complete, {counts[PRUNED]} pruned, {counts[FAIL]} failed | {best_text} | {event}",
            flush=True,
        )

    def on_trial_result(self, iteration, trials, trial, result, **info):
        where = f"epoch {result.get('training_iteration')}"
        if "budget" in result:  # a ladder of budgets: the epoch within the schedule of that budget
            where = f"epoch {result.get('epoch')}/{result['budget']}"
        self._line(trials, f"{trial.trial_id} {where}: {self.metric} {result.get(self.metric, float('nan')):.4f}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        state = self._outcome(trial)
        what = {COMPLETE: "complete", PRUNED: f"pruned at rung {epochs_done(trial.last_result)}", FAIL: "failed"}[state]
        self._line(trials, f"{trial.trial_id} {what}", force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._line(trials, f"{trial.trial_id} failed", force=True)

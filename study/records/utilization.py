"""Study utilization: the share of a study's slot-seconds its trials spent training and evaluating.

    utilization = in-trial seconds / (wall seconds x concurrent slots)

- **in-trial seconds**: over every epoch every trial reported, the seconds the trial spent
  training and evaluating that epoch, measured inside the trial (``time_epoch_s``, which
  ``trainables.core.engine.fit`` takes around the epoch's training and its evaluation).
- **wall seconds**: the study's wall time after Ray has started (from ``Tuner.fit()`` on).
- **slots**: trials that can run at once: ``--max-concurrent``, capped by the CPUs (and GPUs)
  of the cluster divided by what one trial reserves.
- **start-up**: Ray's one-time start (``ray.init``, opening the study), reported apart and not
  part of the wall seconds, so that a study's figure does not depend on its length through it.

What a slot spends outside its trials' epochs is overhead: a new worker and its imports, the
dataset decoded for the trial, the model built, checkpoints written, scheduling gaps. The
functions here are pure (numbers in, numbers out); the ``*_from_*`` readers take the records a
study already keeps: MLflow child runs, the Optuna study.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The per-epoch timings a trial reports, under each spelling a trainable may use: the first
# is engine.fit's ``time_*_s``, then the ``time/...`` namespace. Canonical name -> spellings.
TIME_KEYS: dict[str, tuple[str, ...]] = {
    "epoch_s": ("time_epoch_s", "time/epoch_s", "time/epoch"),
    "train_s": ("time_train_s", "time/train_s", "time/train"),
    "eval_s": ("time_eval_s", "time/eval_s", "time/eval"),
    "data_s": ("time_data_s", "time/data_s", "time/data"),
    "compute_s": ("time_compute_s", "time/compute_s", "time/compute"),
}
# every spelling, and the canonical name itself (what the readers below return), -> the canonical name
SPELLINGS: dict[str, str] = {spelling: name for name, spellings in TIME_KEYS.items() for spelling in (name, *spellings)}
# the prefix of a retrained epoch's metrics (a rung's tail trained again by the next budget: study.records.trials)
RETRAINED = "retrained/"

TRIAL_KINDS = ("trial", "confirmation")  # the child runs of a study's parent run that train


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def epoch_times(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The timings of one reported epoch under their canonical names (``epoch_s``, ``train_s``, ...).

    Any spelling of TIME_KEYS is read (and the canonical names, so the readers' output reads
    back unchanged); missing or non-finite values are left out.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name, seconds = SPELLINGS.get(key), _finite(value)
        if name is not None and seconds is not None:
            out.setdefault(name, seconds)
    return out


def epoch_seconds(metrics: Mapping[str, Any]) -> float:
    """Seconds one reported epoch spent training and evaluating: ``epoch_s``, else ``train_s + eval_s``, else 0."""
    times = epoch_times(metrics)
    if "epoch_s" in times:
        return times["epoch_s"]
    return times.get("train_s", 0.0) + times.get("eval_s", 0.0)


def in_trial_seconds(epochs: Iterable[Mapping[str, Any]]) -> float:
    """Sum of :func:`epoch_seconds` over one trial's reported epochs (a retried epoch counts each time it ran)."""
    return sum(epoch_seconds(metrics) for metrics in epochs)


def concurrent_slots(
    max_concurrent: int,
    cpus: float | None = None,
    cpus_per_trial: float = 1.0,
    gpus: float | None = None,
    gpus_per_trial: float = 0.0,
) -> int:
    """Trials that can run at once: ``max_concurrent``, capped by the cluster's CPUs and GPUs per trial (None: not capped)."""
    slots = max(int(max_concurrent), 1)
    if cpus is not None and cpus_per_trial > 0:
        slots = min(slots, int(cpus // cpus_per_trial + 1e-9))
    if gpus is not None and gpus_per_trial > 0:
        slots = min(slots, int(gpus // gpus_per_trial + 1e-9))
    return max(slots, 1)


@dataclass(frozen=True)
class Utilization:
    """A study's utilization; ``in_trial_s`` summed over ``trials`` trials in ``wall_s`` seconds on ``slots`` slots."""

    in_trial_s: float
    wall_s: float
    slots: int
    startup_s: float = 0.0
    trials: int = 0

    @property
    def slot_s(self) -> float:
        """The seconds the slots were there: wall time x slots."""
        return self.wall_s * self.slots

    @property
    def utilization(self) -> float:
        """in-trial seconds / (wall seconds x slots); NaN for an empty wall time."""
        return self.in_trial_s / self.slot_s if self.slot_s > 0 else float("nan")

    @property
    def overhead_s(self) -> float:
        """Slot-seconds not spent in a trial's epochs (start-up of trials, checkpoints, idle slots)."""
        return self.slot_s - self.in_trial_s

    def as_metrics(self) -> dict[str, float]:
        """The figures as MLflow metrics of the parent run."""
        return {
            "utilization": self.utilization,
            "in_trial_s": self.in_trial_s,
            "utilization_wall_s": self.wall_s,
            "utilization_slots": float(self.slots),
            "startup_s": self.startup_s,
        }

    def describe(self) -> str:
        """One line for the end summary."""
        return (
            f"utilization {self.utilization:.2f}: {self.in_trial_s:.0f} s training and evaluating in {self.trials} trials "
            f"/ ({self.wall_s:.0f} s wall x {self.slots} slots); Ray start-up {self.startup_s:.1f} s apart"
        )


def study_utilization(
    trial_epochs: Mapping[Any, Iterable[Mapping[str, Any]]], wall_s: float, slots: int, startup_s: float = 0.0
) -> Utilization:
    """The utilization of a study whose trials reported ``trial_epochs`` (trial -> its epochs' metrics)."""
    total = sum(in_trial_seconds(epochs) for epochs in trial_epochs.values())
    return Utilization(in_trial_s=total, wall_s=float(wall_s), slots=int(slots), startup_s=float(startup_s), trials=len(trial_epochs))


# ----------------------------------------------------------------------------- readers of a study's records
def every_epoch(client, run_id: str, key: str) -> list:
    """A run's ``key`` at every epoch it trained, in the order logged: its history and, on a ladder of budgets, that of
    ``retrained/<key>`` (a rung's tail trained again, at steps the main history holds already)."""
    points = [*client.get_metric_history(run_id, key), *client.get_metric_history(run_id, RETRAINED + key)]
    return sorted(points, key=lambda m: (m.timestamp, m.step))


def epochs_from_mlflow(
    client, experiment_id: str, parent_run_id: str, kinds: Iterable[str] = TRIAL_KINDS, since: float | None = None
) -> dict[str, list[dict[str, float]]]:
    """Child run id -> its epochs' timings, from the MLflow child runs of a study's parent run (public MlflowClient API).

    Each timing's history is read in full (one value per logged step, and per retrained epoch under ``retrained/``:
    a rung's tail trained again is time in the trial too). A step logged before a restart is not logged again
    (``TrialRecorder``), so a retried epoch counts once here. ``since`` (seconds since the epoch) keeps the epochs
    logged from then on: a resumed study's own session, whose wall time does not hold the epochs trained before the
    interruption.
    """
    kinds = set(kinds)
    # filtered by parent only: the kinds are checked here (OR in filter strings is not supported by every MLflow store)
    from study.records.tracking import all_pages, run_filter

    query = {"experiment_ids": [experiment_id], "filter_string": run_filter({"tags.mlflow.parentRunId": parent_run_id})}
    runs = all_pages(client.search_runs, **query)
    out: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        if run.data.tags.get("kind") not in kinds:
            continue
        by_epoch: dict[tuple[int, bool, int], dict[str, float]] = {}  # (step, retrained, the n-th epoch at that step)
        for key in (k for k in run.data.metrics if k.removeprefix(RETRAINED) in SPELLINGS):
            name, seen = key.removeprefix(RETRAINED), Counter()
            for point in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp):
                if since is not None and point.timestamp < since * 1000:
                    continue
                at = (int(point.step), key != name, seen[point.step])
                seen[point.step] += 1
                by_epoch.setdefault(at, {}).update(epoch_times({name: point.value}))
        if by_epoch:
            out[run.info.run_id] = [by_epoch[at] for at in sorted(by_epoch)]
    return out


def spans_from_optuna(study) -> dict[int, float]:
    """Optuna trial number -> seconds from its start (asked) to its end (told), for finished trials.

    This is how long the driver saw each trial hold a slot, its start-up included: the
    difference to its in-trial seconds is that trial's overhead. Optuna does not store the
    per-epoch timings themselves.
    """
    spans: dict[int, float] = {}
    for trial in study.get_trials(deepcopy=False):
        if trial.datetime_start is not None and trial.datetime_complete is not None:
            spans[trial.number] = (trial.datetime_complete - trial.datetime_start).total_seconds()
    return spans

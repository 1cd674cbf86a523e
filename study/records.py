"""The end of a study: what it writes to MLflow once its trials are over, and the ``StudySummary`` it returns.

``finish_study`` marks Optuna trials still RUNNING as FAIL (orphans of a killed driver), writes the trial records
the recorder kept, gives each child run its Optuna state, and writes the parent run's best_config.yaml, trials
table, plots and summary metrics. ``run_study``, ``study.sync`` and the summary printer
(``console.print_study_summary``) share what it returns. When MLflow cannot be reached nothing is lost: the
records stay in the spool, the trials in the Optuna storage, and ``python -m study.sync`` writes them later.

This module imports no Ray and no torch (tests/test_boundaries.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from mlflow.entities import RunTag
from optuna.trial import FrozenTrial, TrialState

from study import tracking
from study.recorder import TrialRecorder, run_name, training_runs
from study.selection import Selection, selection_from_record, selection_record
from study.tracking import child_runs, first_error_line
from study.utilization import Utilization, study_utilization


@dataclass(frozen=True)
class StudySummary:
    """How a study ended: counts, the best trial and its config, the selection, and whether MLflow holds it all."""

    metrics: dict[str, float]  # n_trials, n_complete, n_pruned, n_failed, wall_time_s, epochs_spent (+ selection, utilization)
    best: FrozenTrial | None  # the winner: the selection's, else the best complete trial
    best_config: dict[str, Any] | None
    selection: Selection | None = None
    utilization: Utilization | None = None
    mlflow_synced: bool = True  # False: MLflow could not be written at the end (the records wait in the spool)
    mlflow_error: str | None = None
    outages: int = 0  # times MLflow was found unreachable during the study
    study_name: str = ""
    uri: str = ""
    experiment: str = ""
    parent_run_id: str = ""
    experiment_id: str = ""  # the MLflow UI's page of the study's runs names it
    final_epochs: int | None = None  # what study.final --study trains the pick to


def epochs_trained(trial: optuna.trial.FrozenTrial) -> int:
    """Epochs a trial trained: a ladder of budgets records them; else one intermediate value per epoch."""
    return int(trial.user_attrs.get("epochs_trained", len(trial.intermediate_values)))


def summarize_study(study: optuna.Study, mode: str, wall_s: float, selection: Selection | None = None) -> StudySummary:
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
    return StudySummary(metrics, best, best_config, selection)


def finish_study(
    study: optuna.Study,
    recorder: TrialRecorder,
    metric: str,
    mode: str,
    wall_s: float,
    selection: Selection | None = None,
    usage: dict[str, float] | None = None,
    **named: Any,
) -> StudySummary:
    """Writes the kept trial records, best config, trials table, plots and summary metrics to the parent run.

    ``usage`` (``slots``, ``startup_s``, ``since``) adds the study's utilization (study.utilization), read from the
    trial runs logged since ``since``; a sync leaves it out. ``named``: the summary's ``experiment`` and
    ``final_epochs`` (the study's name, tracking URI and parent run are the recorder's).

    When MLflow cannot be reached, nothing is lost: the trial records stay in the spool and the Optuna
    storage holds the rest; ``python -m study.sync --study NAME`` writes them later.
    """
    # the study is over: a trial still RUNNING was orphaned by a killed driver and never continued
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
    summary = dataclasses.replace(
        summarize_study(study, mode, wall_s, selection),
        study_name=recorder.study_name,
        uri=recorder.tracking_uri,
        parent_run_id=recorder.parent_run_id,
        experiment_id=recorder.experiment_id,
        **named,
    )
    try:
        if not recorder.flush(force=True):
            raise ConnectionError("the kept trial records could not be written")
        if usage is not None:
            summary = with_utilization(summary, recorder, wall_s, **usage)
        write_study_records(study, recorder, metric, summary)
    except Exception as error:  # any MLflow failure: report, keep, and let the user sync
        summary = dataclasses.replace(summary, mlflow_synced=False, mlflow_error=first_error_line(str(error)) or type(error).__name__)
    return dataclasses.replace(summary, outages=sum(e["event"] == "unreachable" for e in recorder.events()))


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


def with_utilization(summary: StudySummary, recorder: TrialRecorder, wall_s: float, slots: int, startup_s: float, since: float):
    """The summary with the study's utilization (also among the parent run's metrics), from the epochs the driver's
    recorder wrote to MLflow since ``since`` (seconds since the epoch): what it holds, no MLflow read per run."""
    after = since * 1000
    epochs = {trial: [times for time_ms, times in done if time_ms >= after] for trial, done in recorder.applied_epochs.items()}
    usage = study_utilization({trial: e for trial, e in epochs.items() if e}, wall_s, slots, startup_s)
    return dataclasses.replace(summary, utilization=usage, metrics={**summary.metrics, **usage.as_metrics()})


def write_study_records(study: optuna.Study, recorder: TrialRecorder, metric: str, summary: StudySummary) -> None:
    """Optuna's number and state on every child run, then the artifacts and summary metrics on the parent run.

    Tags and metrics that already hold these values are not written again.
    """
    from study.artifacts import study_artifacts

    client, parent_id = recorder.client, recorder.parent_run_id
    parent = client.get_run(parent_id)
    describe_optuna_study(study, parent_id, parent.data.tags.get("space", ""), metric)
    children = {r.data.tags.get("trial_id"): r for r in child_runs(client, recorder.experiment_id, parent_id)}
    for t in study.get_trials(deepcopy=False):
        run = children.get(t.user_attrs.get("tune_trial_id"))
        if run is not None:
            tags = {
                "optuna_trial_number": str(t.number),
                "optuna_state": t.state.name,
                "mlflow.runName": run_name("trial", run.data.tags["trial_id"], t.number),
            }
            changed = [RunTag(key, value) for key, value in tags.items() if run.data.tags.get(key) != value]
            if changed:  # a trial the driver recorded as it ended has none: no call per trial at the end of a large study
                client.log_batch(run.info.run_id, tags=changed)
    # a trial or re-run still RUNNING was orphaned by a killed driver (it started after Tune's last snapshot)
    orphans = [run.info.run_id for run in training_runs(client, recorder.experiment_id, parent_id) if run.info.status == "RUNNING"]
    tracking.fail_orphans(client, orphans, "orphaned: its trial was interrupted with the driver and not continued")
    best, selection = summary.best, summary.selection
    with tempfile.TemporaryDirectory() as tmp:
        paths = study_artifacts(study, children, Path(tmp), metric, best)
        if selection is not None:
            paths.append(Path(tmp) / "selection.json")
            paths[-1].write_text(json.dumps(selection_record(selection), indent=1))
        for path in paths:
            client.log_artifact(parent_id, str(path))
    metrics = {k: v for k, v in summary.metrics.items() if math.isfinite(v)}
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

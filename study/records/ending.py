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

from study import inputs
from study.records import tracking
from study.records.tracking import child_runs, first_error_line
from study.records.trials import TrialRecorder, active_tag, run_name
from study.records.utilization import Utilization, study_utilization
from study.search.race import Selection, selection_from_record, selection_record
from study.search.trial import FAIL, epochs_spent, run_key
from trainables.core.config import TrainConfig

NOTE_TAG = "mlflow.note.content"  # the run's description in MLflow's UI (Markdown)


@dataclass(frozen=True)
class StudySummary:
    """How a study ended: counts, the best trial and its config, the selection, and whether MLflow holds it all."""

    metrics: dict[str, float]  # n_trials, n_complete, n_pruned, n_failed, wall_time_s, epochs_spent (+ selection, utilization)
    best: FrozenTrial | None  # the pick: the race's winner, else the best complete trial
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
    best_single: FrozenTrial | None = None  # the best single score of a complete trial (the pick only without a race)


def summarize_study(study: optuna.Study, mode: str, wall_s: float, selection: Selection | None = None) -> StudySummary:
    """Counts, the best complete trial and its config, from the Optuna storage (the study's record of truth).

    With a ``selection`` (the race of the top trials over validation folds), the best is its winner, not the single best
    score.
    """
    trials = study.get_trials(deepcopy=False)
    if selection is None and "selection" in study.user_attrs:  # a study synced or finished again after its confirmation runs
        selection = selection_from_record(study.user_attrs["selection"], mode)
    counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value)]
    best = single = None
    if complete:
        best = single = max(complete, key=lambda t: t.value) if mode == "max" else min(complete, key=lambda t: t.value)
    if selection is not None:
        best = next(t for t in complete if t.number == selection.winner.key)
    metrics = {
        "n_trials": len(trials),
        "n_complete": counts["COMPLETE"],
        "n_pruned": counts["PRUNED"],
        "n_failed": counts["FAIL"],
        "wall_time_s": wall_s,
        "epochs_spent": float(epochs_spent(trials)),
    }
    if selection is not None:
        metrics["confirmation_runs"] = float(sum(len(c.scores) - 1 for c in selection.ranking))
        metrics["selection_lead_in_se"] = selection.lead_in_se
    best_config = best.user_attrs.get("config") if best else None
    return StudySummary(metrics, best, best_config, selection, best_single=single)


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

    ``usage`` (``slots``, ``startup_s``, ``since``) adds the study's utilization (study.records.utilization), read from the
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


def failed_tags(reason: str, config: dict[str, Any] | None, optuna: bool = True) -> dict[str, str]:
    """The tags of a trial's (or re-run's) run that failed: the reason, its state, its active params and, for an
    Optuna trial (``optuna``; a re-run is none), the state Optuna records."""
    tags = {"failure_reason": reason, "trial_state": FAIL, "stopped_early": "false", **active_tag(config)}
    return {**tags, "optuna_state": FAIL} if optuna else tags


def write_tags(client, run, tags: dict[str, str]) -> bool:
    """The ``tags`` that ``run`` does not hold yet, in one call (none when it holds them all: a trial the driver tagged as
    it ended costs no call at the end of a large study); whether it wrote any."""
    changed = [RunTag(key, value) for key, value in tags.items() if run.data.tags.get(key) != value]
    if changed:
        client.log_batch(run.info.run_id, tags=changed)
    return bool(changed)


def mark_pick(study: optuna.Study, summary: StudySummary) -> None:
    """The pick on the Optuna side: the study's user attributes ``picked_trial`` and, with confirmation re-runs,
    ``picked_confirmation_mean`` (what optuna-dashboard shows beside its own "Best Trial", the best single score).

    On the study, not the trial: Optuna refuses to change a finished trial (``UpdateFinishedTrialError``, from
    ``Trial.set_user_attr`` and from the storage alike), and the pick is made after every trial has finished.
    Written only where they differ, so a study synced again writes nothing; with them, optuna-dashboard's study note
    (``dashboard_note``).
    """
    if summary.best is None:
        return
    attrs: dict[str, Any] = {"picked_trial": summary.best.number}
    if summary.selection is not None:
        attrs["picked_confirmation_mean"] = summary.selection.winner.mean
    changed = {key: value for key, value in attrs.items() if study.user_attrs.get(key) != value}
    for key, value in changed.items():
        study.set_user_attr(key, value)
    if changed:
        dashboard_note(study, summary)


def dashboard_note(study: optuna.Study, summary: StudySummary) -> None:
    """The pick as optuna-dashboard's note on the study, and how it relates to the dashboard's "Best Trial" badge (the
    best single score). Written with the dashboard's public ``save_note``; nothing without the dashboard installed
    (the dev extra), where no page would show it."""
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return
    pick, single, selection = summary.best, summary.best_single, summary.selection
    lines = [f"## The study's pick: trial {pick.number}", ""]
    if selection is not None:
        winner = selection.winner
        lines.append(f"The race's winner: mean {winner.mean:.4f} over {len(winner.scores)} validation folds; {selection.verdict()}.")
    if single is not None and single.number != pick.number:
        lines.append(f"The Best Trial badge marks trial {single.number}, the best single score ({single.value:.4f}), not the pick.")
    else:
        lines.append("It is also the best single score, which the Best Trial badge marks.")
    lines.append("The study's user attributes `picked_trial` and `picked_confirmation_mean` name it; `study.final --study` retrains it.")
    lines.append("Hyperparameter Importance here pools every complete trial, of every loss; `study.report` gives them per loss.")
    save_note(study, "\n".join(lines))


FINAL_MARK = "**Retrained by study.final**"  # opens the description's last paragraph, written by study.final --study
TEST_KEYS = ("test_recall_at_1", "test_map_at_r", "test_nmi")  # what the paragraph states, each where measured


def with_final(note: str, summary: dict[str, float], seeds: int, epochs: int, model_uri: str, trials: tuple[int, ...] = ()) -> str:
    """The study's description (``mlflow.note.content``) with a last paragraph on its retrained pick: the test metrics'
    mean +- standard deviation over ``seeds`` seeds of ``epochs`` epochs (seed k of the ``trials`` of the race's tie,
    when given) and the model's URI; a later retraining replaces the paragraph of an earlier one."""
    shown = [key for key in TEST_KEYS if key + "_mean" in summary]
    measured = [f"{key.removeprefix('test_')} {summary[key + '_mean']:.4f} +- {summary[key + '_std']:.4f}" for key in shown]
    joint = [f"{key.removeprefix('test_')} {summary['ensemble_' + key]:.4f}" for key in TEST_KEYS if "ensemble_" + key in summary]
    tie = f" (seed k training the k-th of the race's tied candidates: {', '.join(f'#{t}' for t in trials)})" if trials else ""
    paragraph = (
        f"{FINAL_MARK}: {seeds} seed(s) of {epochs} epochs{tie} on every training class, scored on the test classes: "
        + ", ".join(measured)
        + (f"; the seeds as one model (their embeddings side by side): {', '.join(joint)}" if joint else "")
        + f". Model: `{model_uri}`."
    )
    head = note.split(FINAL_MARK)[0].rstrip()
    return f"{head}\n\n{paragraph}" if head else paragraph


def study_note(summary: StudySummary, metric: str, picked_run: str | None, trials_epochs: str | None) -> str:
    """The parent run's description (``mlflow.note.content``, Markdown), short paragraphs with the essentials first
    (MLflow's run page shows its first lines folded): the pick, its loss, its mean and standard error over validation
    folds and the verdict; what ``study.final --study`` trains; where the rest is."""
    name = summary.study_name
    best, selection = summary.best, summary.selection
    if best is None:
        return f"**Study {name}: no trial completed**, so nothing was picked. Its trials: the child runs and `trials.csv`."
    loss = (best.user_attrs.get("config") or {}).get("loss", TrainConfig().loss)
    who = picked_run or f"trial {best.number}"
    if selection is not None:
        winner = selection.winner
        sem = f" ± {winner.sem:.4f} (standard error)" if math.isfinite(winner.sem) else ""
        scores = ", ".join(f"{v:.4f}" for v in winner.scores)
        over = f"{len(winner.scores)} validation folds" if winner.folds else f"{len(winner.scores)} seeds"
        score = f"{metric} mean {winner.mean:.4f}{sem} over {over} ({scores}); {selection.verdict()}"
    else:
        score = f"{metric} {float(best.value):.4f}, one seed (no confirmation re-runs)"
    epochs = summary.final_epochs or trials_epochs
    trained = f"; its trials trained up to {trials_epochs}" if trials_epochs and str(epochs) != str(trials_epochs) else ""
    paragraphs = [
        f"**Pick of study {name}: {who}** (Optuna trial {best.number}, loss `{loss}`): {score}.",
        f"Retrain and test it: `python -m study.final --study {name}` ({epochs} epochs{trained}; 3 seeds, on all training classes).",
        f"Report: `python -m study.report --study {name}`. Its config: `best_config.yaml`; the re-runs: `selection.json`; "
        "every trial: `trials.csv`.",
    ]
    return "\n\n".join(paragraphs)


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
    from study.records.artifacts import study_artifacts, tied_configs

    client, parent_id = recorder.client, recorder.parent_run_id
    parent = client.get_run(parent_id)
    describe_optuna_study(study, parent_id, parent.data.tags.get("space", ""), metric)
    trial_runs = child_runs(client, recorder.experiment_id, parent_id)  # the one search of the trials' runs
    reruns = child_runs(client, recorder.experiment_id, parent_id, kind="confirmation")
    trial_runs += record_unstarted(study, recorder, {r.data.tags.get("trial_id") for r in trial_runs})
    children = {r.data.tags.get("trial_id"): r for r in trial_runs}
    best, selection = summary.best, summary.selection
    picked = children.get(best.user_attrs.get("tune_trial_id")) if best is not None else None
    changed = tag_training_runs(client, study, children, reruns, picked)
    # a trial or re-run still RUNNING was orphaned by a killed driver (it started after Tune's last snapshot)
    orphans = [run.info.run_id for run in (*trial_runs, *reruns) if run.info.status == "RUNNING"]
    tracking.fail_orphans(client, orphans, "orphaned: its trial was interrupted with the driver and not continued")
    mark_pick(study, summary)
    trials = read_again(client, trial_runs, changed | set(orphans), recorder.experiment_id, parent_id)

    def curves(path: Path) -> Path:
        from study.records.artifacts import optuna_learning_curves
        from study.records.curves import draw_learning_curves  # the report's drawing, so that the study holds one

        try:
            return draw_learning_curves(client, parent, trials, path)
        except inputs.UsageError:  # a parent run whose params are no study's record: the curves of Optuna's values
            return optuna_learning_curves(study, metric, path)

    with tempfile.TemporaryDirectory() as tmp:
        paths = study_artifacts(study, children, Path(tmp), metric, best, curves=curves)
        if selection is not None:
            paths.append(Path(tmp) / "selection.json")
            paths[-1].write_text(json.dumps(selection_record(selection), indent=1))
            paths.append(tied_configs(study, selection, Path(tmp) / "tied_configs.yaml"))
        for path in paths:
            client.log_artifact(parent_id, str(path))
    write_parent_summary(client, parent, summary, metric, picked)
    client.set_terminated(parent_id, status="FINISHED")


UNSTARTED = "orphaned: Optuna asked for this trial just before the driver was killed; Tune never started it"


def record_unstarted(study: optuna.Study, recorder: TrialRecorder, started: set[str]) -> list:
    """A FAILED run (with its config as params and ``UNSTARTED`` as its reason) for each failed Optuna trial that has
    none: the searcher asked for it, then the driver was killed before the trial's first record opened its run (Tune
    had not started it, so a resume does not either); killed inside the ask, the trial has no config and no Tune trial
    (``run_key``). MLflow then holds one run per Optuna trial. Written through the recorder, as every trial run;
    returns the new runs."""
    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    missing = [t for t in failed if run_key(t) not in started]
    for trial in missing:
        config = trial.user_attrs.get("config") or trial.params
        op = {"op": "error", "trial_id": run_key(trial), "optuna_number": trial.number, "tags": failed_tags(UNSTARTED, config)}
        recorder.submit({**op, "config": config})
    if missing and not recorder.flush(force=True):
        raise ConnectionError("the runs of trials that never started could not be written")
    return [recorder.client.get_run(recorder.run_ids[run_key(t)]) for t in missing]


def tag_training_runs(client, study: optuna.Study, children: dict, reruns: list, picked) -> set[str]:
    """Optuna's number and state, the run name and the active params on every trial run (``picked=true`` on the
    pick's), the active params on every re-run; tags that already hold these values are not written again. Returns
    the ids of the runs it wrote to."""
    changed: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        run = children.get(run_key(t))
        if run is not None:
            tags = {
                "optuna_trial_number": str(t.number),
                "optuna_state": t.state.name,
                "mlflow.runName": run_name("trial", run.data.tags["trial_id"], t.number),
                **active_tag(run.data.params),  # the driver tags it as the trial ends; a study synced after an update has none
            }
            if run is picked:
                tags[tracking.PICKED_TAG] = "true"
            if write_tags(client, run, tags):
                changed.add(run.info.run_id)
    changed.update(run.info.run_id for run in reruns if write_tags(client, run, active_tag(run.data.params)))
    return changed


def read_again(client, runs: list, changed: set[str], experiment_id: str, parent_id: str) -> list:
    """The trial ``runs`` with those in ``changed`` read again: run by run, or in one search of every trial's run when
    more than a search page's worth (``tracking.SEARCH_PAGE``) changed. At the end of a large study few change (the driver
    tags each trial as it ends), and a search of thousands of runs costs seconds and memory (docs/performance.md,
    measurements behind the code)."""
    if len(changed) > tracking.SEARCH_PAGE:
        return child_runs(client, experiment_id, parent_id)
    return [client.get_run(run.info.run_id) if run.info.run_id in changed else run for run in runs]


def write_parent_summary(client, parent, summary: StudySummary, metric: str, picked) -> None:
    """The parent run's summary metrics (each once: a study synced again logs no repeated point), the pick's tags
    and the description (``study_note``)."""
    parent_id, best, selection = parent.info.run_id, summary.best, summary.selection
    metrics = {k: v for k, v in summary.metrics.items() if math.isfinite(v)}
    # "pick" is the study's choice (the race's, else the best complete trial); "best single" the top score of any one
    # trial, which a race may not pick: two names, so that no page calls two numbers "best"
    if selection is not None:
        metrics[f"pick_mean_{metric}"] = selection.winner.mean
        client.set_tag(parent_id, "pick_verdict", selection.verdict())
    if best is not None:
        metrics[f"pick_{metric}"] = float(best.value)
        client.set_tag(parent_id, "picked_trial_number", str(best.number))
    if summary.best_single is not None:
        metrics[f"best_single_{metric}"] = float(summary.best_single.value)
    if picked is not None:
        client.set_tag(parent_id, "picked_run", picked.info.run_id)
    tracking.share_study_view(client, parent.info.experiment_id, parent.data.tags["study_name"], metric)  # a study begun before it
    picked_name = run_name("trial", picked.data.tags["trial_id"], best.number) if picked is not None else None
    client.set_tag(parent_id, NOTE_TAG, study_note(summary, metric, picked_name, parent.data.params.get("epochs")))
    for key, value in metrics.items():
        if parent.data.metrics.get(key) != float(value):
            client.log_metric(parent_id, key, float(value))

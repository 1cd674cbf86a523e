"""A study's MLflow parent run: created with the study's record, found again, reopened on --resume, stopped.

The parent run (one per study, tags ``kind=study`` and ``study_name``) holds the study's settings as params
(``study.records.study_record.StudyRecord``); its child runs are the trials (``study.records.trials``). A study that fails or is
interrupted leaves no run RUNNING (``stopped_on_failure``). (The Optuna trials a resume does not continue are told
FAIL by the restored searcher: ``study.search.searcher.OptunaSearcher.restore_state``.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import mlflow
from mlflow.entities import Param

from study.inputs import UsageError
from study.interrupts import signal_name
from study.records import tracking
from study.records.study_record import StudyRecord
from study.records.tracking import first_error_line
from study.records.trials import training_runs

log = logging.getLogger(__name__)


def resumed_record(uri: str, experiment: str, study_name: str) -> StudyRecord:
    """The record of an existing study (what ``--resume`` continues with)."""
    return StudyRecord.from_params(study_parent(uri, experiment, study_name, "--resume").data.params, where=f"study {study_name!r}")


def study_parent(uri: str, experiment: str, study_name: str, flag: str):
    """The parent run of ``study_name`` (a UsageError naming ``flag`` when the experiment holds no such study)."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    parent = tracking.find_study_run(client, found.experiment_id, study_name) if found else None
    if parent is None:
        raise UsageError(
            f"{flag}: no study {study_name!r} in MLflow experiment {experiment!r} at {uri}; "
            "expected the --study-name of a study.launch study"
        )
    return parent


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
    if "metric" in params:  # the runs table the study's printed URL opens (tracking.study_view)
        tracking.share_study_view(client, experiment_id, study_name, str(params["metric"]))
    return run_id


def mark_stopped(client, run_ids: list[str], parent_id: str | None, error: BaseException, *, in_study: bool) -> None:
    """The one rule for runs a failure or a signal stopped: the runs of ``run_ids`` still RUNNING, and the parent
    run when given, end with ``failure_reason``: the error's last line, or "interrupted by SIG..." (a study) /
    "stopped by SIG..." (a final training). A parent ends KILLED by a signal, else FAILED. A study's trials end
    FAILED with "study stopped: <reason>" (a resumed study continues them); a final training's seeds as its parent.
    """
    interrupted = isinstance(error, KeyboardInterrupt)
    status = "KILLED" if interrupted else "FAILED"
    verb = "interrupted by" if in_study else "stopped by"
    reason = f"{verb} {signal_name(error)}" if interrupted else first_error_line(str(error)) or type(error).__name__
    tracking.fail_orphans(client, run_ids, f"study stopped: {reason}" if in_study else reason, "FAILED" if in_study else status)
    if parent_id is not None:
        client.set_tag(parent_id, "failure_reason", reason)
        client.set_terminated(parent_id, status=status)


@contextlib.contextmanager
def stopped_on_failure(client, experiment_id: str, parent_id: str) -> Iterator[None]:
    """Runs the body; when it raises, the study's runs still RUNNING are marked stopped with the reason, and it re-raises."""
    try:
        yield
    except BaseException as error:
        try:
            ids = [r.info.run_id for r in training_runs(client, experiment_id, parent_id)]
            mark_stopped(client, ids, parent_id, error, in_study=True)
        except Exception as mlflow_error:  # MLflow itself may be what failed
            log.warning("could not mark the study's MLflow runs as stopped (%s)", first_error_line(str(mlflow_error)))
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

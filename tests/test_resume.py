"""Killing the driver of a running study (SIGKILL) and resuming it: nothing lost, nothing duplicated."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from tests.conftest import ROOT
from tests.test_launch import study_records

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def epochs_logged(runs: Path, name: str) -> list[int]:
    db = runs / "mlflow.db"
    # the driver creates the Optuna journal after MLflow's database is set up: opening a client on the database
    # while the driver still migrates it would race with that migration
    if not db.exists() or not (runs / "optuna" / "journal.log").exists():
        return []
    try:
        client = mlflow.MlflowClient(f"sqlite:///{db}")
        exp = client.get_experiment_by_name("dml-studies")
        if exp is None:
            return []
        found = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{name}' and tags.kind = 'trial'")
        return [max((m.step for m in client.get_metric_history(r.info.run_id, "train_loss")), default=0) for r in found]
    except Exception:  # the database is being created by the driver
        return []


def start_driver(argv: list[str], env: dict, output=subprocess.PIPE) -> subprocess.Popen:
    """``python -m study.launch ARGV`` in a session of its own (so that its process group is the driver and its local Ray)."""
    kwargs = {"text": True} if output == subprocess.PIPE else {}
    return subprocess.Popen(
        [sys.executable, "-m", "study.launch", *argv], cwd=ROOT, env=env, start_new_session=True, stdout=output, stderr=output, **kwargs
    )


def run_and_kill(argv: list[str], env: dict, until) -> None:
    """Start study.launch, SIGKILL it (and the local Ray it started) once ``until()`` holds."""
    driver = start_driver(argv, env, output=subprocess.DEVNULL)
    try:
        wait_for(until, 900, "the study to make progress")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def test_sigkill_driver_twice_then_resume_completes_without_duplicates(tmp_path):
    runs = tmp_path / "runs"
    env = {**os.environ, "DML_RUNS_DIR": str(runs)}
    env.pop("MLFLOW_TRACKING_URI", None)
    start = [
        "--space",
        "smoke",
        "--num-samples",
        "4",
        "--max-concurrent",
        "2",
        "--epochs",
        "8",
        "--grace-period",
        "8",
        "--study-name",
        "killed",
        "--confirm-seeds",  # the search's records are under test; the resumes take this setting from the study
        "0",
    ]
    resume = ["--study-name", "killed", "--resume"]
    run_and_kill(start, env, lambda: any(e >= 2 for e in epochs_logged(runs, "killed")))
    first = epochs_logged(runs, "killed")
    run_and_kill(resume, env, lambda: sum(epochs_logged(runs, "killed")) >= sum(first) + 3)
    second = epochs_logged(runs, "killed")
    out = subprocess.run(
        [sys.executable, "-m", "study.launch", *resume],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client, parent, children, study = study_records(runs, "killed")
    assert parent[0].info.status == "FINISHED"
    assert len(children) == len(study.trials) == 4  # exactly one child run per trial
    assert len({r.data.tags["trial_id"] for r in children}) == 4
    assert all(r.info.status == "FINISHED" for r in children)  # nothing left RUNNING
    assert all(t.state.name == "COMPLETE" for t in study.trials)  # MLflow and Optuna agree
    for run in children:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert steps == list(range(1, 9))
    # trials that had checkpointed continued from their checkpoints instead of starting over
    resumed = [int(r.data.tags.get("resumed_from_epoch", 0)) for r in children]
    assert max(first) >= 2 and sum(second) > sum(first)
    assert sum(1 for r in resumed if r >= 1) >= 2
    assert all(not math.isnan(t.value) for t in study.trials)

"""Killing the driver of a running study (SIGKILL) and resuming it: nothing lost, nothing duplicated."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from study.records import tracking
from study.search.trial import CONFIRMS_KEY, FOLD_KEY
from tests.conftest import ROOT, wait_for
from tests.test_launch import study_records

pytestmark = pytest.mark.slow


def epochs_logged(runs: Path, name: str, kind: str = "trial") -> list[int]:
    """The epochs each run of study ``name`` has recorded as trained: on a ladder its ``epochs_trained`` (a promoted
    trial's retrained tail counted; its steps are the epochs of its schedule, which a retrained epoch does not
    advance), else its last step. [] while the study's store is being made."""
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
        found = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{name}' and tags.kind = '{kind}'")
        trained = [max((m.value for m in client.get_metric_history(r.info.run_id, "epochs_trained")), default=0) for r in found]
        steps = [max((m.step for m in client.get_metric_history(r.info.run_id, "train_loss")), default=0) for r in found]
        return [int(max(t, s)) for t, s in zip(trained, steps, strict=True)]
    except Exception:  # the database is being created by the driver
        return []


def start_driver(argv: list[str], env: dict, output=subprocess.PIPE) -> subprocess.Popen:
    """``python -m study.launch ARGV`` in a session of its own (so that its process group is the driver and its local Ray)."""
    kwargs = {"text": True} if output == subprocess.PIPE else {}
    return subprocess.Popen(
        [sys.executable, "-m", "study.launch", *argv], cwd=ROOT, env=env, start_new_session=True, stdout=output, stderr=output, **kwargs
    )


def run_driver(argv: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m study.launch ARGV`` to its end, its output kept (a generous limit, not a timing)."""
    command = [sys.executable, "-m", "study.launch", *argv]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True)


# Ray Tune snapshots a study's state at most every 10 s by default (its "auto" period; the environment variable is Ray
# Tune's own setting). Tests that kill a rehearsal once its snapshot holds a trial mid-way ask for a snapshot every
# second, so that its trials need not sleep through 10 s windows: the same resume, on shorter surrogate epochs.
FREQUENT_SNAPSHOTS = {"TUNE_GLOBAL_CHECKPOINT_S": "1"}


def run_and_kill(argv: list[str], env: dict, until) -> None:
    """Start study.launch, SIGKILL it (and the local Ray it started) once ``until()`` holds (a driver that ends
    before that fails the wait at once)."""
    driver = start_driver(argv, env, output=subprocess.DEVNULL)
    try:
        wait_for(until, 900, "the study to make progress", process=driver)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def snapshot_has_a_running_trial(experiment_dir: Path, epochs: int, re_run: bool = False, fold: int = 1) -> bool:
    """The Tune experiment's last snapshot holds an unfinished search trial (``re_run``: a re-run on validation fold
    ``fold`` or later; Tune snapshots a running trial as PENDING) with a checkpoint and at least half its epochs to
    go. A kill then is sure to leave a checkpoint to continue from: the MLflow records run ahead of the snapshot,
    which Tune writes only every so often.

    Only while every unfinished trial's checkpoint that the snapshot names still exists: with a checkpoint every
    epoch, Tune's ``num_to_keep=2`` deletes the one a snapshot names two epochs later, and forces the next snapshot
    only after that. A resume puts such a folder back from the driver's links (docs/reference/faults.md, and the test
    below deletes them on purpose once); the kill itself then comes at a moment of Tune's own making."""
    from ray.tune import ExperimentAnalysis

    if not list(experiment_dir.glob("experiment_state-*.json")):
        return False
    try:
        trials = ExperimentAnalysis(str(experiment_dir)).trials
    except Exception:  # the snapshot is being replaced by Tune
        return False
    unfinished = [t for t in trials if t.status not in ("TERMINATED", "ERROR")]
    if any(t.checkpoint is not None and not Path(t.checkpoint.path).exists() for t in unfinished):
        return False
    return any(
        (CONFIRMS_KEY in t.config) == re_run and (not re_run or t.config.get(FOLD_KEY, 0) >= fold)
        and t.status not in ("TERMINATED", "ERROR") and t.checkpoint is not None
        and 1 <= (t.last_result or {}).get("training_iteration", 0) <= epochs // 2
        for t in trials
    )  # fmt: skip


def delete_named_checkpoints(experiment_dir: Path) -> list[str]:
    """Deletes the checkpoint folder that Tune's last snapshot names for each unfinished trial, as Tune's
    ``num_to_keep=2`` does when the trial checkpoints twice more before the next snapshot (docs/reference/faults.md);
    returns the folders deleted."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(experiment_dir)).trials
    named = [t.checkpoint.path for t in trials if t.status not in ("TERMINATED", "ERROR") and t.checkpoint]
    for path in named:
        shutil.rmtree(path)
    return named


def test_sigkill_driver_in_the_search_and_in_the_re_runs_then_resume_completes_without_duplicates(tmp_path):
    """4 trials on 2 slots, then the top 2 re-run on another fold. The driver (and its Ray) is SIGKILLed while the
    search trains, resumed, SIGKILLed again while a re-run trains, and resumed to the end.

    A rehearsal: what is under test is the driver's records and Tune's restore, and the surrogate reports, checkpoints
    and resumes through train_dml's protocol; its epochs last the same 0.5 s on any machine, so a re-run is caught
    mid-way on a fast one too. A real trial restored from its checkpoint: test_trial_that_raises_is_retried_from_its_checkpoint.
    """
    runs = tmp_path / "runs"
    env = {**os.environ, "DML_RUNS_DIR": str(runs), **FREQUENT_SNAPSHOTS}
    env.pop("MLFLOW_TRACKING_URI", None)
    epochs = 16  # 0.5 s each: a trial or re-run spends 4 s with 1 to 8 epochs done, over 3 or more of Tune's snapshots
    start = ["--rehearse", "0.5", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "4", "--max-concurrent", "2"]
    start += ["--epochs", str(epochs), "--grace-period", str(epochs)]
    start += ["--study-name", "killed", "--confirm-top", "2", "--confirm-budget", "0.25"]  # the resumes take these from the study
    start += ["--checkpoint-every", "0"]  # every epoch: a killed trial continues from the epoch it reached
    resume = ["--study-name", "killed", "--resume", "--checkpoint-every", "0"]
    run_and_kill(start, env, lambda: snapshot_has_a_running_trial(runs / "ray" / "killed", epochs))
    assert delete_named_checkpoints(runs / "ray" / "killed")  # as num_to_keep=2 does after the snapshot, before the next
    run_and_kill(resume, env, lambda: snapshot_has_a_running_trial(runs / "ray" / "killed", epochs, re_run=True))
    out = run_driver(resume, env)
    assert out.returncode == 0, out.stderr[-3000:]
    client, parent, children, study = study_records(runs, "killed")
    parent = parent[0]
    assert parent.info.status == "FINISHED"
    assert len(children) == len(study.trials) == 4  # exactly one child run per trial
    assert len({r.data.tags["trial_id"] for r in children}) == 4
    assert all(r.info.status == "FINISHED" for r in children)  # nothing left RUNNING
    assert all(t.state.name == "COMPLETE" for t in study.trials)  # MLflow and Optuna agree
    assert all(not math.isnan(t.value) for t in study.trials)
    confirmation = tracking.child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="confirmation")
    reruns = [r for r in confirmation if r.info.status == "FINISHED"]
    # a re-run that started after Tune's last snapshot before the kill is given again in a new trial; its first run
    # ends FAILED as orphaned (as a search trial's does), never RUNNING and never counted
    for run in confirmation:
        assert run in reruns or run.data.tags.get("failure_reason", "").startswith("orphaned"), (run.info.status, run.data.tags)
    for run in [*children, *reruns]:  # each epoch once: a killed trial or re-run continued in its own run
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert steps == list(range(1, epochs + 1)), (run.info.run_name, steps)
    # the trial the snapshot held with a checkpoint at the first kill continued from it instead of starting over
    assert any(int(r.data.tags.get("resumed_from_epoch", 0)) >= 1 for r in children)
    # the re-runs: one per top trial, the killed one continued from its checkpoint
    top = sorted(study.trials, key=lambda t: -t.value)[:2]
    assert sorted(int(r.data.tags["confirms_optuna_trial"]) for r in reruns) == sorted(t.number for t in top)
    assert any(int(r.data.tags.get("resumed_from_epoch", 0)) >= 1 for r in reruns)
    selection = study.user_attrs["selection"]
    assert [len(e["scores"]) for e in selection["ranking"]] == [2, 2]
    assert parent.data.tags["pick_verdict"] == selection["verdict"]


TIE = """
description: trials that train alike in a rehearsal (adam ignores momentum), so the race never drops one
fixed: {dataset: synthetic, optimizer: adam, epochs: 8}
params:
  momentum: {type: float, low: 0.5, high: 0.9}
"""


def test_sigkill_mid_race_then_resume_continues_the_race_without_retraining_a_finished_fold(tmp_path):
    """A rehearsal whose 3 candidates tie on every fold (the surrogate draws alike for configs that train alike), so
    the race runs all 5 folds: rounds 1 to 4, 3 re-runs each. The driver is SIGKILLed while a re-run of round 2 or
    later trains, and resumed: every (trial, fold) re-run is recorded once, finished, and the rounds before the kill
    are not trained again."""
    runs = tmp_path / "runs"
    (tmp_path / "tie.yaml").write_text(TIE)
    env = {**os.environ, "DML_RUNS_DIR": str(runs), **FREQUENT_SNAPSHOTS}
    env.pop("MLFLOW_TRACKING_URI", None)
    # 0.5 s epochs: a re-run of 8 spends 2 s with 1 to 4 epochs done, over 2 of Tune's snapshots; 3 slots: a round at once
    start = ["--rehearse", "0.5", "--ray-cpus", "3", "--space", str(tmp_path / "tie.yaml"), "--num-samples", "3", "--grace-period", "8"]
    start += ["--study-name", "race", "--confirm-top", "3", "--confirm-budget", "10", "--checkpoint-every", "0"]
    run_and_kill(start, env, lambda: snapshot_has_a_running_trial(runs / "ray" / "race", 8, re_run=True, fold=2))
    out = run_driver(["--study-name", "race", "--resume", "--checkpoint-every", "0"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    client, parent, _, study = study_records(runs, "race")
    assert parent[0].info.status == "FINISHED"
    confirmation = tracking.child_runs(client, parent[0].info.experiment_id, parent[0].info.run_id, kind="confirmation")
    finished = [r for r in confirmation if r.info.status == "FINISHED"]
    for run in confirmation:  # a re-run given again after the kill leaves its first run FAILED as orphaned, never RUNNING
        assert run in finished or run.data.tags.get("failure_reason", "").startswith("orphaned"), (run.info.status, run.data.tags)
    done = sorted((int(r.data.tags["confirms_optuna_trial"]), int(r.data.params[FOLD_KEY])) for r in finished)
    assert done == sorted((t.number, fold) for t in study.trials for fold in range(1, 5))  # each once: nothing retrained
    assert any(int(r.data.tags.get("resumed_from_epoch", 0)) >= 1 for r in finished)  # the killed one continued
    selection = study.user_attrs["selection"]
    assert selection["stopped"] == "folds" and [e["folds"] for e in selection["ranking"]] == [[0, 1, 2, 3, 4]] * 3
    assert selection["verdict"].startswith("undecided: the validation folds ran out after 5 folds")

"""A runs folder moved or copied elsewhere works where it is (study.relocate, issue 32 finding 2): its MLflow store, the
study's journal and checkpoints are found in the copy, and nothing is read from or written to the original."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from study import relocate
from study.launch import cli as launch
from study.records import store
from tests.test_launch import study_records

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def paths_in_store(database: Path) -> list[str]:
    """Every artifact location and path param the store holds (read with sqlite, as MLflow's UI server reads them)."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        found = [row[0] for row in db.execute("SELECT artifact_location FROM experiments")]
        found += [row[0] for row in db.execute("SELECT artifact_uri FROM runs")]
        found += [row[0] for row in db.execute("SELECT value FROM params WHERE key IN ('optuna_storage', 'storage_path')")]
    return found


def command(argv: list[str]) -> subprocess.CompletedProcess:
    """``python -m ARGV`` in a process of its own, as a user runs it (this test's process keeps MLflow's artifact
    folders of the runs it wrote, per run, from before the move); it must succeed."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env={**os.environ}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.faults
def test_a_copy_of_a_finished_study_with_its_original_deleted_reports_retrains_and_resumes_in_the_copy(runs, monkeypatch, capsys):
    argv = ["--rehearse", "0", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "3", "--study-name", "moved"]
    assert launch.main([*argv, "--confirm-budget", "0"]) == 0
    original = runs
    copy = runs.parent / "elsewhere" / "runs-copy"
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    monkeypatch.setenv("DML_RUNS_DIR", str(copy))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # mlflow.set_tracking_uri set it in this process
    capsys.readouterr()

    err = command(["study.report", "--study", "moved"]).stderr
    assert f"was written in {original}; its paths now name {copy}" in err  # once, by the first command
    assert (copy / "reports" / "moved" / "report.md").is_file()
    stored = paths_in_store(copy / "mlflow.db")
    assert not [p for p in stored if str(original) in p] and sum(str(copy) in p for p in stored) >= 4 + 2  # runs, params
    client, parent, children, study = study_records(copy, "moved")
    assert len(children) == 3 and study.trials  # the journal of the copy, by the rebound optuna_storage param
    assert parent[0].data.params["optuna_storage"] == f"journal:{copy / 'optuna' / 'journal.log'}"
    parent_artifacts = mlflow.artifacts.download_artifacts(run_id=parent[0].info.run_id, tracking_uri=f"sqlite:///{copy / 'mlflow.db'}")
    assert (Path(parent_artifacts) / "report" / "report.md").is_file()  # the report went into the copy's artifacts

    assert launch.main(["--study-name", "moved", "--resume"]) == 0  # finds the study and its Tune state in the copy
    assert "has finished: nothing left to run" in capsys.readouterr().out
    assert "its paths now name" not in capsys.readouterr().err  # rebound once: the later commands found it bound
    assert "its paths now name" not in command(["study.final", "--study", "moved", "--seeds", "1"]).stderr  # retrained
    assert not original.exists()  # nothing wrote into the deleted folder (it would have been made again)
    note = client.get_run(parent[0].info.run_id).data.tags["mlflow.note.content"]  # the retrained pick, in the description
    assert "**Retrained by study.final**: 1 seed(s) of" in note and "recall_at_1 " in note and "embedding" in note


def make_store(folder: Path) -> str:
    """A store laid out as study.records.tracking lays it: artifacts beside the database, a study's path params."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("dml-studies", artifact_location=(folder / "artifacts" / "dml-studies").as_uri())
    run = client.create_run(experiment)
    client.log_param(run.info.run_id, "optuna_storage", f"journal:{folder / 'optuna' / 'journal.log'}")
    client.log_param(run.info.run_id, "storage_path", str(folder / "ray"))
    client.log_param(run.info.run_id, "space", str(folder.parent / "spaces" / "x.yaml"))  # outside the folder: kept
    (folder / "artifacts" / "dml-studies").mkdir(parents=True)
    return run.info.run_id


def test_a_copy_beside_its_original_is_rebound_once_and_the_original_is_left_as_it_was(tmp_path, capsys):
    original, copy = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    original.mkdir(parents=True)
    run_id = make_store(original)
    assert store.rebind_if_moved(f"sqlite:///{original / 'mlflow.db'}") is None  # where it was written: not moved
    before = paths_in_store(original / "mlflow.db")
    shutil.copytree(original, copy)

    move = store.rebind_if_moved(f"sqlite:///{copy / 'mlflow.db'}")
    assert move == store.Move(original, copy)
    assert paths_in_store(original / "mlflow.db") == before
    run = mlflow.MlflowClient(f"sqlite:///{copy / 'mlflow.db'}").get_run(run_id)
    assert run.info.artifact_uri == f"{(copy / 'artifacts' / 'dml-studies').as_uri()}/{run_id}/artifacts"
    assert run.data.params == {
        "optuna_storage": f"journal:{copy / 'optuna' / 'journal.log'}",
        "storage_path": str(copy / "ray"),
        "space": str(original.parent / "spaces" / "x.yaml"),
    }
    assert store.rebind_if_moved(f"sqlite:///{copy / 'mlflow.db'}") is None  # bound: nothing more to do
    assert relocate.main(["--tracking-uri", f"sqlite:///{copy / 'mlflow.db'}"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_store_whose_artifacts_folder_is_absent_is_not_taken_for_a_moved_one(tmp_path):
    """Artifacts elsewhere by choice (a database copied alone, no artifacts/ beside it): left as it is."""
    original, alone = tmp_path / "a", tmp_path / "b"
    original.mkdir()
    alone.mkdir()
    make_store(original)
    shutil.copyfile(original / "mlflow.db", alone / "mlflow.db")
    assert store.rebind_if_moved(f"sqlite:///{alone / 'mlflow.db'}") is None
    assert paths_in_store(alone / "mlflow.db") == paths_in_store(original / "mlflow.db")


KILLED_MID_WRITE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("PRAGMA cache_size = 1")  # the change goes to the database file at once, its undo to the journal
db.execute("UPDATE params SET value = value || '-half-written'")
db.execute(  # more than the cache holds: pages of the database file are overwritten before the commit
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
    "INSERT INTO tags (key, value, run_uuid) SELECT 'x' || i, 'v', (SELECT run_uuid FROM params LIMIT 1) FROM n"
)
print("in", flush=True)
sys.stdin.read()  # the transaction stays open until killed (the test never closes stdin)
"""


@pytest.mark.faults
def test_a_store_whose_writer_was_killed_mid_transaction_is_checked_and_read_as_it_was(tmp_path):
    """A driver SIGKILLed while MLflow wrote (bench.resume_scale, 3 of 8 kills beside a busy loop per core)
    leaves sqlite's hot journal beside the store. The store check's read-only look for a move cannot roll
    it back (SQLITE_READONLY_ROLLBACK), so every command, --resume first, failed with "cannot rebind a moved MLflow
    store (attempt to write a readonly database)". Now the check rolls it back, as any MLflow client does."""
    from study.records import tracking
    from tests.conftest import ROOT as ROOT_DIR

    runs = tmp_path / "runs"
    runs.mkdir()
    run_id = make_store(runs)
    database = runs / "mlflow.db"
    argv = [sys.executable, "-c", KILLED_MID_WRITE, str(database)]
    writer = subprocess.Popen(argv, cwd=ROOT_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "in"
    writer.kill()
    writer.wait()
    assert (runs / "mlflow.db-journal").is_file()  # hot: the killed writer's transaction is to be undone
    uri = f"sqlite:///{database}"
    assert store.rebind_if_moved(uri) is None  # before: UsageError "cannot rebind a moved MLflow store (...readonly...)"
    tracking.check_store(uri, "study.launch")
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert not any("half-written" in v for v in run.data.params.values()) and not any(k.startswith("x") for k in run.data.tags)

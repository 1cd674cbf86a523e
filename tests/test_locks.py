"""Two drivers of one study: the second fails at once naming the first; fresh stores are set up by one driver at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml

from study.launch import cli as launch
from study.records import locks
from study.search.journal import open_storage
from tests.conftest import ROOT, wait_for
from tests.test_final import TINY


def test_a_second_holder_of_a_study_lock_fails_naming_the_first(tmp_path):
    with locks.study_lock(tmp_path, "s") as path:
        assert f"pid {os.getpid()}" in path.read_text()
        with pytest.raises(locks.StudyLocked, match=rf"--study-name s: the study is being run by pid {os.getpid()} on "):
            with locks.study_lock(tmp_path, "s"):
                pass
        with locks.study_lock(tmp_path, "other"):  # another study is not held up
            pass
    with locks.study_lock(tmp_path, "s"):  # released with its holder
        pass


@pytest.mark.faults
def test_the_lock_of_a_killed_driver_is_free(tmp_path):
    hold = f"from pathlib import Path; from study.records import locks\nwith locks.study_lock(Path({str(tmp_path)!r}), 's'):\n    input()"
    holder = subprocess.Popen([sys.executable, "-c", hold], cwd=ROOT, stdin=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "s.lock"
        wait_for(lambda: holder.poll() is not None or "pid" in (lock.read_text() if lock.exists() else ""), 300, "the holder's lock")
        with pytest.raises(locks.StudyLocked, match=f"pid {holder.pid}"):
            with locks.study_lock(tmp_path, "s"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with locks.study_lock(tmp_path, "s"):  # SIGKILL leaves no stale lock
        pass


def test_a_second_driver_of_a_running_study_exits_2_and_writes_nothing(runs, capsys):
    journal = runs / "optuna" / "journal.log"
    with locks.study_lock(locks.lock_folder(f"journal:{journal}", runs), "twice"):
        code = launch.main(["--space", "smoke", "--num-samples", "1", "--study-name", "twice"])
    err = capsys.readouterr().err
    assert code == 2 and f"the study is being run by pid {os.getpid()}" in err and err.count("\n") == 1
    assert "twice" not in optuna.get_all_study_names(open_storage(f"journal:{journal}"))  # no half-created study
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()], filter_string="tags.study_name = 'twice'")


SETUP = textwrap.dedent(
    """
    import sys
    from study.records import locks, tracking
    uri = sys.argv[1]
    sys.stdin.readline()  # the go signal: all start at once
    with locks.store_setup_lock(uri):
        tracking.check_reachable(uri)
        print(tracking.setup(uri, "dml-studies"))
    """
)


def started_together(argv: list[str], env: dict | None = None, n: int = 3) -> list[tuple[int, str, str]]:
    """``n`` processes of ``argv`` (each waits for a go line on stdin after its imports), let go at once; their
    (exit status, stdout, stderr)."""
    drivers = [
        subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    for d in drivers:
        d.stdin.write("go\n")
        d.stdin.flush()
    outcomes = [d.communicate(timeout=600) for d in drivers]
    return [(d.returncode, out, err) for d, (out, err) in zip(drivers, outcomes)]


@pytest.mark.faults
def test_fresh_drivers_set_up_a_new_store_one_at_a_time(tmp_path):
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    outcomes = started_together([sys.executable, "-c", SETUP, uri])  # all start the migration at once
    assert [code for code, _, _ in outcomes] == [0, 0, 0], [err[-2000:] for _, _, err in outcomes]
    assert len({out.strip() for _, out, _ in outcomes}) == 1  # one experiment, the same for all


FINAL = textwrap.dedent(
    """
    import sys
    from study.final import cli as final
    config, uri = sys.argv[1:]
    sys.stdin.readline()  # the go signal: all start at once, past their imports
    sys.exit(final.main(["--config", config, "--seeds", "1", "--tracking-uri", uri, "--experiment", "final"]))
    """
)


@pytest.mark.faults
def test_finals_started_together_on_a_new_store_all_record_their_runs(tmp_path):
    """Three ``study.final`` drivers reach a new sqlite store at once: one creates it while the others wait, as
    study.launch's drivers do (MLflow's migrations of one database race otherwise, and a driver that loses dies with
    alembic's traceback)."""
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "epochs": 1}))
    env = {**os.environ, "DML_RUNS_DIR": str(tmp_path / "runs")}
    outcomes = started_together([sys.executable, "-c", FINAL, str(config), uri], env)
    assert [code for code, _, _ in outcomes] == [0, 0, 0], [err[-2000:] for _, _, err in outcomes]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("final").experiment_id], filter_string="tags.kind = 'final_seed'")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}


@pytest.mark.faults
def test_a_process_lock_is_abandoned_only_once_its_process_is_gone(tmp_path):
    """locks.process_lock / abandoned: held (here, or by a live process) is not abandoned; the file of a SIGKILLed holder
    is, and names it; a body that ends removes its file; a path with no file tells nothing."""
    with locks.process_lock(tmp_path, "final") as mine:
        assert mine.parent == tmp_path and mine.name.startswith(f"final-{os.getpid()}-")
        assert locks.abandoned(mine) is None  # held by this process (another open file conflicts with its flock)
    assert not mine.exists()
    assert locks.abandoned(tmp_path / "final-1-none.lock") is None
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; from pathlib import Path; from study.records import locks\n"
         f"with locks.process_lock(Path({str(tmp_path)!r}), 'final') as p:\n    print(p, flush=True); sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        theirs = Path(holder.stdout.readline().strip())
        assert locks.abandoned(theirs) is None  # its process holds it
    finally:
        holder.kill()
        holder.wait()
    assert theirs.exists()  # SIGKILL ran nothing: the file stays, unheld
    assert locks.abandoned(theirs).startswith(f"pid {holder.pid} on ")


def test_a_second_final_of_a_study_exits_2_naming_the_first_and_writes_nothing(runs, tmp_path, capsys):
    """Before: two ``study.final --study NAME`` at once both trained: the study's parent got two final-NAME-seed0 runs and
    the registry two versions. Now the second is refused in one line naming the first, before any run exists."""
    from study.final import cli as final
    from study.records import parent, tracking
    from tests.conftest import recorded_params
    from tests.test_final import write_config

    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    best = write_config(tmp_path / "best_config.yaml")
    parent_id = parent.create_parent_run(client, tracking.setup(uri, "dml-studies"), "s1", str(best), recorded_params(final_epochs=2))
    client.set_terminated(parent_id)
    with locks.final_lock(runs / "locks", "s1"):
        code = final.main(["--study", "s1", "--seeds", "1"])
    err = capsys.readouterr().err
    assert code == 2 and f"--study s1: a study.final of study s1 is running: pid {os.getpid()} on " in err and err.count("\n") == 1
    children = client.search_runs([client.get_run(parent_id).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    assert children == [] and client.search_registered_models() == []
    with locks.final_lock(runs / "locks", "s1"):  # released by the refused one
        pass

"""An Optuna storage on a real PostgreSQL server the test starts (Debian's postgresql; .ci/run installs it): a study
with a password in its --optuna-storage URL, its driver SIGKILLed mid-study and resumed, every trial recorded once,
and the password in no file the study wrote (the study's runs folder, Ray Tune's state, Ray's session folder).

Skipped, saying so, where no PostgreSQL server is installed; in CI (``$CI`` set), where it must be, that fails.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from tests.test_rehearsal import assert_recorded_once
from tests.test_resume import FREQUENT_SNAPSHOTS, run_and_kill, run_driver

pytestmark = pytest.mark.slow

STUDY = ["--rehearse", "0.3", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "4", "--epochs", "6", "--confirm-budget", "0"]


def server_binaries() -> Path | None:
    """The folder of initdb and pg_ctl: on the PATH, else Debian's /usr/lib/postgresql/VERSION/bin."""
    if found := shutil.which("initdb"):
        return Path(found).resolve().parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(folders[-1]).parent if folders else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def postgres_server(password: str) -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 with the user ``dml`` (``password``, scram-sha-256) and a database ``studies``,
    for the block: yields its URL, password included. The server refuses to run as root: as root, it runs as the
    ``postgres`` user Debian's package creates."""
    binaries = server_binaries()
    if binaries is None:
        missing = "no PostgreSQL server installed (Debian: apt-get install postgresql; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(missing)  # CI must run it
        pytest.skip(missing)
    as_server: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="dml-pg-"))  # not under pytest's folder: root-only, the server could not enter
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a postgres user to run the PostgreSQL server as")
        os.chown(folder, account.pw_uid, account.pw_gid)
        as_server = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    secret_file = folder / "password"
    secret_file.write_text(password + "\n")
    if as_server:
        os.chown(secret_file, account.pw_uid, account.pw_gid)
    data, log = folder / "data", folder / "server.log"
    run = [*as_server, str(binaries / "initdb"), "-D", str(data), "-U", "dml", "--auth=scram-sha-256", f"--pwfile={secret_file}"]
    subprocess.run(run, check=True, capture_output=True)
    secret_file.unlink()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    subprocess.run([*as_server, str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "start"], check=True)
    try:
        env = {**os.environ, "PGPASSWORD": password}
        subprocess.run([str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "dml", "studies"], env=env, check=True)
        yield f"postgresql://dml:{password}@127.0.0.1:{port}/studies"
    finally:
        subprocess.run([*as_server, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def files_holding(folder: Path, needle: bytes) -> list[str]:
    """Every file under ``folder`` whose bytes hold ``needle``."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):  # a socket, a file Ray removes while it is read
                if needle in path.read_bytes():
                    found.append(str(path))
    return found


def trial_has_trained(runs: Path, name: str) -> bool:
    """A trial of the study has logged its second epoch in MLflow (read once the driver has made Tune's folder, after
    its MLflow store is set up)."""
    if not (runs / "ray" / name).is_dir():
        return False
    try:
        client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("dml-studies")
        found = client.search_runs([experiment.experiment_id], filter_string=f"tags.study_name = '{name}' and tags.kind = 'trial'")
        return any(len(client.get_metric_history(r.info.run_id, "train_loss")) >= 2 for r in found)
    except Exception:  # the store is still being written by the driver's first setup
        return False


def test_a_postgresql_study_killed_and_resumed_records_each_trial_once_and_writes_no_password(tmp_path):
    password = f"pw-{secrets.token_hex(12)}"
    runs = tmp_path / "runs"
    ray_tmp = Path(tempfile.mkdtemp(prefix="dml-ray-"))  # short: Ray's socket paths must fit in 107 characters
    env = {**os.environ, **FREQUENT_SNAPSHOTS, "DML_RUNS_DIR": str(runs), "RAY_TMPDIR": str(ray_tmp)}
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        with postgres_server(password) as url:
            argv = [*STUDY, "--optuna-storage", url, "--study-name", "pg"]
            run_and_kill(argv, env, lambda: trial_has_trained(runs, "pg"))
            resumed = run_driver(["--resume", "--study-name", "pg", "--optuna-storage", url], env)
            assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
            assert_recorded_once(runs, "pg", 4, storage=url)
            assert password not in resumed.stdout + resumed.stderr
            assert files_holding(runs, password.encode()) == []  # MLflow's store, Tune's state, logs, spool
            assert files_holding(ray_tmp, password.encode()) == []  # Ray's session: its logs and state
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

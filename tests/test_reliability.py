"""Faults a study must survive, and the catalogue of bad input that must stop it before it costs anything.

Bad input: every case ends with a one-line error naming the file or flag, exit status 2, within
seconds, and leaves no MLflow run, no Optuna study and no Ray running. Faults: an MLflow server that is
unreachable at start or goes away mid-study (a real ``mlflow server`` on loopback), a trial that
diverges, a worker node that dies, an unwritable storage path.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import mlflow
import optuna
import pytest
import ray
import yaml

from study.final import cli as final
from study.launch import cli as launch
from study.search.journal import open_storage
from tests.conftest import ROOT, wait_for, write_malicious_pickle

SMOKE = ROOT / "search_spaces" / "smoke.yaml"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def smoke_with(tmp_path: Path, name: str, **changes) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    for key, value in changes.items():
        section, _, name_ = key.partition("__")
        if value is None:
            data[section].pop(name_, None)
        else:
            data.setdefault(section, {})[name_] = value
    return write(tmp_path / f"{name}.yaml", yaml.safe_dump(data, sort_keys=False))


def bad_inputs(tmp_path: Path) -> list[tuple[str, list[str], str]]:
    """(case, argv of study.launch or study.final, text the error must contain)."""
    spaces = {
        "yaml syntax error": (write(tmp_path / "syntax.yaml", "params: {loss: [softmax\n"), "YAML syntax error"),
        "unknown parameter": (smoke_with(tmp_path, "unknown", params__alfa={"type": "float", "low": 1, "high": 2}), "alfa"),
        "wrong type": (smoke_with(tmp_path, "wrongtype", params__lr={"type": "floaty", "low": 1, "high": 2}), "params.lr.type"),
        "low above high": (smoke_with(tmp_path, "lowhigh", params__lr={"type": "float", "low": 0.1, "high": 0.01}), "low=0.1 > high=0.01"),
        "log range through 0": (
            smoke_with(tmp_path, "log0", params__lr={"type": "float", "low": 0.0, "high": 0.01, "log": True}),
            "params.lr.low",
        ),
        "empty choices": (smoke_with(tmp_path, "empty", params__loss={"type": "categorical", "choices": []}), "params.loss.choices"),
        "condition on a missing parameter": (
            smoke_with(tmp_path, "cond", params__ice_scale={"type": "float", "low": 4, "high": 8, "when": {"los": "ice"}}),
            "when.los",
        ),
        "batch composition the dataset cannot fill": (
            smoke_with(tmp_path, "toomany", params__classes_per_batch={"type": "int", "low": 8, "high": 64, "step": 8}),
            "classes_per_batch",
        ),
        "samples_per_class < 2 with ICE": (smoke_with(tmp_path, "ice1", fixed__samples_per_class=1), "samples_per_class"),
        "heating_target above alpha": (
            smoke_with(tmp_path, "heat", fixed__heating="two_stage", fixed__heating_target=64.0),
            "heating_target",
        ),
        "top level not a mapping": (write(tmp_path / "list.yaml", "- 1\n- 2\n"), "expected a mapping"),
        "unknown fixed key": (smoke_with(tmp_path, "fixedkey", fixed__epoch=3), "fixed.epoch"),
        "step with log": (
            smoke_with(tmp_path, "steplog", params__lr={"type": "float", "low": 0.001, "high": 0.01, "log": True, "step": 0.001}),
            "params.lr.step",
        ),
        "missing space file": (tmp_path / "nope.yaml", "nope.yaml"),
    }
    cases = [(f"space: {k}", ["--space", str(path)], text) for k, (path, text) in spaces.items()]
    flags = [
        ("negative --num-samples", ["--num-samples", "-3"], "--num-samples"),
        ("unknown --metric", ["--metric", "val_accuracy"], "--metric"),
        ("study name with a path separator", ["--study-name", "a/b"], "--study-name"),
        ("study name with ..", ["--study-name", "..x"], "--study-name"),
        ("--resume of a study that does not exist", ["--resume", "--study-name", "ghost"], "ghost"),
        ("--gpus-per-trial on a cluster without GPUs", ["--gpus-per-trial", "1"], "--gpus-per-trial"),
        ("--cpus-per-trial more than any node has", ["--cpus-per-trial", "64"], "--cpus-per-trial 64 --gpus-per-trial 0: no node"),
        ("zero --max-concurrent", ["--max-concurrent", "0"], "--max-concurrent"),
        ("--grace-period above the epochs", ["--grace-period", "9"], "--grace-period"),
        ("--reduction-factor 1", ["--reduction-factor", "1"], "--reduction-factor"),
        ("unknown --dataset", ["--dataset", "mnist"], "mnist"),
        ("unreachable --tracking-uri", ["--tracking-uri", f"http://127.0.0.1:{refused_port()}"], "unreachable"),
        ("storage path below a file", ["--storage-path", str(write(tmp_path / "afile", "x") / "ray")], "--storage-path"),
    ]
    cases += [(f"flag: {k}", ["--space", str(SMOKE), *argv], text) for k, argv, text in flags]
    empty_data = tmp_path / "emptydata"
    (empty_data / "omniglot").mkdir(parents=True)
    cases += [
        (
            "data: missing data root",
            ["--space", str(smoke_with(tmp_path, "omni", fixed__dataset="omniglot")), "--data-root", str(tmp_path / "none")],
            "none",
        ),
        (
            "data: omniglot zips missing",
            ["--space", str(smoke_with(tmp_path, "omni2", fixed__dataset="omniglot")), "--data-root", str(empty_data)],
            "images_background_small1.zip",
        ),
    ]
    return cases


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HELD_PORTS: list[socket.socket] = []


def refused_port() -> int:
    """A loopback port that refuses connections for the rest of this test process: bound and never listening, so that
    no other process (a Ray or MLflow server of a test running beside it) can take it, as it could a free_port()."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    HELD_PORTS.append(held)
    return held.getsockname()[1]


def assert_nothing_left(runs: Path) -> None:
    db = runs / "mlflow.db"
    if db.exists():
        client = mlflow.MlflowClient(f"sqlite:///{db}")
        experiments = client.search_experiments()
        assert not client.search_runs([e.experiment_id for e in experiments]) if experiments else True
    journal = runs / "optuna" / "journal.log"
    if journal.exists():
        assert optuna.study.get_all_study_summaries(open_storage(f"journal:{journal}")) == []
    assert not ray.is_initialized()


def test_bad_input_catalogue(tmp_path, runs, capsys):
    cases = bad_inputs(tmp_path)
    assert len(cases) >= 28
    for case, argv, text in cases:
        started = time.time()
        try:
            code = launch.main(argv)
        except SystemExit as exit_:  # argparse errors
            code = exit_.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, case
        assert err and text in err[-1], (case, err[-1:])
        assert time.time() - started < 30, case
        assert_nothing_left(runs)


def test_bad_final_inputs(tmp_path, runs, capsys, monkeypatch):
    cases = [
        (
            "truncated checkpoint as weights",
            {"backbone": "resnet18", "pretrained": str(write(tmp_path / "trunc.pt", "PK\x03\x04trunc"))},
            "trunc.pt",
        ),
        ("a pickle that is not a state dict", {"backbone": "small_cnn", "pretrained": str(pickled_payload(tmp_path))}, "payload.pt"),
        ("image_size too small for small_cnn", {"image_size": 8}, "image_size"),
        ("unknown optimizer", {"optimizer": "lion"}, "optimizer"),
    ]
    for case, changes, text in cases:
        config = write(tmp_path / "c.yaml", yaml.safe_dump({"dataset": "synthetic", "epochs": 1, "classes_per_batch": 4, **changes}))
        code = final.main(["--config", str(config), "--tracking-uri", f"sqlite:///{runs / 'mlflow.db'}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and text in err[-1], (case, err[-1:])
        assert_nothing_left(runs)
    assert not (tmp_path / "pwned").exists()  # the payload never ran


def pickled_payload(tmp_path: Path) -> Path:
    return write_malicious_pickle(tmp_path / "payload.pt", tmp_path / "pwned", key="state")


@pytest.mark.slow
def test_unreachable_mlflow_fails_fast(tmp_path, runs, capsys):
    """Refused and black-holed connections: the launch stops before any trial, in seconds, naming the URI."""
    refused = f"http://127.0.0.1:{refused_port()}"
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)  # accepts the TCP handshake, never answers
    black_holed = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        for uri in (refused, black_holed):
            started = time.time()
            code = launch.main(["--space", str(SMOKE), "--tracking-uri", uri])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and uri in err[-1] and "unreachable" in err[-1]
            assert time.time() - started < 15
            assert_nothing_left(runs)
    finally:
        hole.close()


class MlflowServer(NamedTuple):
    """A test's MLflow server: started again, stopped (killed), stalled (its processes stopped: it accepts connections
    and answers nothing) and woken."""

    start: Callable[[], None]
    stop: Callable[[], None]
    stall: Callable[[], None]
    wake: Callable[[], None]


@contextlib.contextmanager
def mlflow_server(folder: Path, port: int):
    """A real MLflow tracking server on loopback (``MlflowServer``)."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{folder / 'server.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
    ]
    # no job runner: its seven huey consumers cost about 24 CPU-s at each start (cluster.yaml does the same)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    procs = []

    def start():
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                import urllib.request

                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError("mlflow server did not start")

    def signal_all(signum: int) -> None:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signum)

    def stop():
        signal_all(signal.SIGCONT)  # a stalled server is killed too
        signal_all(signal.SIGKILL)
        for proc in procs:
            proc.wait()

    start()
    try:
        yield MlflowServer(start, stop, stall=lambda: signal_all(signal.SIGSTOP), wake=lambda: signal_all(signal.SIGCONT))
    finally:
        stop()


def outage_seen(spool: Path, records: int) -> bool:
    """The driver's spool events say MLflow is unreachable, and at least ``records`` records wait in the spool."""
    events = spool.with_name(spool.name + ".events")
    try:
        unreachable = events.is_file() and '"unreachable"' in events.read_text()
        return unreachable and spool.is_file() and len(spool.read_text().splitlines()) >= records
    except OSError:  # the spool is being replaced (os.replace) or removed as the records are written
        return False


@pytest.mark.faults
@pytest.mark.slow
def test_mlflow_server_going_away_mid_study_loses_nothing(tmp_path, runs, capsys):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    with mlflow_server(tmp_path / "server", port) as server:
        start, stop = server.start, server.stop
        outcome = {}

        def outage():
            client = mlflow.MlflowClient(uri)
            deadline = time.time() + 240
            while time.time() < deadline:  # wait until a trial has written something, then stop the server
                try:
                    exp = client.get_experiment_by_name("dml-studies")
                    if exp and client.search_runs([exp.experiment_id], filter_string="tags.kind = 'trial'"):
                        break
                except Exception:
                    pass
                time.sleep(1)
            stop()
            outcome["stopped"] = time.time()
            # the outage lasts until the driver has found the server gone and keeps records of this study's trials in
            # its spool (an event, not a fixed time: on a slow machine a fixed outage can end before anything is kept)
            with contextlib.suppress(AssertionError):  # the main thread asserts "kept"; the server comes back either way
                wait_for(lambda: outage_seen(runs / "spool" / "outage.jsonl", 2), 240, "the driver to keep records of the outage")
            outcome["kept"] = outage_seen(runs / "spool" / "outage.jsonl", 2)
            start()
            outcome["restarted"] = time.time()

        thread = threading.Thread(target=outage, daemon=True)
        thread.start()
        code = launch.main(
            [
                "--rehearse",  # the recorder is under test, not the training: surrogate epochs of 0.5 s on any machine
                "0.5",
                "--space",
                str(SMOKE),
                "--num-samples",
                "4",
                "--epochs",
                "6",
                "--grace-period",
                "6",
                "--tracking-uri",
                uri,
                "--study-name",
                "outage",
                "--confirm-budget",  # the search's records are under test; no second Tuner of confirmation runs
                "0",
            ]
        )
        thread.join(timeout=300)
        out = capsys.readouterr().out
        assert "stopped" in outcome and "restarted" in outcome
        assert outcome["kept"]  # the server came back only after the driver had kept records of the outage
        assert code == 0
        assert "MLflow was unreachable" in out  # the end summary says what happened
        if "could not be written at the end" in out:  # the study ended before the server came back
            assert "-m study.sync --study outage" in out  # this interpreter: python or python3
            from study import sync

            assert sync.main(["--study", "outage", "--tracking-uri", uri]) == 0
        events = [json.loads(line)["event"] for line in (runs / "spool" / "outage.jsonl.events").read_text().splitlines()]
        assert events[0] == "unreachable" and events[-1] == "reachable again"
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name("dml-studies")
        found = client.search_runs([exp.experiment_id], filter_string="tags.study_name = 'outage'")
        children = [r for r in found if r.data.tags.get("kind") == "trial"]
        parent = [r for r in found if r.data.tags.get("kind") == "study"][0]
        assert len(children) == 4 and parent.info.status == "FINISHED"
        for run in children:  # every epoch of every trial reached MLflow, once
            assert run.info.status == "FINISHED"
            assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == list(range(1, 7))
        assert not (runs / "spool" / "outage.jsonl").exists()


@pytest.mark.faults
@pytest.mark.slow
def test_diverging_trial_fails_everywhere_and_others_go_on(tmp_path, runs, capsys):
    space = {
        "fixed": {
            "dataset": "synthetic",
            "epochs": 3,
            "embedding_dim": 16,
            "samples_per_class": 2,
            "classes_per_batch": 8,
            "normalization": "none",
            "weight_norm": False,
            "heating": "none",
        },
        "variants": {"sane": {"optimizer": "adam", "lr": 0.001}, "huge_lr": {"optimizer": "sgd", "lr": 1.0e12, "momentum": 0.0}},
    }
    path = write(tmp_path / "diverge.yaml", yaml.safe_dump(space))
    code = launch.main(["--space", str(path), "--study-name", "diverge", "--grace-period", "3"])
    assert code == 0
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("dml-studies")
    children = client.search_runs([exp.experiment_id], filter_string="tags.kind = 'trial'")
    by_variant = {("sgd" if r.data.params["optimizer"] == "sgd" else "adam"): r for r in children}
    bad, good = by_variant["sgd"], by_variant["adam"]
    assert bad.info.status == "FAILED" and "non-finite loss" in bad.data.tags["failure_reason"]
    assert good.info.status == "FINISHED"
    study = optuna.load_study(study_name="diverge", storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}"))
    states = {t.user_attrs["config"]["optimizer"]: t.state.name for t in study.trials}
    assert states == {"sgd": "FAIL", "adam": "COMPLETE"}
    assert math.isfinite(study.best_value) and study.best_trial.user_attrs["config"]["optimizer"] == "adam"


def trial_epochs(uri: str, study: str) -> dict[str, int]:
    try:
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name("dml-studies")
        if exp is None:
            return {}
        found = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{study}' and tags.kind = 'trial'")
        return {
            r.data.tags["trial_id"]: max((m.step for m in client.get_metric_history(r.info.run_id, "train_loss")), default=0) for r in found
        }
    except Exception:  # the store is being created
        return {}


@pytest.mark.faults
@pytest.mark.slow
def test_worker_node_dies_mid_trial(tmp_path, runs):
    """A node is removed mid-trial: its trial continues from its last checkpoint on the other node."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    cluster.wait_for_nodes()
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    seen: dict[str, int] = {}

    def remove_a_node():
        deadline = time.time() + 300
        while time.time() < deadline:
            epochs = trial_epochs(uri, "node-loss")
            if len(epochs) == 2 and min(epochs.values()) >= 2:
                seen.update(epochs)
                break
            time.sleep(0.5)
        cluster.remove_node(workers[0], allow_graceful=False)

    thread = threading.Thread(target=remove_a_node, daemon=True)
    thread.start()
    try:
        code = launch.main(
            [
                "--space",
                str(SMOKE),
                "--num-samples",
                "2",
                "--epochs",
                "8",
                "--grace-period",
                "8",
                "--address",
                cluster.address,
                "--study-name",
                "node-loss",
                "--max-failures",
                "2",
                "--checkpoint-every",  # every epoch: a moved trial continues from the epoch it reached
                "0",
                "--confirm-budget",  # the search's trials are under test; no second Tuner of confirmation runs
                "0",
            ]
        )
    finally:
        thread.join(timeout=60)
        cluster.shutdown()
    assert code == 0 and seen, "the node was not removed while both trials ran"
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("dml-studies")
    children = client.search_runs([exp.experiment_id], filter_string="tags.kind = 'trial'")
    assert len(children) == 2
    moved = 0
    for run in children:
        assert run.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == list(range(1, 9))
        resumed = int(run.data.tags.get("resumed_from_epoch", 0))
        if resumed > 0:  # the trial of the removed node: at most one epoch recomputed
            moved += 1
            assert resumed >= seen[run.data.tags["trial_id"]] - 1
        assert run.data.tags["node_id"] != workers[0].node_id  # its last epochs ran on the surviving node
    assert moved == 1
    study = optuna.load_study(study_name="node-loss", storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}"))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


WRITER = """
import sys, optuna
from study.search.journal import open_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="shared", storage=open_storage(sys.argv[1]))
for i in range(int(sys.argv[2])):
    trial = study.ask()
    trial.report(float(i), 1)
    study.tell(trial, float(i))
"""


def test_concurrent_writers_lose_no_optuna_records(tmp_path):
    """Several processes finishing trials at once on the journal storage: every trial is recorded, none corrupt."""
    url = f"journal:{tmp_path / 'journal.log'}"
    optuna.create_study(study_name="shared", storage=open_storage(url), direction="maximize")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, url, "25"], cwd=ROOT) for _ in range(4)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    trials = optuna.load_study(study_name="shared", storage=open_storage(url)).trials
    assert len(trials) == 100 and len({t.number for t in trials}) == 100
    assert all(t.state.name == "COMPLETE" and t.intermediate_values == {1: t.value} for t in trials)


# AWS access key ids and secret keys, private keys, GitHub tokens
CREDENTIAL = re.compile(r"AKIA[0-9A-Z]{16}|(?i:aws_secret_access_key)\s*[=:]|-----BEGIN [A-Z ]*PRIVATE KEY-----|ghp_[A-Za-z0-9]{36}")
# installed packages and caches: skipped outside a git checkout
NOT_SOURCE = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", "node_modules"}


def repository_files(root: Path) -> list[Path]:
    """The files a commit of ``root`` would hold: git's tracked and untracked, not ignored ones.

    Outside a git checkout (an unpacked archive, or no git), every file outside :data:`NOT_SOURCE`.
    """
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True, text=True
        )
    except FileNotFoundError:
        listed = None
    if listed is not None and listed.returncode == 0:
        return [root / name for name in listed.stdout.split("\0") if name and (root / name).is_file()]

    def source(path: Path) -> bool:
        return not NOT_SOURCE.intersection(path.relative_to(root).parts[:-1])

    return sorted(path for path in root.rglob("*") if path.is_file() and source(path))


def credential_hits(files: list[Path]) -> list[Path]:
    """The files among ``files`` whose text matches :data:`CREDENTIAL`."""
    return [path for path in files if CREDENTIAL.search(path.read_text(errors="ignore"))]


# Planted credentials are built from pieces so that this file never matches CREDENTIAL itself.
PLANTED = {
    "aws secret": "aws_secret_access_key" + " = abc",
    "aws secret, env style": "AWS_SECRET_ACCESS_KEY" + ": abc",
    "aws key id": "id = AKIA" + "ABCDEFGHIJKLMNOP",
    "private key": "-----BEGIN RSA " + "PRIVATE KEY-----",
    "github token": "token: ghp_" + "a1" * 18,
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_credential_scan_finds_a_planted_secret(tmp_path, kind):
    (tmp_path / "clean.py").write_text("password_field = 'aws_secret_access_key'\n")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / ".env").write_text(f"region = eu-west-1\n{PLANTED[kind]}\n")
    assert credential_hits(repository_files(tmp_path)) == [tmp_path / ".ci" / ".env"]


def test_credential_scan_reads_tracked_and_new_files_of_a_git_checkout(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("ignored.txt\n")
    (tmp_path / "tracked.yaml").write_text(PLANTED["aws secret"] + "\n")
    git("add", "tracked.yaml", ".gitignore")
    (tmp_path / "new.py").write_text(PLANTED["github token"] + "\n")
    (tmp_path / "ignored.txt").write_text(PLANTED["aws key id"] + "\n")
    files = repository_files(tmp_path)
    assert sorted(p.name for p in files) == [".gitignore", "new.py", "tracked.yaml"]
    assert sorted(p.name for p in credential_hits(files)) == ["new.py", "tracked.yaml"]


def test_credential_scan_of_a_clean_folder_finds_nothing(tmp_path):
    (tmp_path / "a.py").write_text("key_id = os.environ['AWS_ACCESS_KEY_ID']\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "secret.txt").write_text(PLANTED["aws secret"] + "\n")  # installed packages: skipped
    files = repository_files(tmp_path)
    assert files == [tmp_path / "a.py"] and credential_hits(files) == []


def test_no_credentials_in_the_repository():
    files = repository_files(ROOT)
    assert ROOT / "pyproject.toml" in files, f"the scan of {ROOT} found {len(files)} files and not pyproject.toml"
    assert credential_hits(files) == []


@pytest.mark.faults
@pytest.mark.slow
def test_trial_that_raises_is_retried_from_its_checkpoint(tmp_path, runs, monkeypatch):
    """Every trial raises once while finishing epoch 2 (a simulated out-of-memory error). With a retry it continues
    from its last checkpoint (epoch 1: the failing epoch was never reported). Without one it fails, its error kept:
    test_a_study_where_every_trial_fails_exits_1_and_says_why."""
    monkeypatch.setenv("DML_INJECT_FAULT_AT_EPOCH", "2")
    name = "flaky"
    code = launch.main(
        [
            "--space",
            str(SMOKE),
            "--num-samples",
            "2",
            "--epochs",
            "4",
            "--grace-period",
            "4",
            "--study-name",
            name,
            "--max-failures",
            "1",
            "--checkpoint-every",  # every epoch: the retry continues from epoch 1
            "0",
            "--confirm-budget",  # the search's trials are under test; no second Tuner of confirmation runs
            "0",
        ]
    )
    assert code == 0
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("dml-studies")
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{name}' and tags.kind = 'trial'")
    study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}"))
    assert len(children) == 2
    for run in children:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert run.info.status == "FINISHED" and steps == [1, 2, 3, 4]
        assert int(run.data.tags.get("resumed_from_epoch", 0)) == 1  # continued from its last checkpoint, not from scratch
    assert {t.state.name for t in study.trials} == {"COMPLETE"}


def test_the_reasons_of_a_study_without_a_complete_trial_are_counted_and_its_parent_failed(runs):
    """tracking.fail_study: each distinct failure_reason of the study's trial runs once, with how many it hit, most first."""
    from study.records import parent, tracking
    from tests.conftest import recorded_params

    uri = tracking.resolve_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    experiment_id = tracking.setup(uri, "dml-studies")
    parent_id = parent.create_parent_run(client, experiment_id, "doomed", str(SMOKE), recorded_params())
    client.set_terminated(parent_id)  # as the end of the study leaves it
    for i, reason in enumerate(
        ["OSError: a.png: unreadable image", "ValueError: seed out of range", "OSError: a.png: unreadable image", None]
    ):
        tags = {"mlflow.parentRunId": parent_id, "kind": "trial", "trial_id": f"t{i}"}
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        if reason is not None:
            client.set_tag(run_id, "failure_reason", reason)
        client.set_terminated(run_id, "FINISHED" if reason is None else "FAILED")  # the last one: stopped early, not failed
    reasons = tracking.fail_study(uri, parent_id)
    assert reasons == [("OSError: a.png: unreadable image", 2), ("ValueError: seed out of range", 1)]
    run = client.get_run(parent_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == "no trial completed (3 failed, 1 stopped early)"


@pytest.mark.faults
@pytest.mark.slow
def test_a_study_where_every_trial_fails_exits_1_and_says_why(tmp_path, runs, capsys, monkeypatch):
    """Issue 33, finding 5: a study where every trial failed exited 0, its parent FINISHED, the terminal saying only
    "<id> failed". Now: exit 1, the parent FAILED, and each distinct reason printed once with the trials it hit. Each
    trial run keeps the epoch it reported before the fault, and its error; Optuna has each trial FAIL."""
    monkeypatch.setenv("DML_INJECT_FAULT_AT_EPOCH", "2")  # every trial raises in its second epoch; --max-failures 0: no retry
    argv = ["--space", str(SMOKE), "--rehearse", "0", "--ray-cpus", "2", "--num-samples", "3", "--max-failures", "0"]
    code = launch.main([*argv, "--grace-period", "4", "--study-name", "doomed"])  # no rung before the fault
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "error: study doomed: no trial completed (3 failed); the reasons:" in err
    assert [line for line in err.splitlines() if "injected fault" in line] == [
        "  3 trials: RuntimeError: injected fault at epoch 2 (simulated out of memory)"
    ]
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("dml-studies").experiment_id
    study = client.search_runs([experiment_id], filter_string="tags.kind = 'study'")[0]
    assert study.info.status == "FAILED" and study.data.tags["failure_reason"] == "no trial completed (3 failed)"
    trials = client.search_runs([experiment_id], filter_string="tags.kind = 'trial'")
    assert len(trials) == 3
    for run in trials:
        assert run.info.status == "FAILED" and "injected fault at epoch 2" in run.data.tags["failure_reason"]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1]  # the failing epoch unreported
    journal = open_storage(f"journal:{runs / 'optuna' / 'journal.log'}")
    assert {t.state.name for t in optuna.load_study(study_name="doomed", storage=journal).trials} == {"FAIL"}

"""study.final through an outage of its MLflow server: the training goes on, the records wait in a spool and reach
MLflow once it answers again; stopped meanwhile, the next study.final writes what was kept and ends the runs KILLED.

The server is stalled (its processes stopped: it accepts connections and answers nothing), the worst case for a
client, whose calls wait for their timeouts. Every wait is on an event (a line printed, a point in MLflow, an exit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import mlflow

from tests.conftest import ROOT, wait_for
from tests.test_final import write_config
from tests.test_reliability import free_port, mlflow_server


class Final:
    """A study.final in a subprocess whose printed lines are collected as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def printed(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait(self, timeout: float) -> tuple[int, str, str]:
        err = self.process.stderr.read()
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=60)
        return code, "".join(self.lines), err


def seed_points(uri: str, run_name: str) -> list[int]:
    """The steps of train_loss in the run ``run_name`` (an empty list before it exists or while the server is away)."""
    try:
        client = mlflow.MlflowClient(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        found = client.search_runs(experiments, filter_string=f"attributes.run_name = '{run_name}'") if experiments else []
        return [m.step for run in found for m in client.get_metric_history(run.info.run_id, "train_loss")]
    except Exception:  # the server is starting, or stalled
        return []


def final_argv(config: Path, uri: str) -> list[str]:
    return [sys.executable, "-m", "study.final", "--config", str(config), "--tracking-uri", uri, "--seeds", "1"]


def test_a_final_trains_on_through_a_stalled_server_and_records_everything_once_it_answers(tmp_path):
    """Before: the first epoch logged to the stalled server stopped the training; about 100 s later the command died
    with a traceback, its runs RUNNING."""
    port, epochs = free_port(), 30
    uri, env = f"http://127.0.0.1:{port}", {**os.environ, "DML_RUNS_DIR": str(tmp_path / "runs")}
    config = write_config(tmp_path / "tiny.yaml", epochs=epochs)
    with mlflow_server(tmp_path / "server", port) as server:
        final = Final(final_argv(config, uri), env)
        try:
            wait_for(lambda: seed_points(uri, "final-seed0-tiny"), 600, "the seed's first epoch in MLflow", process=final.process)
            server.stall()
            # the training goes on to its last epoch while the server answers nothing
            wait_for(lambda: final.printed(f"epoch {epochs:3d}/{epochs}"), 600, "the last epoch", process=final.process)
            wait_for(lambda: final.printed("does not answer"), 600, "the line that says MLflow is away", process=final.process)
            server.wake()
            code, out, err = final.wait(timeout=600)
        finally:
            final.process.kill()
        assert code == 0, err[-3000:]
        assert "answers again" in out
        client = mlflow.MlflowClient(uri)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]  # the parent and its seed
        (seed,) = [r for r in runs if r.data.tags.get("kind") == "final_seed"]
        assert sorted(m.step for m in client.get_metric_history(seed.info.run_id, "train_loss")) == list(range(1, epochs + 1))
        assert "test_recall_at_1" in seed.data.metrics
        models = [m for m in client.search_logged_models([seed.info.experiment_id]) if m.source_run_id == seed.info.run_id]
        assert [str(m.status) for m in models] == ["READY"]  # the seed's model, logged once
        versions = [v for v in client.search_model_versions() if v.run_id == seed.info.run_id]
        assert len(versions) <= 1  # registered once, however often a write was tried
    assert not list((tmp_path / "runs" / "spool").glob("final-*.jsonl"))


def test_a_final_stopped_while_its_server_is_away_is_ended_by_the_next_one(tmp_path):
    """A signal while the server does not answer: the command says its runs stay RUNNING and where its records wait,
    and exits 128 + signum at once; the next study.final writes the kept epochs and ends the runs KILLED.
    Before: the runs stayed RUNNING for good (the next study.final found no lock to tell it their writer was gone)."""
    port = free_port()
    uri, env = f"http://127.0.0.1:{port}", {**os.environ, "DML_RUNS_DIR": str(tmp_path / "runs")}
    with mlflow_server(tmp_path / "server", port) as server:
        final = Final(final_argv(write_config(tmp_path / "long.yaml", epochs=500), uri), env)
        try:
            wait_for(lambda: seed_points(uri, "final-seed0-long"), 600, "the seed's first epoch in MLflow", process=final.process)
            server.stall()
            wait_for(lambda: final.printed("does not answer"), 600, "the line that says MLflow is away", process=final.process)
            printed = sum(" epoch " in line and "/500" in line for line in list(final.lines))  # the epoch lines
            final.process.send_signal(signal.SIGTERM)
            code, out, err = final.wait(timeout=600)
        finally:
            final.process.kill()
        assert code == 128 + signal.SIGTERM, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("study.final stopped by SIGTERM while MLflow did not answer: its runs stay RUNNING"), err[-3000:]
        assert len(err.strip().splitlines()) == 1, err[-3000:]
        server.wake()
        after = subprocess.run(
            final_argv(write_config(tmp_path / "short.yaml", epochs=1), uri), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert after.returncode == 0, after.stderr[-3000:]
        assert "marked KILLED 2 run(s) an earlier study.final left RUNNING" in after.stdout
        client = mlflow.MlflowClient(uri)
        runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
        stopped = runs["final-seed0-long"]
        assert stopped.info.status == "KILLED" and stopped.data.tags["failure_reason"].startswith("orphaned: ")
        steps = sorted(m.step for m in client.get_metric_history(stopped.info.run_id, "train_loss"))
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= printed  # every epoch printed, kept and written once
        assert runs["final-long"].info.status == "KILLED" and runs["final-short"].info.status == "FINISHED"
    assert not list((tmp_path / "runs" / "spool").glob("final-*.jsonl"))
    assert not list((tmp_path / "runs" / "locks").glob("final-*.lock"))

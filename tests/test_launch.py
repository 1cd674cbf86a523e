"""study.launch end to end on Ray: two nodes, the PRUNED coupling, MLflow records, kill and resume.

The smoke space trains tiny models on generated glyphs, so a whole study
takes about a minute on two CPUs.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml

from study import launch
from study.search import open_storage
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
EPOCHS = 4


def study_records(runs: Path, name: str, experiment: str = "dml-studies"):
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{name}'", max_results=1000)
    parent = [r for r in found if r.data.tags.get("kind") == "study"]
    children = [r for r in found if r.data.tags.get("kind") == "trial"]
    study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}"))
    return client, parent, children, study


@pytest.fixture(scope="module")
def two_node_study(tmp_path_factory):
    """The smoke space on a simulated two-node Ray cluster (1 CPU each), run once for this module."""
    from ray.cluster_utils import Cluster

    runs = tmp_path_factory.mktemp("runs")
    saved = {k: os.environ.get(k) for k in ("DML_RUNS_DIR", "MLFLOW_TRACKING_URI")}
    os.environ["DML_RUNS_DIR"] = str(runs)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    node_ids = {node.node_id for node in cluster.list_all_nodes()}
    try:
        code = launch.main(["--space", "smoke", "--num-samples", "6", "--max-concurrent", "2", "--epochs", str(EPOCHS),
                            "--grace-period", "1", "--reduction-factor", "2", "--address", cluster.address,
                            "--study-name", "two-nodes", "--seed", "3"])
        yield {"code": code, "runs": runs, "node_ids": node_ids}
    finally:
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_study_completes_on_both_nodes(two_node_study):
    assert two_node_study["code"] == 0
    _, _, children, _ = study_records(two_node_study["runs"], "two-nodes")
    used = {r.data.tags.get("node_id") for r in children}
    assert len(children) == 6
    assert used == two_node_study["node_ids"]  # trials ran on both nodes, and only on them


def test_mlflow_parent_children_metrics_and_artifacts(two_node_study):
    client, parent, children, study = study_records(two_node_study["runs"], "two-nodes")
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    parent = parent[0]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert len({r.data.tags["trial_id"] for r in children}) == len(children) == len(study.trials)
    for run in children:
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_recall_at_1")]
        assert steps == sorted(set(steps)) and steps == list(range(1, len(steps) + 1))  # per epoch, no duplicates
        assert run.data.params["dataset"] == "synthetic" and run.data.params["epochs"] == str(EPOCHS)
        assert run.data.tags["stopped_by_asha"] in ("true", "false")
        assert run.data.tags["device"] == "cpu" and run.data.tags["node"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    expected = {"best_config.yaml", "trials.csv", "optimization_history.png", "param_importances.png",
                "parallel_coordinate.png", "learning_curves.png"}
    assert expected <= artifacts
    finals = [r.data.metrics["val_recall_at_1"] for r in children if r.data.tags["stopped_by_asha"] == "false"]
    assert parent.data.metrics["best_val_recall_at_1"] == pytest.approx(max(finals))
    best = yaml.safe_load(open(mlflow.artifacts.download_artifacts(
        run_id=parent.info.run_id, artifact_path="best_config.yaml", tracking_uri=client.tracking_uri)))
    best_run = [r for r in children if r.data.tags["trial_id"] == parent.data.tags["best_trial"]][0]
    assert all(str(best[k]) == v for k, v in best_run.data.params.items())


def test_asha_stopped_trials_are_pruned_in_optuna(two_node_study):
    _, _, children, study = study_records(two_node_study["runs"], "two-nodes")
    by_trial = {r.data.tags["trial_id"]: r for r in children}
    states = []
    for trial in study.trials:
        run = by_trial[trial.user_attrs["tune_trial_id"]]
        epochs = len(trial.intermediate_values)
        if run.data.tags["stopped_by_asha"] == "true":
            assert trial.state.name == "PRUNED" and epochs < EPOCHS
        else:
            assert trial.state.name == "COMPLETE" and epochs == EPOCHS
            assert trial.value == pytest.approx(trial.intermediate_values[EPOCHS])
            assert trial.value == pytest.approx(run.data.metrics["val_recall_at_1"])
        states.append(trial.state.name)
    assert "PRUNED" in states and "COMPLETE" in states


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def epochs_logged(runs: Path, name: str) -> list[int]:
    db = runs / "mlflow.db"
    if not db.exists():
        return []
    try:
        client = mlflow.MlflowClient(f"sqlite:///{db}")
        exp = client.get_experiment_by_name("dml-studies")
        if exp is None:
            return []
        found = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{name}' and tags.kind = 'trial'")
        return [int(r.data.metrics.get("epoch", 0)) for r in found]
    except Exception:  # the database is being created by the driver
        return []


def test_sigkill_driver_then_resume_completes_without_duplicates(tmp_path):
    runs = tmp_path / "runs"
    env = {**os.environ, "DML_RUNS_DIR": str(runs)}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = ["--space", "smoke", "--num-samples", "4", "--max-concurrent", "2", "--epochs", "8", "--grace-period", "8",
            "--study-name", "killed"]
    driver = subprocess.Popen([sys.executable, "-m", "study.launch", *args], cwd=ROOT, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(e >= 2 for e in epochs_logged(runs, "killed")), 240, "a trial to log 2 epochs")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started
        driver.wait()
    before = epochs_logged(runs, "killed")
    out = subprocess.run([sys.executable, "-m", "study.launch", "--study-name", "killed", "--resume", "--space", "smoke"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    client, parent, children, study = study_records(runs, "killed")
    assert parent[0].info.status == "FINISHED"
    assert len(children) == len(study.trials) == 4  # exactly one child run per trial
    assert len({r.data.tags["trial_id"] for r in children}) == 4
    assert all(r.info.status == "FINISHED" for r in children)
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    for run in children:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "epoch")]
        assert steps == list(range(1, 9))
    # a trial that had checkpointed continued from it instead of starting over
    resumed = [max((m.value for m in client.get_metric_history(r.info.run_id, "resumed_from_epoch")), default=0) for r in children]
    assert max(resumed) >= 1 and max(before) >= 2
    assert all(not math.isnan(t.value) for t in study.trials)

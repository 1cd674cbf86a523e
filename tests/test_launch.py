"""study.launch end to end on Ray: two nodes, the PRUNED coupling, MLflow records, kill and resume.

The smoke space trains tiny models on generated glyphs, so a whole study
takes about a minute on two CPUs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml

from study.launch import cli as launch
from study.launch import tuner as launch_tuner
from study.launch.settings import shared_storage_note, study_settings
from study.launch.tuner import restore_tuner
from study.records import tracking
from study.records import trials as recorder
from study.report.finals import study_report
from study.search.journal import open_storage
from study.search.trial import CONFIRMS_KEY

pytestmark = pytest.mark.slow
EPOCHS = 4


def study_records(runs: Path, name: str, experiment: str = "dml-studies", storage: str | None = None):
    """A study's MLflow client, parent and trial runs, and its Optuna study (``storage``: else the runs folder's journal)."""
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.study_name = '{name}'", max_results=1000)
    parent = [r for r in found if r.data.tags.get("kind") == "study"]
    children = [r for r in found if r.data.tags.get("kind") == "trial"]
    study = optuna.load_study(study_name=name, storage=open_storage(storage or f"journal:{runs / 'optuna' / 'journal.log'}"))
    return client, parent, children, study


def use_runs(runs: Path):
    """Point study.launch at ``runs`` (module-scoped fixtures cannot use monkeypatch); returns the undo."""
    saved = {k: os.environ.get(k) for k in ("DML_RUNS_DIR", "MLFLOW_TRACKING_URI")}
    os.environ["DML_RUNS_DIR"] = str(runs)
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return restore


@pytest.fixture(scope="module")
def two_node_study(tmp_path_factory):
    """The smoke space on a simulated two-node Ray cluster (1 CPU each), run once for this module."""
    from ray.cluster_utils import Cluster

    runs = tmp_path_factory.mktemp("runs")
    restore = use_runs(runs)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    node_ids = {node.node_id for node in cluster.list_all_nodes()}
    try:
        code = launch.main(
            [
                "--space",
                "smoke",
                "--num-samples",
                "6",
                "--max-concurrent",
                "2",
                "--epochs",
                str(EPOCHS),
                "--grace-period",
                "1",
                "--reduction-factor",
                "2",
                "--address",
                cluster.address,
                "--study-name",
                "two-nodes",
                "--seed",
                "3",
                "--scheduler",  # the stock ASHA baseline: per-epoch rungs (the budget scheduler has its own tests below)
                "asha",
                "--confirm-budget",
                "0",
            ]
        )
        yield {"code": code, "runs": runs, "node_ids": node_ids}
    finally:
        cluster.shutdown()
        restore()


@pytest.mark.faults
def test_study_completes_on_both_nodes(two_node_study):
    assert two_node_study["code"] == 0
    _, _, children, _ = study_records(two_node_study["runs"], "two-nodes")
    used = {r.data.tags.get("node_id") for r in children}
    assert len(children) == 6
    assert used == two_node_study["node_ids"]  # trials ran on both nodes, and only on them


@pytest.mark.faults
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
        assert run.data.tags["stopped_early"] in ("true", "false")
        assert run.data.tags["device"] == "cpu" and run.data.tags["node"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    expected = {
        "best_config.yaml",
        "trials.csv",
        "optimization_history.png",
        "param_importances.png",
        "parallel_coordinate.png",
        "learning_curves.png",
    }
    assert expected <= artifacts
    finals = [r.data.metrics["val_recall_at_1"] for r in children if r.data.tags["stopped_early"] == "false"]
    # no race here: the pick is the best single score, and the parent names it both ways
    assert parent.data.metrics["pick_val_recall_at_1"] == pytest.approx(max(finals))
    assert parent.data.metrics["best_single_val_recall_at_1"] == pytest.approx(max(finals))
    best = yaml.safe_load(
        open(
            mlflow.artifacts.download_artifacts(
                run_id=parent.info.run_id, artifact_path="best_config.yaml", tracking_uri=client.tracking_uri
            )
        )
    )
    best_run = [r for r in children if r.data.tags["optuna_trial_number"] == parent.data.tags["picked_trial_number"]][0]
    assert best and all(best_run.data.params[k] == str(v) for k, v in best.items())  # the keys that apply, as the run had them


@pytest.mark.faults
def test_asha_stopped_trials_are_pruned_in_optuna(two_node_study):
    _, _, children, study = study_records(two_node_study["runs"], "two-nodes")
    by_trial = {r.data.tags["trial_id"]: r for r in children}
    states = []
    for trial in study.trials:
        run = by_trial[trial.user_attrs["tune_trial_id"]]
        epochs = len(trial.intermediate_values)
        if run.data.tags["stopped_early"] == "true":
            assert trial.state.name == "PRUNED" and epochs < EPOCHS
        else:
            assert trial.state.name == "COMPLETE" and epochs == EPOCHS
            assert trial.value == pytest.approx(trial.intermediate_values[EPOCHS])
            assert trial.value == pytest.approx(run.data.metrics["val_recall_at_1"])
        states.append(trial.state.name)
    assert "PRUNED" in states and "COMPLETE" in states


@pytest.mark.faults
def test_report_of_the_study(two_node_study, tmp_path, capsys):
    """python -m study.report on this study: the rung-correlation table and the top trials, checked against MLflow and Optuna."""
    from study.report import cli as report

    runs = two_node_study["runs"]
    client, parent, children, study = study_records(runs, "two-nodes")
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    out = tmp_path / "report"
    assert report.main(["--study", "two-nodes", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    assert parent[0].data.params["sampler"] == "tpe"
    text = (out / "report.md").read_text()
    assert "## Is early stopping trustworthy here?" in text
    section = text.split("## Is early stopping trustworthy here?")[1].split("\n## ")[0]
    rung_rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| rung")]
    assert [row.split("|")[1].strip() for row in rung_rows] == ["1", "2"]  # grace 1, factor 2, 4 epochs: rungs 1, 2
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert all(row.split("|")[3].strip() == str(len(complete)) for row in rung_rows)  # n = trials that ran every epoch
    by_trial = {r.data.tags["trial_id"]: r for r in children}
    for row in rung_rows:  # rho from the complete trials' histories in MLflow (NaN below 3 trials)
        rung = int(row.split("|")[1])
        if len(complete) < 3:
            assert row.split("|")[2].strip() == "nan"
            continue
        from scipy.stats import spearmanr

        histories = [
            {m.step: m.value for m in client.get_metric_history(by_trial[t.user_attrs["tune_trial_id"]].info.run_id, "val_recall_at_1")}
            for t in complete
        ]
        rho = spearmanr([h[rung] for h in histories], [h[EPOCHS] for h in histories]).statistic
        assert row.split("|")[2].strip() == f"{rho:.3f}"
    # the top row is the best COMPLETE trial, with its last val_recall_at_1 as MLflow has it
    best = max(by_trial[t.user_attrs["tune_trial_id"]].data.metrics["val_recall_at_1"] for t in complete)
    top = text.split("## Top trials by val_recall_at_1")[1].split("\n## ")[0]
    top_rows = [line for line in top.splitlines() if line.startswith("| ") and not line.startswith("| trial |")]
    assert len(top_rows) == len(complete)  # every complete trial (fewer than --top 10), no pruned one
    first_row = top_rows[0]
    best_ids = [
        t.user_attrs["tune_trial_id"] for t in complete if by_trial[t.user_attrs["tune_trial_id"]].data.metrics["val_recall_at_1"] == best
    ]
    assert any(trial_id in first_row.split("|")[1] for trial_id in best_ids)  # one of the best (ties possible)
    assert first_row.split("|")[2].strip() == f"{best:.4f}"
    assert first_row.split("|")[3].strip() == str(EPOCHS)
    assert (out / "learning_curves.png").is_file()
    assert client.list_artifacts(parent[0].info.run_id, "report") == []  # --no-log


def test_resumed_settings_come_from_the_parent_run_and_leave_args_alone(runs):
    """--resume without --space / --epochs continues with the study's own, read back from its parent run's params."""
    from study.records import parent, tracking

    started = study_settings(launch.parse_args(["--space", "smoke", "--epochs", "3", "--study-name", "earlier"]))
    uri = tracking.resolve_tracking_uri(None)
    experiment_id = tracking.setup(uri, "dml-studies")
    recorded = started.with_slots({"CPU": 2.0}).record.to_params()
    parent.create_parent_run(mlflow.MlflowClient(uri), experiment_id, "earlier", started.space.path, recorded)
    (runs / "ray" / "earlier").mkdir(parents=True)

    args = launch.parse_args(["--resume", "--study-name", "earlier"])
    resumed = study_settings(args)
    assert resumed.space.path == started.space.path and resumed.space.path.endswith("smoke.yaml")
    assert resumed.max_epochs == resumed.space.fixed["epochs"] == 3  # not the space file's 4
    assert resumed.resume and resumed.experiment_dir == str(runs / "ray" / "earlier")
    assert args.space is None and args.epochs is None  # the command line is read, never changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        resumed.max_epochs = 4
    with pytest.raises(launch.UsageError, match="--epochs 2: study earlier runs with 3"):  # a changed setting is refused
        study_settings(launch.parse_args(["--resume", "--study-name", "earlier", "--epochs", "2"]))


# -- the default scheduler: budget-aware successive halving, then confirmation runs -------------------
@pytest.fixture(scope="module")
def budget_study(tmp_path_factory):
    """The smoke space with the defaults of study.launch: budgets 2 and 4 (grace 2, eta 2), top 2 re-run with 1 extra seed."""
    runs = tmp_path_factory.mktemp("runs")
    restore = use_runs(runs)
    try:
        argv = ["--space", "smoke", "--num-samples", "5", "--epochs", str(EPOCHS), "--grace-period", "2", "--reduction-factor", "2"]
        code = launch.main([*argv, "--study-name", "budgets", "--seed", "1", "--confirm-top", "2"])
        yield {"code": code, "runs": runs}
    finally:
        restore()


def test_budget_rungs_see_finished_schedules(budget_study):
    assert budget_study["code"] == 0
    client, _, children, study = study_records(budget_study["runs"], "budgets")
    by_trial = {r.data.tags["trial_id"]: r for r in children}
    for trial in study.trials:
        run = by_trial[trial.user_attrs["tune_trial_id"]]
        history = {k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)} for k in ("budget", "lr_now", "alpha_now")}
        retrained = [m.step for m in client.get_metric_history(run.info.run_id, "retrained/train_loss")]
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert steps == list(range(1, len(steps) + 1)) == sorted(history["budget"])  # step = the schedule's epoch, once each
        ends = [step for step in history["budget"] if step == history["budget"][step]]
        for step in ends:  # every decision point: the schedule of that budget has decayed the lr (step x 0.1) and heated alpha
            assert history["lr_now"][step] == pytest.approx(trial.user_attrs["config"]["lr"] * 0.1)
            if trial.user_attrs["config"]["loss"] == "softmax":
                assert history["alpha_now"][step] == pytest.approx(4.0)  # the default heating_target
        assert set(trial.intermediate_values) == {int(history["budget"][s]) for s in ends}  # Optuna: values at the budgets only
        if trial.state.name == "COMPLETE":
            assert set(trial.intermediate_values) == {2, EPOCHS} and trial.value == pytest.approx(trial.intermediate_values[EPOCHS])
            assert steps == list(range(1, EPOCHS + 1)) and trial.user_attrs["epochs"] == EPOCHS
            # budget 4 continues after floor(0.75 x 2) = 1 epoch: its epoch 2 is budget 2's trained again, logged apart
            assert trial.user_attrs["epochs_trained"] == 2 + (EPOCHS - 1)
            assert retrained == [2] and run.data.tags["retrained_epochs"] == "2"
        else:
            assert trial.state.name == "PRUNED" and set(trial.intermediate_values) == {2}
            assert steps == [1, 2] and trial.user_attrs["epochs"] == 2 and not retrained


def test_confirmation_runs_name_the_best_mean(budget_study, tmp_path):
    import json

    client, parent, _, study = study_records(budget_study["runs"], "budgets")
    parent = parent[0]
    confirmations = tracking.child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="confirmation")
    selection = json.loads(
        open(
            mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="selection.json", tracking_uri=client.tracking_uri)
        ).read()
    )
    complete = sorted((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)
    # the first trial of each loss family passes its rungs (nothing to compare with yet): both families, 2 complete at least
    assert {t.user_attrs["config"]["loss"] for t in study.trials} == {"softmax", "ice"} and len(complete) >= 2
    assert len(confirmations) == 2 and all(r.info.status == "FINISHED" for r in confirmations)
    # each names the Optuna trial it re-ran, with that trial's config and the next seed
    for run in confirmations:
        number = int(run.data.tags["confirms_optuna_trial"])
        assert run.info.run_name == f"confirm-{number}-{run.data.tags['trial_id']}"
        config = study.trials[number].user_attrs["config"]
        assert run.data.params["lr"] == str(config["lr"]) and run.data.params["seed"] == str(config.get("seed", 0) + 1)
        # one schedule of the full budget, no ladder: no budget metric, EPOCHS epochs recorded
        assert "budget" not in run.data.metrics and "completed_budget" not in run.data.metrics
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == list(range(1, EPOCHS + 1))
    assert {e["trial"] for e in selection["ranking"]} == {t.number for t in complete[:2]}
    means = [e["mean"] for e in selection["ranking"]]
    assert means == sorted(means, reverse=True)
    assert all(len(e["scores"]) == 2 for e in selection["ranking"])
    winner = next(t for t in study.trials if t.number == selection["ranking"][0]["trial"])
    assert parent.data.tags["picked_trial_number"] == str(winner.number)
    assert parent.data.metrics["pick_val_recall_at_1"] == pytest.approx(winner.value)
    assert parent.data.metrics["pick_mean_val_recall_at_1"] == pytest.approx(selection["ranking"][0]["mean"])
    singles = [t.value for t in study.trials if t.state.name == "COMPLETE"]
    assert parent.data.metrics["best_single_val_recall_at_1"] == pytest.approx(max(singles))  # the race's pick or not
    assert parent.data.tags["pick_verdict"] == selection["verdict"]
    # what study.final --study trains as one model: the candidates the race kept, the winner first, with their configs
    tied_file = mlflow.artifacts.download_artifacts(
        run_id=parent.info.run_id, artifact_path="tied_configs.yaml", tracking_uri=client.tracking_uri
    )
    tied = yaml.safe_load(open(tied_file))
    assert [e["trial"] for e in tied] == [e["trial"] for e in selection["ranking"] if e["dropped_after_folds"] is None]
    assert [e["config"]["lr"] for e in tied] == [study.trials[e["trial"]].user_attrs["config"]["lr"] for e in tied]
    text = "\n".join(study_report(client, parent, tmp_path, top=5))  # the report names the pick and says why
    picked = recorder.run_name("trial", winner.user_attrs["tune_trial_id"], winner.number)
    assert f"picked: {picked}, the best mean; {selection['verdict']}" in text and "The picked trial's config" in text


def test_trials_reuse_the_worker_processes_of_finished_ones(budget_study):
    """5 trials and 2 re-runs on 2 slots (--reuse-actors, the default), all in the search's one Tuner: fewer worker
    processes than trials, and the re-runs in processes that ran search trials (warm, the dataset decoded), but
    one: Ray Tune keeps a single idle worker while the searcher has nothing to give (a re-run waits for the last
    search trial), so the re-run given after that may start a worker of its own."""
    import json

    folders = sorted(p.name for p in (budget_study["runs"] / "ray").iterdir() if p.is_dir())
    assert folders == ["budgets"]  # no second Tuner's experiment for the re-runs
    trial_dirs = [d for d in (budget_study["runs"] / "ray" / "budgets").iterdir() if (d / "result.json").is_file()]
    results = {d.name: [json.loads(line) for line in (d / "result.json").read_text().splitlines() if line.strip()] for d in trial_dirs}
    pids = {name: {r["pid"] for r in rs} for name, rs in results.items()}
    reruns = {name for name, rs in results.items() if CONFIRMS_KEY in rs[0]["config"]}
    assert len(pids) == 7 and len(reruns) == 2
    assert len(set().union(*pids.values())) < len(pids)
    search_pids = set().union(*(pids[name] for name in pids if name not in reruns))
    assert sum(not pids[name] <= search_pids for name in reruns) <= 1


def test_trial_folders_hold_tunes_json_and_csv_results_and_no_tensorboard_files(budget_study):
    """Ray Tune's result.json and progress.csv stay in every trial's folder; TensorBoard event files are not written (MLflow
    holds every metric), so the driver loads neither tensorboardX nor, through it, torch while its trials start."""
    trial_dirs = [d for d in (budget_study["runs"] / "ray" / "budgets").iterdir() if d.is_dir() and d.name.startswith("train_trial")]
    assert len(trial_dirs) == 7
    assert all((d / "result.json").is_file() and (d / "progress.csv").is_file() for d in trial_dirs)
    assert not list((budget_study["runs"] / "ray").rglob("events.out.tfevents*"))


def test_a_cluster_study_with_checkpoints_in_a_folder_of_this_host_is_told_every_node_must_reach_it():
    assert shared_storage_note(None, "/data/runs/ray") is None  # a local Ray: one host
    assert shared_storage_note("auto", "s3://bucket/ray") is None  # every node reaches a bucket
    note = shared_storage_note("10.0.0.1:6379", "/data/runs/ray")
    assert note.startswith("note: --storage-path /data/runs/ray is a folder of this host") and "s3://" in note


def test_a_tune_state_saved_by_another_version_is_a_one_line_error_on_resume(monkeypatch):
    """Seen on a 5,000-trial study started before the searcher was renamed: Tune's restore unpickled a class this
    version lacks and --resume ended in a traceback. Now one line names the study, its folder and what is missing; an
    unrelated AttributeError still rises as it is."""
    from types import SimpleNamespace

    from ray import tune

    settings = SimpleNamespace(name="old", experiment_dir="/runs/ray/old")
    monkeypatch.setattr(launch_tuner, "trainable", lambda s: None)
    missing = AttributeError("Can't get attribute 'ConfirmingSearcher' on <module 'study.search' from '/x/study/search.py'>")
    for error in (missing, ModuleNotFoundError("No module named 'study.old'")):
        monkeypatch.setattr(tune.Tuner, "restore", staticmethod(lambda *a, error=error, **k: (_ for _ in ()).throw(error)))
        with pytest.raises(launch.UsageError) as raised:
            restore_tuner(settings)
        line = str(raised.value)
        assert "\n" not in line and "study old under /runs/ray/old was saved by another version" in line
        assert str(error).split(" on ")[0] in line and "--study-name" in line
    other = AttributeError("'NoneType' object has no attribute 'x'")
    monkeypatch.setattr(tune.Tuner, "restore", staticmethod(lambda *a, **k: (_ for _ in ()).throw(other)))
    with pytest.raises(AttributeError, match="NoneType"):
        restore_tuner(settings)

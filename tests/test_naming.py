"""How records read: metric names and steps, trial names and links, the config that applies, printed commands, quiet output.

Fast tests: the engine on generated glyphs for a few epochs, a local MLflow store and an Optuna journal in tmp_path.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import mlflow
import optuna
import pytest
import torch

from study import console, sync
from study.launch.callbacks import MlflowTrials, result_metrics, result_step, result_trained
from study.records import parent, tracking
from study.records.ending import StudySummary, describe_optuna_study
from study.records.trials import TrialRecorder
from study.search.journal import open_storage
from tests.conftest import recorded_params
from trainables.core.config import LOSS_KEYS, TrainConfig, applicable_keys
from trainables.core.engine import fit

TINY = {"dataset": "synthetic", "epochs": 2, "classes_per_batch": 4, "samples_per_class": 2, "embedding_dim": 8}


# ----------------------------------------------------------------------------- metric names
@pytest.mark.parametrize("loss", ["softmax", "ice"])
def test_epoch_metrics_never_reuse_a_config_key_and_group_by_prefix(loss):
    seen = []
    fit(TrainConfig.from_dict({**TINY, "loss": loss}), lambda epoch, metrics, run: seen.append(metrics), device=torch.device("cpu"))
    names = set(seen[-1])
    assert not names & set(TrainConfig.keys())  # lr and alpha are the config's start values; their current values are *_now
    assert "epoch" not in names  # the step it is recorded at
    assert all(n.startswith(("train_", "val_", "time/")) or n in ("lr_now", "alpha_now") for n in names), names
    assert {"train_loss", "train_accuracy", "lr_now", "val_recall_at_1", "time/epoch_s", "time/eval_s"} <= names
    assert ("alpha_now" in names) == (loss == "softmax") and ("train_mean_proxy_norm" in names) == (loss == "softmax")


# the keys an ICE trial with the default Adam and fc embedding does not train with (its run logs the others as params)
ICE_UNUSED = {"alpha", "learn_alpha", "heating", "heating_target", "heating_start", "weight_norm", "mean_proxy_weight"}
ICE_UNUSED |= {"momentum", "dropout"}


def ladder_result(budget: int, epoch: int, trained: int) -> dict:
    return {
        "val_recall_at_1": 0.5,
        "train_loss": 1.0,
        "budget": budget,
        "epoch": epoch,
        "epochs_trained": trained,
        "completed_budget": budget if epoch == budget else 0,
        "objective_step": epoch,
        "training_iteration": trained,
        "time_this_iter_s": 1.0,
        "node": "n1",
    }


def test_mlflow_metrics_leave_out_what_the_step_says():
    # one budget (asha, fifo, confirmation runs): epoch is the step, epochs trained too, and budget a constant
    single = result_metrics(ladder_result(budget=4, epoch=3, trained=3), max_epochs=4)
    assert set(single) == {"val_recall_at_1", "train_loss"}
    # a ladder of budgets: the step is the epoch within the budget; the budget, and the epochs trained (which the
    # recorder tells a retrained epoch by), are logged beside it
    first = result_metrics(ladder_result(budget=1, epoch=1, trained=1), max_epochs=4)
    last = result_metrics(ladder_result(budget=4, epoch=2, trained=3), max_epochs=4)
    assert set(first) == set(last) == {"val_recall_at_1", "train_loss", "budget", "completed_budget", "epochs_trained"}
    assert result_step(ladder_result(budget=4, epoch=2, trained=3)) == 2  # MLflow step = the epoch of the schedule
    assert result_trained(ladder_result(budget=4, epoch=2, trained=3)) == 3
    assert result_step({"training_iteration": 5}) == result_trained({"training_iteration": 5}) == 5


# ----------------------------------------------------------------------------- the config that applies
def test_applicable_keys_leave_out_the_other_loss_and_unused_schedules():
    ice = applicable_keys(TrainConfig.from_dict({"loss": "ice"}))
    assert not set(LOSS_KEYS["softmax"]) & set(ice) and "ice_scale" in ice and "normalization" in ice  # bn before ICE's l2 matters
    softmax = applicable_keys(TrainConfig.from_dict({"loss": "softmax", "heating": "none", "lr_schedule": "cosine"}))
    assert "ice_scale" not in softmax and {"alpha", "weight_norm", "mean_proxy_weight", "lr_decay_start"} <= set(softmax)
    assert not {"heating_target", "heating_start", "heating_lr_factor", "momentum"} & set(softmax)
    sgd = applicable_keys(TrainConfig.from_dict({"optimizer": "sgd", "lr_schedule": "constant"}))
    assert "momentum" in sgd and "lr_decay_start" not in sgd
    assert "backbone_width" in sgd and "backbone_width" not in applicable_keys(TrainConfig.from_dict({"backbone": "resnet18"}))


@pytest.mark.parametrize(
    "config",
    [
        {"loss": "ice", "ice_scale": 32.0},
        {"loss": "softmax", "heating": "none", "lr_schedule": "cosine", "lr_decay_start": 0.5},
    ],
)
def test_a_config_of_its_applicable_keys_trains_the_same_model(config):
    full = TrainConfig.from_dict(
        {**TINY, **config, "alpha": 3.0, "heating_target": 2.0, "heating_start": 0.5, "ice_scale": 20.0}
        if config["loss"] == "softmax"
        else {**TINY, **config, "alpha": 3.0, "heating_target": 2.0, "weight_norm": False, "momentum": 0.5}
    )
    kept = {k: v for k, v in full.to_dict().items() if k in applicable_keys(full)}
    assert kept != full.to_dict()  # something was left out
    runs = [fit(c, device=torch.device("cpu")) for c in (full, TrainConfig.from_dict(kept))]
    assert runs[0].metrics["train_loss"] == runs[1].metrics["train_loss"]
    assert runs[0].metrics["val_recall_at_1"] == runs[1].metrics["val_recall_at_1"]


# ----------------------------------------------------------------------------- trial runs and the Optuna study
def study_url(runs) -> str:
    return f"journal:{runs / 'journal.log'}"


@pytest.fixture
def study_store(runs):
    """A parent run in a local MLflow store whose optuna_storage param names a journal with study "s"."""
    uri = tracking.resolve_tracking_uri(None)
    experiment_id = tracking.setup(uri, "naming")
    storage_url = study_url(runs)
    study = optuna.create_study(study_name="s", storage=open_storage(storage_url), direction="maximize")
    client = mlflow.MlflowClient(uri)
    parent_id = parent.create_parent_run(client, experiment_id, "s", str(Path(__file__)), recorded_params(optuna_storage=storage_url))
    return uri, experiment_id, parent_id, study, client


def test_a_trial_run_is_named_by_its_optuna_number_logs_every_key_and_is_linked_both_ways(study_store, runs):
    uri, experiment_id, parent, study, client = study_store
    study.ask()  # trial 0, another searcher's
    trial = study.ask()
    trial.set_user_attr("tune_trial_id", "ab12cd34")
    recorder = TrialRecorder(uri, experiment_id, parent, "s", str(runs / "spool.jsonl"), optuna_storage=study_url(runs))
    recorder.submit({"op": "start", "trial_id": "ab12cd34", "kind": "trial", "config": {"loss": "ice", "lr": 0.002}})
    run = client.get_run(recorder.run_ids["ab12cd34"])
    assert run.info.run_name == "trial-1-ab12cd34" and run.data.tags["optuna_trial_number"] == "1"
    assert set(run.data.params) == set(TrainConfig.keys()) - ICE_UNUSED and run.data.params["lr"] == "0.002"
    assert study.trials[1].user_attrs["mlflow_run_id"] == run.info.run_id
    recorder.submit({"op": "start", "trial_id": "ef56", "kind": "confirmation", "config": {"loss": "ice"}})
    assert client.get_run(recorder.run_ids["ef56"]).info.run_name == "confirm-ef56"


def test_a_confirmation_run_names_the_optuna_trial_it_re_runs(study_store, runs):
    from study.search.trial import CONFIRMS_KEY

    uri, experiment_id, parent, _, client = study_store
    config = {"loss": "ice", "lr": 0.002, "seed": 1, CONFIRMS_KEY: 7}  # the seed-1 re-run of Optuna trial #7
    recorder = TrialRecorder(uri, experiment_id, parent, "s", str(runs / "spool.jsonl"), optuna_storage=study_url(runs))
    callback = MlflowTrials(recorder, "val_recall_at_1", 4)
    callback.on_trial_start(0, [], SimpleNamespace(trial_id="ef57", config=config))
    run = client.get_run(recorder.run_ids["ef57"])
    assert run.info.run_name == "confirm-7-ef57" and run.data.tags["confirms_optuna_trial"] == "7"
    assert run.data.tags["kind"] == "confirmation"
    assert "optuna_trial_number" not in run.data.tags  # that tag names search trials only
    assert set(run.data.params) == set(TrainConfig.keys()) - ICE_UNUSED and run.data.params["seed"] == "1"  # training keys only


def test_the_optuna_study_names_its_objective_parent_run_and_space_once(study_store):
    _, _, parent, study, _ = study_store
    for _ in range(2):
        describe_optuna_study(study, parent, "search_spaces/smoke.yaml", "val_recall_at_1")
    loaded = optuna.load_study(study_name="s", storage=study._storage)
    assert loaded.metric_names == ["val_recall_at_1"]
    assert loaded.user_attrs == {"mlflow_parent_run_id": parent, "space": "search_spaces/smoke.yaml"}


def test_sync_of_a_complete_study_writes_nothing_and_says_so(study_store, runs, capsys):
    uri, _, parent, _, client = study_store
    client.log_metric(parent, "n_trials", 3.0)
    client.set_terminated(parent, status="FINISHED")
    assert sync.main(["--study", "s", "--experiment", "naming"]) == 0
    assert "nothing to sync" in capsys.readouterr().out
    assert len(client.get_metric_history(parent, "n_trials")) == 1 and client.get_run(parent).info.status == "FINISHED"


def test_sync_of_a_study_whose_driver_still_runs_is_refused_naming_it_and_writes_nothing(study_store, runs, capsys):
    """A study still racing (its parent RUNNING, its driver holding the study's lock): study.sync says who runs it and
    how to follow it, exit 2. Before: it ended the study under the driver, printing "finished in 0 s" and a false
    "MLflow could not be written"."""
    from study.records import locks

    uri, _, parent, _, client = study_store
    folder = locks.lock_folder(study_url(runs), tracking.runs_dir())
    with locks.study_lock(folder, "s"):  # the driver's, as study.launch holds it for the whole study
        assert sync.main(["--study", "s", "--experiment", "naming"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --study s: the study is being run by pid ") and len(err.splitlines()) == 1, err
    assert "a running one writes its records itself" in err and "mlflow ui" in err
    run = client.get_run(parent)
    assert run.info.status == "RUNNING" and "n_trials" not in run.data.metrics  # nothing ended, nothing written


def spy_on_mlflow(monkeypatch) -> dict[str, list[str]]:
    """The filter strings of MlflowClient.search_runs and the run ids of MlflowClient.get_run, as they are called."""
    calls: dict[str, list[str]] = {"search_runs": [], "get_run": []}
    search, get = mlflow.MlflowClient.search_runs, mlflow.MlflowClient.get_run

    def search_runs(self, *args, **kwargs):
        calls["search_runs"].append(kwargs.get("filter_string", args[1] if len(args) > 1 else ""))
        return search(self, *args, **kwargs)

    def get_run(self, run_id):
        calls["get_run"].append(run_id)
        return get(self, run_id)

    monkeypatch.setattr(mlflow.MlflowClient, "search_runs", search_runs)
    monkeypatch.setattr(mlflow.MlflowClient, "get_run", get_run)
    return calls


def test_the_end_of_a_study_searches_its_trial_runs_once_and_reads_again_only_the_runs_it_changed(study_store, runs, monkeypatch):
    """Three trials' runs, then study.sync's end of the study twice: the first tags every trial run (its Optuna number
    and state), the second finds them tagged. The end searched the trial runs three times before (12 s each at 5,000
    trials, docs/performance.md), and study.sync's recorder once more as it connected, with no record to write; now once in
    all, and the end reads again, run by run, only the runs whose tags it wrote."""
    uri, experiment_id, parent_id, study, client = study_store
    trial_runs = {}
    for i, value in enumerate((0.5, 0.7, 0.6)):
        trial = study.ask()
        lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        trial.set_user_attr("tune_trial_id", f"t{i}")
        trial.set_user_attr("config", {"lr": lr, "dataset": "synthetic"})  # what the searcher keeps of every trial
        study.tell(trial, value)
        tags = {"mlflow.parentRunId": parent_id, "kind": "trial", "trial_id": f"t{i}"}
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        client.log_metric(run_id, "val_recall_at_1", value, step=1)
        client.set_terminated(run_id, "FINISHED")
        trial_runs[run_id] = i
    calls = spy_on_mlflow(monkeypatch)
    assert sync.main(["--study", "s", "--experiment", "naming"]) == 0
    searches = [f for f in calls["search_runs"] if "tags.kind = 'trial'" in f]
    assert len(searches) == 1, calls["search_runs"]
    assert sorted(r for r in calls["get_run"] if r in trial_runs) == sorted(trial_runs)  # all three were tagged: read again
    for run_id, number in trial_runs.items():
        tags = client.get_run(run_id).data.tags
        assert (tags["optuna_trial_number"], tags["optuna_state"]) == (str(number), "COMPLETE")
    assert client.get_run(parent_id).info.status == "FINISHED" and client.get_run(parent_id).data.tags["picked_trial_number"] == "1"
    client.update_run(parent_id, status="RUNNING")  # as a study stopped at its end leaves it, for sync to end again
    calls["search_runs"].clear(), calls["get_run"].clear()
    assert sync.main(["--study", "s", "--experiment", "naming"]) == 0
    assert len([f for f in calls["search_runs"] if "tags.kind = 'trial'" in f]) == 1
    assert not [r for r in calls["get_run"] if r in trial_runs]  # nothing changed: nothing read again


# ----------------------------------------------------------------------------- the terminal
def test_printed_commands_use_this_interpreter():
    python = console.python_command("study.final")
    assert python.endswith(" -m study.final")
    assert Path(python.split(" -m ")[0]).resolve() == Path(sys.executable).resolve()  # relative paths are to the working folder
    assert "ui --backend-store-uri" in console.ui_command("sqlite:///x/mlflow.db")


def test_library_warnings_and_logs_go_to_the_log_file_while_the_command_runs(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)
    before = {name: list(logging.getLogger(name).handlers) for name in console.LIBRARY_LOGGERS}
    with console.library_output_to(tmp_path / "logs" / "s.log") as path:
        warnings.warn("Argument ``group`` is an experimental feature.", optuna.exceptions.ExperimentalWarning, stacklevel=1)
        logging.getLogger("ray.tune").warning("To visualize your results with TensorBoard, run: ...")
        optuna.logging.get_logger("optuna.study").warning("an optuna line")
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0"  # Tune's own console table and hints off
    out, err = capfd.readouterr()
    assert out == err == ""
    text = path.read_text()
    assert "experimental feature" in text and "TensorBoard" in text and "an optuna line" in text
    # afterwards the process is as it was
    assert {name: list(logging.getLogger(name).handlers) for name in console.LIBRARY_LOGGERS} == before
    assert "RAY_AIR_NEW_OUTPUT" not in os.environ


def test_a_local_ray_started_inside_the_log_block_prints_nothing_on_the_terminal(tmp_path):
    """study.final imports Ray only when its seeds train side by side, after its log block began: Ray's import then puts
    its console handler on the "ray" logger, and ray.init's own warnings (token authentication) reached the terminal.
    In a fresh process, as study.final runs: the "ray" logger keeps only the log file inside the block."""
    code = (
        "import logging, sys; from pathlib import Path; from study import console; from study.ray_session import ray_session\n"
        "with console.library_output_to(Path(sys.argv[1])):\n"
        "    with ray_session(None, (1.0, None)):\n"
        "        print([type(h).__name__ for h in logging.getLogger('ray').handlers])\n"
    )
    env = {**os.environ, "DML_RUNS_DIR": str(tmp_path / "runs")}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.log")], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['QuietFileHandler']"


def test_the_study_summary_prints_commands_that_run_as_printed(runs, capsys):
    trial = optuna.trial.create_trial(
        value=0.8,
        params={},
        distributions={},
        user_attrs={"tune_trial_id": "ab12cd34", "config": {"loss": "ice", "seed": 3, "dataset": "synthetic"}},
    )
    log = console.log_path("s")
    log.parent.mkdir(parents=True)
    log.write_text("")
    metrics = {"wall_time_s": 60.0, "n_trials": 1, "n_complete": 1, "n_pruned": 0, "n_failed": 0, "epochs_spent": 4.0}
    named = {"study_name": "s", "uri": "sqlite:///x.db", "experiment": "e", "final_epochs": 32}
    console.print_study_summary(StudySummary(metrics, trial, trial.user_attrs["config"], **named), "val_recall_at_1")
    out = capsys.readouterr().out
    assert f"{console.python_command('study.final')} --study s --experiment e\n" in out
    assert "(32 epochs, seeds 3, 4, 5;" in out  # the budget study.final --study will train to
    assert "the three as one model, their embeddings side by side, is registered as s-embedding" in out
    assert "  ice_scale: 64.0" in out and "alpha" not in out  # the keys that apply to ICE, as best_config.yaml
    assert f"{console.env_tool('mlflow')} ui --backend-store-uri sqlite:///x.db" in out and f"library logs: {log}" in out
    # an undecided race: study.final --study trains its tie, seed k the k-th candidate (study.final --members tied)
    from study.search.race import Candidate, Selection

    tie = Selection((Candidate(0, (0.8, 0.9), (0, 1)), Candidate(5, (0.79, 0.9), (0, 1))), 0.005, 1.0, stopped="budget")
    console.print_study_summary(StudySummary(metrics, trial, trial.user_attrs["config"], selection=tie, **named), "val_recall_at_1")
    out = capsys.readouterr().out
    assert "(32 epochs, #0 with seed 3, #5 with seed 4, #0 with seed 5, the race's tie; the three as one model, their embeddings" in out


def test_a_full_disk_under_the_log_file_is_said_once_not_as_a_traceback_per_record(tmp_path, capsys):
    """ENOSPC while the libraries log: one warning line on stderr, never logging's "--- Logging error ---" traceback."""
    import errno

    with console.library_output_to(tmp_path / "logs" / "s.log"):
        handler = logging.getLogger("ray").handlers[-1]

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        handler.stream.write = full
        for n in range(30):
            logging.getLogger("ray").warning("record %d", n)
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    lines = [line for line in err.splitlines() if "s.log" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0], err


def test_the_ui_command_opens_the_runs_table_not_the_genai_views():
    """MLflow 3.17's UI ignores the experiment's kind tag; the address's workflowType parameter opens the runs."""
    local = console.ui_command("sqlite:///x/mlflow.db", "7")
    assert local.endswith(
        "ui --backend-store-uri sqlite:///x/mlflow.db, then open http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    )
    server = console.ui_command("http://10.0.0.1:5000/", "12")
    assert server == "open http://10.0.0.1:5000/#/experiments/12/runs?workflowType=machine_learning in a browser"
    study = console.ui_command("http://10.0.0.1:5000/", "12", "s1")  # the study's shared view (tests/test_browser.py)
    assert study == "open http://10.0.0.1:5000/#/experiments/12/runs?viewStateShareKey=s1&workflowType=machine_learning in a browser"


def test_the_studys_view_is_an_experiment_tag_written_once(tmp_path, monkeypatch):
    """The view the printed address opens (MLflow's shared view: the experiment's tag mlflow.sharedViewState.<study>):
    the study's runs, sorted by the tag picked, its columns; a study ended again writes it no second time."""
    import json

    import mlflow

    from study.records import tracking

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("views")
    tracking.share_study_view(client, experiment, "s1", "val_recall_at_1")
    view = json.loads(client.get_experiment(experiment).tags["mlflow.sharedViewState.s1"])
    assert view["searchFilter"] == "tags.study_name = 's1'" and view["orderByKey"] == "tags.`picked`" and not view["orderByAsc"]
    assert view["selectedColumns"] == ["metrics.`val_recall_at_1`", "params.`loss`", "tags.`picked`"]
    writes = []
    monkeypatch.setattr(client, "set_experiment_tag", lambda *a: writes.append(a))
    tracking.share_study_view(client, experiment, "s1", "val_recall_at_1")
    assert writes == []

"""--resume continues a study with its own settings: changed ones are refused, omitted ones come from the study."""

from __future__ import annotations

import mlflow
import pytest

from study.launch import cli as launch
from study.launch.settings import study_settings
from study.records import parent, tracking


@pytest.fixture
def recorded_study(runs):
    """A study's parent run and Tune folder as a launch leaves them (no trials: these tests stop before any)."""
    argv = ["--space", "smoke", "--study-name", "s", "--seed", "3", "--epochs", "6", "--num-samples", "5", "--confirm-budget", "0"]
    settings = study_settings(launch.parse_args(argv))
    experiment_id = tracking.setup(settings.tracking_uri, settings.experiment)
    client = mlflow.MlflowClient(settings.tracking_uri)
    recorded = settings.with_slots({"CPU": 2.0})  # the study's start, on a 2-CPU Ray
    parent_id = parent.create_parent_run(client, experiment_id, "s", settings.space.path, recorded.record.to_params())
    (runs / "ray" / "s").mkdir(parents=True)
    return client, parent_id


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--epochs", "12"], "--epochs 12: study s runs with 6"),
        (["--num-samples", "40"], "--num-samples 40: study s runs with 5"),
        (["--space", "ice"], "--space ice: study s runs with"),
        (["--seed", "0"], "--seed 0: study s runs with 3"),  # the flag's default value, given on purpose
        (["--scheduler", "fifo"], "--scheduler fifo: study s runs with budget"),
        (["--max-failures", "3"], "--max-failures: not changeable on --resume"),
    ],
)
def test_resume_refuses_a_changed_setting_in_one_line(recorded_study, capsys, flags, named):
    client, parent_id = recorded_study
    code = launch.main(["--study-name", "s", "--resume", *flags])
    err = capsys.readouterr().err
    assert code == 2 and named in err and err.count("\n") == 1, err
    assert client.get_run(parent_id).info.status == "RUNNING"  # untouched: not reopened, not stopped


def test_resume_takes_the_settings_the_command_line_leaves_out_from_the_study(recorded_study):
    settings = study_settings(launch.parse_args(["--study-name", "s", "--resume", "--epochs", "6"]))
    record = settings.record
    assert (record.seed, settings.max_epochs, record.num_samples, record.confirm_budget) == (3, 6, 5, 0)
    assert settings.space.name == "smoke"


def test_resume_of_a_finished_study_says_so_and_writes_nothing(recorded_study, capsys):
    client, parent_id = recorded_study
    client.set_terminated(parent_id, status="FINISHED")
    before = client.get_run(parent_id).data
    assert launch.main(["--study-name", "s", "--resume"]) == 0
    assert "study s has finished: nothing left to run" in capsys.readouterr().out
    after = client.get_run(parent_id)
    assert after.info.status == "FINISHED" and after.data.metrics == before.metrics and after.data.tags == before.tags


def test_max_concurrent_defaults_to_what_the_cluster_holds(runs):
    resources = {"CPU": 3.0, "memory": 1e9}  # the running cluster's resources
    settings = study_settings(launch.parse_args(["--space", "smoke", "--cpus-per-trial", "0.5"])).with_slots(resources)
    given = study_settings(launch.parse_args(["--space", "smoke", "--max-concurrent", "7"])).with_slots(resources)
    assert settings.slots == 6  # 3 CPUs / 0.5 per trial
    assert given.slots == 7  # as given: an autoscaling cluster may grow to it
    assert settings.record.to_params()["max_concurrent"] == "6"  # what --resume continues with


def test_resume_finds_the_study_in_the_stores_it_recorded(runs, tmp_path):
    """A study started with its own --optuna-storage and --storage-path is resumed with --study-name and --resume
    alone (the line a stopped study prints): both are settings of the study's record."""
    journal, storage = tmp_path / "elsewhere" / "journal.log", tmp_path / "checkpoints"
    journal.parent.mkdir()
    argv = ["--space", "smoke", "--study-name", "s", "--optuna-storage", f"journal:{journal}", "--storage-path", str(storage)]
    settings = study_settings(launch.parse_args(argv))
    client = mlflow.MlflowClient(settings.tracking_uri)
    experiment_id = tracking.setup(settings.tracking_uri, settings.experiment)
    parent.create_parent_run(client, experiment_id, "s", settings.space.path, settings.with_slots({"CPU": 2.0}).record.to_params())
    (storage / "s").mkdir(parents=True)
    resumed = study_settings(launch.parse_args(["--study-name", "s", "--resume"]))
    assert (resumed.record.optuna_storage, resumed.record.storage_path) == (f"journal:{journal}", str(storage))
    assert resumed.experiment_dir == str(storage / "s")
    with pytest.raises(launch.UsageError, match="--optuna-storage journal:.*: study s runs with journal:"):
        study_settings(launch.parse_args(["--study-name", "s", "--resume", "--optuna-storage", f"journal:{tmp_path / 'x.log'}"]))

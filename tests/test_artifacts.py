"""study.records.artifacts on an in-memory Optuna study, the curve plotter, and imports without side effects."""

from __future__ import annotations

import csv
import subprocess
import sys
from types import SimpleNamespace

import optuna
import pytest
import yaml

from study import plots
from study.records.artifacts import optuna_plot, study_artifacts, tied_configs
from study.search.race import Candidate, Selection
from tests.conftest import ROOT
from trainables.core.config import TrainConfig, applicable_keys

CONFIG = {"dataset": "synthetic", "epochs": 3, "embedding_dim": 16, "classes_per_batch": 8, "samples_per_class": 2}


def tiny_study(curves: list[list[float]], pruned_after: dict[int, int] | None = None) -> optuna.Study:
    """Trials with the given validation curves (epoch 1..n); trial i is pruned after ``pruned_after[i]`` epochs."""
    study = optuna.create_study(direction="maximize", storage=optuna.storages.InMemoryStorage())
    for i, curve in enumerate(curves):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
        trial.set_user_attr("config", {**CONFIG, "seed": i})
        trial.set_user_attr("tune_trial_id", f"t{i}")
        stop = (pruned_after or {}).get(i, len(curve))
        for epoch, value in enumerate(curve[:stop], start=1):
            trial.report(value, epoch)
        if stop < len(curve):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, curve[-1])
    return study


def test_study_artifacts_files_and_trials_table(tmp_path):
    study = tiny_study([[0.1, 0.2, 0.3], [0.2, 0.4, 0.5], [0.05, 0.1, 0.9], [0.3, 0.1, 0.2]], pruned_after={3: 1})
    children = {"t0": SimpleNamespace(info=SimpleNamespace(run_id="run0")), "t2": SimpleNamespace(info=SimpleNamespace(run_id="run2"))}
    paths = study_artifacts(study, children, tmp_path, "val_recall_at_1", study.best_trial)
    names = [p.name for p in paths]
    plots_drawn = ["optimization_history.png", "param_importances.png", "parallel_coordinate.png", "learning_curves.png"]
    assert names == ["best_config.yaml", "resolved_config.yaml", "trials.csv", *plots_drawn]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    best, resolved = (yaml.safe_load((tmp_path / name).read_text()) for name in ("best_config.yaml", "resolved_config.yaml"))
    assert best["seed"] == resolved["seed"] == 2  # trial 2 ends best (0.9)
    assert list(resolved) == list(TrainConfig.keys()) and list(best) == list(applicable_keys(TrainConfig.from_dict(resolved)))
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    assert [r["number"] for r in rows] == ["0", "1", "2", "3"]
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"]
    assert [r["epochs"] for r in rows] == ["3", "3", "3", "1"]
    assert [r["mlflow_run_id"] for r in rows] == ["run0", "", "run2", ""]
    assert float(rows[2]["val_recall_at_1"]) == pytest.approx(0.9)
    assert "user_attrs_config" not in rows[0]


def test_tied_configs_hold_the_candidates_the_race_kept_in_its_order(tmp_path):
    """tied_configs.yaml, what study.final --members tied trains: each kept candidate's trial and config (the keys that
    apply to its loss, as best_config.yaml), the winner first; a dropped candidate is left out."""
    study = tiny_study([[0.1, 0.2, 0.3], [0.2, 0.4, 0.5], [0.05, 0.1, 0.9]])
    ranking = (Candidate(2, (0.9, 0.8), (0, 1)), Candidate(0, (0.3, 0.85), (0, 1)), Candidate(1, (0.5, 0.1), (0, 1), dropped_after=2))
    path = tied_configs(study, Selection(ranking, lead=0.1, lead_in_se=1.0, stopped="folds"), tmp_path / "tied_configs.yaml")
    entries = yaml.safe_load(path.read_text())
    assert [(e["trial"], e["config"]["seed"]) for e in entries] == [(2, 2), (0, 0)]  # tiny_study's trial i has seed i
    assert list(entries[0]["config"]) == list(applicable_keys(TrainConfig.from_dict({**CONFIG, "seed": 2})))


def test_study_artifacts_without_a_complete_trial(tmp_path):
    study = tiny_study([[0.1, 0.2]], pruned_after={0: 1})
    names = [p.name for p in study_artifacts(study, {}, tmp_path, "val_recall_at_1", None)]
    assert "best_config.yaml" not in names and not (tmp_path / "best_config.yaml").exists()
    assert (tmp_path / "param_importances.png").is_file()  # a note saying why nothing was drawn


def test_optuna_plot_failure_is_a_note(tmp_path):
    def draw():
        raise ValueError("first line\ntoo few trials")

    path = optuna_plot(tmp_path / "x.png", "x", draw)
    assert path.is_file() and path.stat().st_size > 0


def test_curves_plot_by_state_and_by_name(tmp_path):
    series = {"a": {1: 0.1, 2: 0.3}, "b": {1: 0.2, 3: 0.5}, "c": {}}
    by_state = plots.curves(series, tmp_path / "s.png", ylabel="m", title="t", states={"a": "COMPLETE", "b": "PRUNED"})
    by_name = plots.curves(series, tmp_path / "n.png", ylabel="m", title="t")
    assert by_state.is_file() and by_name.is_file()


def test_imports_have_no_side_effects():
    """Importing the study modules selects no matplotlib backend and leaves the warning filters alone."""
    code = (
        # what the study modules import from elsewhere first: scipy and torch add warning filters of their own
        "import warnings, sys, mlflow, mlflow.pyfunc, optuna, matplotlib, scipy.stats, trainables.core.engine\n"
        "before = list(warnings.filters)\n"
        "import study.report.cli, study.records.artifacts, study.plots, study.final.pyfunc, study.final.cli\n"
        "print(warnings.filters == before, 'matplotlib.pyplot' in sys.modules, matplotlib.rcParams._get_backend_or_none())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    assert out.stdout.strip() == "True False None"
    assert "Add type hints" not in out.stderr  # the notice MLflow gives when EmbeddingModel is defined

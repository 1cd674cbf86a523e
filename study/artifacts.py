"""The files a study ends with, drawn from its Optuna study.

``study_artifacts`` writes what ``study.launch`` attaches to the parent run when
a study ends: ``best_config.yaml`` (what ``study.final --study`` retrains: the
keys that apply to the best trial's loss and schedules, ``applicable_keys``),
``resolved_config.yaml`` (every key it trained with), ``trials.csv`` (one row per trial, with its MLflow run id), and PNGs of the
optimization history, the parameter importances, the parallel coordinates and
the validation metric against epoch for every trial.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from study.inputs import write_yaml
from study.plots import curves, note
from study.tracking import first_error_line
from trainables.core.config import TrainConfig, applicable_keys


def optuna_plot(path: Path, title: str, draw: Callable[[], Any]) -> Path:
    """Save the figure of ``draw()`` (an ``optuna.visualization.matplotlib`` plot) to ``path``.

    Optuna raises for too few or constant trials; the PNG then says why nothing was drawn.
    """
    import matplotlib

    matplotlib.use("Agg")  # Optuna draws through pyplot; only files are wanted here
    import matplotlib.pyplot as plt

    with matplotlib.rc_context():  # Optuna switches the global style to ggplot; keep that to its own figure
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
                result = draw()
        except Exception as error:  # any failure to draw is reported in the PNG, never raised
            plt.close("all")
            return note(path, title, f"not drawn: {first_error_line(str(error) or type(error).__name__)[:200]}")
        fig = (result.flat[0] if hasattr(result, "flat") else result).figure
        width, height = fig.get_size_inches()
        fig.set_size_inches(max(width, 8), max(height, 5))
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return path


def trials_table(study: optuna.Study, children: dict[str, Any], metric: str, path: Path) -> Path:
    """``trials.csv``: number, ``metric``, state, params, user attrs, epochs reported and MLflow run id of each trial."""
    trials = study.get_trials(deepcopy=False)
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    frame = frame.drop(columns=[c for c in frame.columns if c in ("user_attrs_config", "user_attrs_mlflow_run_id")])
    frame["epochs"] = [len(t.intermediate_values) for t in trials]
    frame["mlflow_run_id"] = [
        children[t.user_attrs["tune_trial_id"]].info.run_id if t.user_attrs.get("tune_trial_id") in children else "" for t in trials
    ]
    frame.rename(columns={"value": metric}).to_csv(path, index=False)
    return path


def learning_curves(study: optuna.Study, metric: str, path: Path) -> Path:
    """The validation metric against epoch for every trial, coloured by the trial's final state."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    series = {f"trial {t.number}": t.intermediate_values for t in trials}
    states = {f"trial {t.number}": t.state.name for t in trials}
    return curves(series, path, ylabel=metric, title=f"{metric} against epoch, all trials", states=states)


def study_artifacts(study: optuna.Study, children: dict[str, Any], out: Path, metric: str, best) -> list[Path]:
    """Write the end-of-study files into ``out``; returns their paths.

    ``children`` maps Tune trial ids to the trials' MLflow runs; ``best`` is the
    best frozen trial (its ``config`` user attribute is the resolved config), or
    None when no trial completed (then there is no ``best_config.yaml``).
    """
    paths = []
    if best is not None:
        config = TrainConfig.from_dict(best.user_attrs["config"], source="best trial")
        resolved = config.to_dict()
        paths.append(write_yaml(out / "best_config.yaml", {key: resolved[key] for key in applicable_keys(config)}))
        paths.append(write_yaml(out / "resolved_config.yaml", resolved))
    paths.append(trials_table(study, children, metric, out / "trials.csv"))
    vis = optuna.visualization.matplotlib
    plots = {
        "optimization_history.png": ("optimization history", lambda: vis.plot_optimization_history(study, target_name=metric)),
        "param_importances.png": ("parameter importances", lambda: vis.plot_param_importances(study)),
        "parallel_coordinate.png": ("parallel coordinates", lambda: vis.plot_parallel_coordinate(study, target_name=metric)),
    }
    paths += [optuna_plot(out / name, title, draw) for name, (title, draw) in plots.items()]
    paths.append(learning_curves(study, metric, out / "learning_curves.png"))
    return paths

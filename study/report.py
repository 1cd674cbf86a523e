"""Study-level artifacts: best config, the trials table and the plots of a study.

``study_artifacts`` is what ``study.launch`` attaches to the parent run at the
end of a study: ``best_config.yaml``, ``trials.csv``, and PNGs of the
optimization history, parameter importances, parallel coordinates and the
validation metric against epoch for every trial.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402

from study.tracking import write_yaml  # noqa: E402
from trainables.core.config import TrainConfig  # noqa: E402

log = logging.getLogger(__name__)
STATE_COLORS = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red", "RUNNING": "tab:gray"}


def _note(path: Path, title: str, text: str) -> Path:
    """A PNG that says why a plot could not be drawn (e.g. too few complete trials)."""
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _optuna_plot(path: Path, title: str, draw) -> Path:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = draw()
        fig = (result.flat[0] if hasattr(result, "flat") else result).figure
        fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    except Exception as error:  # optuna raises for too few or constant trials
        plt.close("all")
        return _note(path, title, f"not drawn: {str(error).splitlines()[0][:200] if str(error) else type(error).__name__}")


def learning_curves(study: optuna.Study, metric: str, path: Path) -> Path:
    """The validation metric against epoch for every trial, coloured by final state."""
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = set()
    for t in study.get_trials(deepcopy=False):
        if not t.intermediate_values:
            continue
        steps = sorted(t.intermediate_values)
        state = t.state.name
        ax.plot(
            steps,
            [t.intermediate_values[s] for s in steps],
            marker=".",
            color=STATE_COLORS.get(state, "k"),
            alpha=0.7,
            label=state.lower() if state not in drawn else None,
        )
        drawn.add(state)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against epoch, all trials")
    if drawn:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def study_artifacts(study: optuna.Study, children: dict[str, Any], out: Path, metric: str, best) -> list[Path]:
    paths = []
    if best is not None:
        config = TrainConfig.from_dict(best.user_attrs["config"], source="best trial").to_dict()
        paths.append(write_yaml(out / "best_config.yaml", config))
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    frame = frame.drop(columns=[c for c in frame.columns if c == "user_attrs_config"])
    frame["epochs"] = [len(t.intermediate_values) for t in study.get_trials(deepcopy=False)]
    frame["mlflow_run_id"] = [
        children[t.user_attrs["tune_trial_id"]].info.run_id if t.user_attrs.get("tune_trial_id") in children else ""
        for t in study.get_trials(deepcopy=False)
    ]
    frame = frame.rename(columns={"value": metric})
    frame.to_csv(out / "trials.csv", index=False)
    paths.append(out / "trials.csv")
    vis = optuna.visualization.matplotlib
    paths.append(
        _optuna_plot(
            out / "optimization_history.png", "optimization history", lambda: vis.plot_optimization_history(study, target_name=metric)
        )
    )
    paths.append(_optuna_plot(out / "param_importances.png", "parameter importances", lambda: vis.plot_param_importances(study)))
    paths.append(
        _optuna_plot(
            out / "parallel_coordinate.png", "parallel coordinates", lambda: vis.plot_parallel_coordinate(study, target_name=metric)
        )
    )
    paths.append(learning_curves(study, metric, out / "learning_curves.png"))
    return paths

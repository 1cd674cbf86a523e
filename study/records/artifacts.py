"""The files a study ends with, drawn from its Optuna study.

``study_artifacts`` writes what ``study.launch`` attaches to the parent run when
a study ends: ``best_config.yaml`` (what ``study.final --study`` retrains: the
keys that apply to the best trial's loss and schedules, ``applicable_keys``),
``resolved_config.yaml`` (every key it trained with), ``trials.csv`` (one row per trial, with its MLflow run id), and PNGs of the
optimization history, the parameter importances and the parallel coordinates (a
panel per loss family: ``family_importances``, ``family_parallel_rows``) and the
validation metric against epoch for every trial; ``study.report`` draws the last
three the same way and shows the study's copy rather than log a second one.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from study import plots
from study.inputs import write_yaml
from study.plots import note
from study.records.tracking import first_error_line
from study.search.race import Selection
from study.search.trial import run_key
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
    """``trials.csv``: number, ``metric``, state, params (blank where a trial did not sample one), user attrs (the
    last epoch of its schedule it reached, its MLflow curves' last step: ``user_attrs_epochs``; the epochs it trained
    over every budget, a retrained tail included: ``user_attrs_epochs_trained``), the epochs of the schedule it
    finished and its MLflow run id, one row per trial."""
    trials = study.get_trials(deepcopy=False)
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    frame = frame.drop(columns=[c for c in frame.columns if c in ("user_attrs_config", "user_attrs_mlflow_run_id")])
    # the schedule the trial finished: the last step of its intermediate values, an epoch or, on a ladder, a budget
    frame["epochs"] = [max(t.intermediate_values, default=0) for t in trials]
    frame["mlflow_run_id"] = [children[run_key(t)].info.run_id if run_key(t) in children else "" for t in trials]
    frame.rename(columns={"value": metric}).to_csv(path, index=False)
    return path


def optuna_learning_curves(study: optuna.Study, metric: str, path: Path) -> Path:
    """The validation metric against epoch for every trial, coloured by the trial's final state."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    series = {f"trial {t.number}": t.intermediate_values for t in trials}
    states = {f"trial {t.number}": t.state.name for t in trials}
    return plots.curves(series, path, ylabel=metric, title=f"{metric} against epoch, all trials", states=states)


def loss_families(trials: list[FrozenTrial]) -> dict[str, list[FrozenTrial]]:
    """``trials`` by the loss each trained ({"softmax": [...], "ice": [...]}, in the order first seen), from its ``loss``
    param, else its config; all under "" when they share one loss (then there is nothing to tell apart)."""
    groups: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        groups.setdefault(str(t.params.get("loss", (t.user_attrs.get("config") or {}).get("loss", ""))), []).append(t)
    return groups if len(groups) > 1 else {"": list(trials)}


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def searched(trials: list[FrozenTrial]) -> list[str]:
    """The parameters every one of ``trials`` sampled, on the same range (what fANOVA can compare), and that take more
    than one value among them."""
    common = optuna.search_space.intersection_search_space(trials, include_pruned=True)
    return [name for name in common if len({repr(t.params[name]) for t in trials}) > 1]


# fANOVA's forest, and its time, grow with the trials (docs/performance.md, measurements behind the code): larger
# families are sampled
FANOVA_TRIALS = 1000


def family_importances(study: optuna.Study) -> dict[str, dict[str, float] | str]:
    """fANOVA importances (seeded, so the study's end and the report agree) of the parameters each loss family's
    complete trials searched, per family (``loss_families``): a parameter of one loss never varies among the other's
    trials, so importances over both would rank one loss's parameters on that loss's trials alone. A family with
    fewer than two complete trials, or nothing searched, gets the reason instead. A family of more than
    ``FANOVA_TRIALS`` trials is judged on a seeded sample of that many, and its label says so."""
    out: dict[str, dict[str, float] | str] = {}
    for loss, trials in loss_families(complete_trials(study)).items():
        label = f"loss {loss}: {len(trials)} complete trials" if loss else f"all {len(trials)} complete trials"
        if len(trials) > FANOVA_TRIALS:
            label = label.replace(f"{len(trials)} complete", f"{FANOVA_TRIALS} of {len(trials)} complete") + " (a seeded sample)"
            trials = sorted(random.Random(0).sample(trials, FANOVA_TRIALS), key=lambda t: t.number)
        params = searched(trials)
        if len(trials) < 2 or not params:
            out[label] = "not computed: fewer than two complete trials, or no parameter that varies among them"
            continue
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" line on the terminal
        try:
            family = optuna.create_study(directions=study.directions)
        finally:
            optuna.logging.set_verbosity(verbosity)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
            family.add_trials(trials)
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            out[label] = optuna.importance.get_param_importances(family, evaluator=evaluator, params=params)
    return out


def family_parallel_rows(study: optuna.Study) -> tuple[dict[str, tuple[list[dict], list[float]]], set[str], dict[str, list]]:
    """The complete trials' sampled params and values per loss family, each row without the params that are the same
    in every trial of its family (the loss itself); with the log-scaled params and the categorical choices."""
    trials = complete_trials(study)
    log_params = {n for t in trials for n, d in t.distributions.items() if getattr(d, "log", False)}
    categorical = optuna.distributions.CategoricalDistribution
    choices = {n: list(d.choices) for t in trials for n, d in t.distributions.items() if isinstance(d, categorical)}
    groups = {}
    for loss, family in loss_families(trials).items():
        varying = {n for n in {n for t in family for n in t.params} if len({repr(t.params.get(n)) for t in family}) > 1}
        rows = [{k: v for k, v in t.params.items() if k in varying} for t in family]
        groups[f"loss {loss}" if loss else ""] = (rows, [float(t.value) for t in family])
    return groups, log_params, choices


def draw_importances(study: optuna.Study, metric: str, path: Path, families: dict[str, dict[str, float] | str] | None = None) -> Path:
    """param_importances.png: ``family_importances`` (``families`` when already computed) as bars, a panel per loss
    family; a note when none can be computed."""
    try:
        return plots.importances(families if families is not None else family_importances(study), path, metric=metric)
    except Exception as error:  # any failure to compute is reported in the PNG, never raised
        return note(path, "parameter importances", f"not drawn: {first_error_line(str(error) or type(error).__name__)[:200]}")


def draw_parallel_coordinates(study: optuna.Study, metric: str, path: Path) -> Path:
    """parallel_coordinate.png: a panel per loss family on its own searched params (``family_parallel_rows``)."""
    groups, log_params, choices = family_parallel_rows(study)
    groups = {loss: (rows, values) for loss, (rows, values) in groups.items() if len(rows) >= 2 and any(rows)}
    if not groups:
        return note(path, "parallel coordinates", "not drawn: fewer than two complete trials, or no parameter that varies")
    return plots.family_parallel_coordinates(groups, path, metric=metric, log_params=log_params, choices=choices)


def tied_configs(study: optuna.Study, selection: Selection, path: Path) -> Path:
    """tied_configs.yaml: the config of each candidate the race could not tell from the winner (``Selection.tied``,
    the winner first), the keys that apply to its loss as in best_config.yaml; what ``study.final --study`` trains
    as one model (``--members tied``)."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    configs = {n: TrainConfig.from_dict(trials[n].user_attrs["config"], source=f"trial {n}") for n in selection.tied}
    return write_yaml(path, [{"trial": number, "config": applicable_values(config)} for number, config in configs.items()])


def applicable_values(config: TrainConfig) -> dict[str, Any]:
    """The keys of ``config`` that change how it trains (``applicable_keys``) and their values, in TrainConfig order:
    best_config.yaml's and each entry of tied_configs.yaml."""
    resolved = config.to_dict()
    return {key: resolved[key] for key in applicable_keys(config)}


def study_artifacts(
    study: optuna.Study, children: dict[str, Any], out: Path, metric: str, best, curves: Callable[[Path], Path] | None = None
) -> list[Path]:
    """Write the end-of-study files into ``out``; returns their paths.

    ``children`` maps Tune trial ids to the trials' MLflow runs; ``best`` is the
    best frozen trial (its ``config`` user attribute is the resolved config), or
    None when no trial completed (then there is no ``best_config.yaml``).
    ``curves`` draws learning_curves.png into the path it is given (the report's
    drawing, from MLflow's per-epoch records); without it, from the trials'
    Optuna intermediate values. The importances and parallel coordinates are
    drawn as the report draws them (``draw_importances``,
    ``draw_parallel_coordinates``): the study holds each plot once, and the
    report logs no second version of it.
    """
    paths = []
    if best is not None:
        config = TrainConfig.from_dict(best.user_attrs["config"], source="best trial")
        paths.append(write_yaml(out / "best_config.yaml", applicable_values(config)))
        paths.append(write_yaml(out / "resolved_config.yaml", config.to_dict()))
    paths.append(trials_table(study, children, metric, out / "trials.csv"))
    history = lambda: optuna.visualization.matplotlib.plot_optimization_history(study, target_name=metric)  # noqa: E731
    paths.append(optuna_plot(out / "optimization_history.png", "optimization history", history))
    paths.append(draw_importances(study, metric, out / "param_importances.png"))
    paths.append(draw_parallel_coordinates(study, metric, out / "parallel_coordinate.png"))
    paths.append(curves(out / "learning_curves.png") if curves else optuna_learning_curves(study, metric, out / "learning_curves.png"))
    return paths

"""A study's trial: how it ended, whether it re-runs another, and the trainable that trains it.

How a trial ended, from what it reported, is the one rule the searcher, the MLflow records and the progress line
share. A trial is

- FAIL when it raised, or when its last result has no finite value of the objective metric;
- COMPLETE when it finished its full schedule: its last result says ``max_epochs`` epochs
  (``completed_budget``, the epochs of the last schedule it trained to the end, where the
  trainable reports one; else ``training_iteration``, one report per epoch);
- PRUNED otherwise: the scheduler (ASHA) stopped it early.

A confirmation re-run (study.search.race) is a trial whose config carries ``CONFIRMS_KEY``, the Optuna trial it
re-runs: the scheduler never judges it (study.search.halving), the MLflow callback records it as a ``confirmation``
run, and ``train_trial``, the study's trainable, trains it on one schedule of its epochs (no ladder).

This module imports neither Ray nor MLflow nor Optuna (``train_trial`` imports the trainable it runs, in the
trial's worker), so the rules are tested on hand-written results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

COMPLETE, PRUNED, FAIL = "COMPLETE", "PRUNED", "FAIL"


def is_finite_number(value: Any) -> bool:
    """True for an int or float (not a bool) that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def epochs_done(last_result: Mapping[str, Any] | None) -> int:
    """The epochs of the trial's schedule that it finished: ``completed_budget``, else ``training_iteration``."""
    result = last_result or {}
    return int(result.get("completed_budget", result.get("training_iteration", 0)))


def epochs_reached(last_result: Mapping[str, Any] | None) -> int:
    """The last epoch of the trial's schedule it reached, the step its MLflow curves end at: the epoch of the budget it
    trains or, while it trains a rung's tail again, the budget it finished (``completed_budget``); else
    ``training_iteration``."""
    result = last_result or {}
    return max(int(result.get("epoch", result.get("training_iteration", 0))), int(result.get("completed_budget", 0)))


def trial_outcome(last_result: Mapping[str, Any] | None, *, error: bool, metric: str, max_epochs: int) -> str:
    """COMPLETE, PRUNED or FAIL for a trial whose last reported result is ``last_result`` (see the module docstring)."""
    if error or not last_result or not is_finite_number(last_result.get(metric)):
        return FAIL
    return COMPLETE if epochs_done(last_result) >= max_epochs else PRUNED


def epochs_trained(trial: Any) -> int:
    """The epochs an Optuna trial (a FrozenTrial) trained over every budget, retrained tails included: its
    ``epochs_trained`` user attribute, else (a study recorded before it) one per reported value. The epochs of its
    schedule it reached are its ``epochs`` user attribute (:func:`epochs_reached`)."""
    return int(trial.user_attrs.get("epochs_trained", len(trial.intermediate_values)))


def run_key(trial: Any) -> str:
    """The ``trial_id`` tag of an Optuna trial's MLflow run: the Tune trial the searcher named for it (user attribute
    ``tune_trial_id``), else ``optuna-<number>`` (the driver was killed inside Optuna's ask, before the searcher could
    name it: study.records.ending.record_unstarted gives it a run of its own)."""
    return trial.user_attrs.get("tune_trial_id") or f"optuna-{trial.number}"


def epochs_spent(trials: Any) -> int:
    """The epochs a study's Optuna trials trained in all (``epochs_trained`` of each): what the race's budget is a
    share of, and the study's ``epochs_spent``."""
    return sum(epochs_trained(t) for t in trials)


# ----------------------------------------------------------------------------- re-runs
CONFIRMS_KEY = "confirms_trial"  # in a re-run's config: the number of the Optuna trial it re-runs
FOLD_KEY = "val_fold"  # the training config's key of the validation classes held out (trainables.core.data)


def race_config(config: dict[str, Any], fold: int, number: int, split: str | None = None) -> dict[str, Any]:
    """The config of Optuna trial ``number``'s re-run on validation fold ``fold`` of ``split`` (config key
    ``val_split``; None: the trial's own), from seed + ``fold`` (the trial's own run is fold 0 from its seed)."""
    split_key = {} if split is None else {"val_split": split}
    return {**config, **split_key, FOLD_KEY: int(fold), "seed": int(config.get("seed", 0)) + int(fold), CONFIRMS_KEY: int(number)}


def race_table(values: Mapping[int, float], candidates: list[int], scores: Mapping[tuple[int, int], float]) -> dict[int, dict[int, float]]:
    """The race's table (study.search.race.race): each candidate's own score as fold 0, then its re-runs' by fold."""
    table = {n: {0: float(values[n])} for n in candidates}
    for (n, fold), value in scores.items():
        if n in table:
            table[n][fold] = value
    return table


def confirmed_trial(config: dict[str, Any]) -> int | None:
    """The Optuna trial a re-run's config re-runs; None for a search trial."""
    number = config.get(CONFIRMS_KEY)
    return None if number is None else int(number)


def train_part(config: dict[str, Any]) -> dict[str, Any]:
    """The training config of a trial's config: without ``CONFIRMS_KEY``."""
    return {k: v for k, v in config.items() if k != CONFIRMS_KEY}


def train_trial(config: dict[str, Any], *, rehearse_epoch_s: float | None = None, **runtime: Any) -> None:
    """The study's Ray Tune trainable: ``trainables.dml.train_dml``, with a re-run trained on one schedule of its
    epochs (no ladder of budgets: the full budget, as ``study.final`` trains it).

    A rehearsal (``rehearse_epoch_s`` seconds per epoch) runs ``trainables.surrogate.train_surrogate`` instead:
    the same protocol, seeded curves, no training and no torch in the worker.
    """
    if confirmed_trial(config) is not None:
        runtime = {**runtime, "budgets": None}
    if rehearse_epoch_s is not None:
        from trainables.surrogate import train_surrogate

        train_surrogate(train_part(config), epoch_seconds=rehearse_epoch_s, **runtime)
        return
    from trainables.dml import train_dml

    train_dml(train_part(config), **runtime)

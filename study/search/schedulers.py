"""Early stopping for a study: which Ray Tune scheduler judges trials, and at which budgets.

- ``budget`` (the default): successive halving on completed schedules. Every
  trial trains through the ladder of budgets ``grace, grace x eta, ..., epochs``
  (trainables.core.budgets), each budget with its heating and lr decay scaled to
  it, and Ray Tune's asynchronous successive halving reads ``completed_budget``:
  a rung's decision always sees the metric of a finished schedule. A promoted
  trial continues from its checkpoint before the tail, so a promotion costs only
  the epochs after it.
  Trials are compared within their *stratum*, the value of one searched key
  (the loss family by default): heated-up softmax learns more slowly than ICE
  early on and catches up later, so judged against ICE at the first rung it
  would lose trials that win at the full budget (docs/performance.md, study
  efficiency and rung fidelity).
- ``asha``: stock ASHA on ``training_iteration``: trials are judged after b epochs
  of their full-budget schedule, before heating and the lr decay (the baseline).
- ``fifo``: no early stopping; every trial trains its full budget.

Neither halving scheduler judges a study's confirmation re-runs (study.search.halving).

This module imports Ray only when a scheduler is built, so that the driver can
configure the local Ray (study.launch) before anything imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainables.core.budgets import rung_budgets

SCHEDULERS = ("budget", "asha", "fifo")
SAMPLERS = ("tpe", "random")  # how a searched space is sampled (a grid space is always its grid)


@dataclass(frozen=True)
class EarlyStopping:
    """A scheduler choice resolved: its Ray Tune scheduler and the budgets every trial trains through."""

    kind: str
    scheduler: Any  # a ray.tune.schedulers.TrialScheduler
    budgets: tuple[int, ...]  # the trainable's ladder; (epochs,) without budget-aware rungs
    rungs: tuple[int, ...]  # where trials are judged (epochs of a finished schedule, or epochs trained)
    stratify_by: str | None = None  # the config key whose values are halved apart (budget only)


def ladder(kind: str, max_epochs: int, grace_period: int, reduction_factor: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the budgets every trial trains through, the rungs where trials are judged) of the scheduler ``kind``, without Ray."""
    if kind not in SCHEDULERS:
        raise ValueError(f"scheduler {kind!r}: expected one of {', '.join(SCHEDULERS)}")
    if kind == "fifo":
        return (max_epochs,), ()
    rungs = tuple(rung_budgets(max_epochs, grace_period, reduction_factor)[:-1])
    return ((*rungs, max_epochs) if kind == "budget" else (max_epochs,)), rungs


def make_early_stopping(
    kind: str, max_epochs: int, grace_period: int, reduction_factor: float, stratify_by: str | None = None
) -> EarlyStopping:
    """The scheduler ``kind`` (one of SCHEDULERS) for trials of ``max_epochs`` epochs; ``budget`` halves within ``stratify_by``."""
    from ray.tune.schedulers import FIFOScheduler

    from study.search.halving import StratifiedHalving

    budgets, rungs = ladder(kind, max_epochs, grace_period, reduction_factor)
    if kind == "fifo":
        return EarlyStopping(kind, FIFOScheduler(), budgets, rungs)
    halving_args = {
        "time_attr": "completed_budget" if kind == "budget" else "training_iteration",
        "max_t": max_epochs,
        "grace_period": grace_period,
        "reduction_factor": reduction_factor,
        "brackets": 1,
    }
    halving = StratifiedHalving(stratify_by if kind == "budget" else None, halving_args)  # asha: one stratum
    return EarlyStopping(kind, halving, budgets, rungs, stratify_by if kind == "budget" else None)


def describe(stopping: EarlyStopping) -> str:
    """One phrase for the study's header line."""
    return describe_rule(stopping.kind, stopping.rungs, stopping.stratify_by)


def describe_rule(kind: str, rungs: Sequence[int], stratify_by: str | None = None) -> str:
    """One phrase for the scheduler ``kind`` judging at ``rungs`` (within each ``stratify_by``): the header and the report."""
    if kind == "fifo":
        return "no early stopping"
    name = "budget-aware successive halving" if kind == "budget" else "stock ASHA"
    if not rungs:  # the grace period reaches the epochs
        return f"{name} with no rung before the last epoch: every trial trains its full schedule"
    at = ", ".join(str(r) for r in rungs)
    if kind == "budget":
        within = f", within each {stratify_by}" if stratify_by else ""
        return f"{name} at budgets {at} (each a finished schedule{within})"
    return f"{name} at epochs {at} of the full schedule"

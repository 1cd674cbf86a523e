"""Training to a ladder of budgets: every rung is judged on a finished schedule.

A budget-aware scheduler judges a trial after b epochs, so the trial must have
finished a schedule scaled to b by then (schedule.py: heating and the lr decay
happen in the budget's tail). ``fit_budgets`` trains ``config`` to each budget
of an increasing ladder ``b_1 < b_2 < ... < b_n`` in turn: budget ``b_i`` is
trained with ``epochs = b_i`` and, when the caller lets the trial go on,
``b_{i+1}`` continues from the checkpoint taken after ``shared_prefix`` epochs
of ``b_i`` (before its tail), not from scratch. A promotion costs
``b_{i+1} - shared_prefix(b_i)`` epochs.

With one budget (``budgets = [epochs]``) this is a plain ``engine.fit``.

Each epoch's metrics gain:

- ``budget``: the budget being trained; ``epoch``: the epoch within it (1-based);
- ``completed_budget``: the largest budget whose schedule has finished (0 before
  the first), the time axis a scheduler's rungs are read on;
- ``epochs_trained``: all epochs this trial has trained, over every budget;
- ``objective_step`` (when the value is a fair intermediate value): the budget
  at the end of each schedule, and with a single budget every epoch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from . import schedule
from .config import TrainConfig

if TYPE_CHECKING:  # the engine (torch, torchvision, faiss) is imported where a ladder trains, not by a driver reading rungs
    from .engine import Run


@dataclass(frozen=True)
class LadderState:
    """Where a trial is on its ladder; with the bundles, enough to resume it."""

    budget: int  # the budget being trained
    epochs_trained: int = 0  # over every budget
    completed_budget: int = 0  # the largest budget whose schedule finished
    bundle: dict[str, Any] | None = None  # the run after its last epoch (None: not started)
    prefix: dict[str, Any] | None = None  # the run after shared_prefix epochs of `budget` (None: from scratch)

    def to_dict(self) -> dict[str, int]:
        return {"budget": self.budget, "epochs_trained": self.epochs_trained, "completed_budget": self.completed_budget}


OnLadderEpoch = Callable[[dict[str, float], LadderState], None]


def rung_budgets(max_epochs: int, grace_period: int, reduction_factor: float) -> list[int]:
    """The budgets of successive halving: grace, grace x eta, ... below ``max_epochs``, then ``max_epochs``.

    These are the rungs of Ray Tune's ASHA (one bracket) with the same arguments.
    """
    if not 1 <= grace_period <= max_epochs or reduction_factor <= 1:
        raise ValueError(f"grace_period={grace_period}, reduction_factor={reduction_factor}: expected 1 <= grace <= {max_epochs}, > 1")
    budgets, b = [], float(grace_period)
    while round(b) < max_epochs:
        budgets.append(round(b))
        b *= reduction_factor
    return [*budgets, max_epochs]


def check_budgets(budgets: list[int]) -> list[int]:
    budgets = [int(b) for b in budgets]
    if not budgets or budgets[0] < 1 or any(a >= b for a, b in zip(budgets, budgets[1:])):
        raise ValueError(f"budgets={budgets}: expected increasing positive integers")
    return budgets


def _segment_start(state: LadderState, budget: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the bundle to resume ``budget`` from, its prefix bundle if already taken)."""
    if state.budget == budget and state.bundle is not None:  # continuing an interrupted budget
        return state.bundle, state.prefix
    return state.prefix, None  # a new budget starts from the previous budget's prefix


def fit_budgets(
    config: TrainConfig,
    budgets: list[int],
    on_epoch: OnLadderEpoch,
    *,
    state: LadderState | None = None,
    **fit_kwargs: Any,
) -> Run | None:
    """Train ``config`` through ``budgets`` (see the module docstring); ``fit_kwargs`` go to ``engine.fit``.

    ``state`` (from an earlier ``on_epoch``) resumes an interrupted ladder. The
    caller stops the ladder by raising from ``on_epoch`` or by returning from the
    trainable; a budget that finishes is followed by the next one.
    """
    from .engine import fit

    budgets = check_budgets(budgets)
    state = state or LadderState(budget=budgets[0])
    run = None
    for budget in budgets[budgets.index(state.budget) if state.budget in budgets else 0 :]:
        budget_config = config.replace(epochs=budget)
        resume, prefix = _segment_start(state, budget)
        prefix_epoch = schedule.shared_prefix(budget_config)
        if prefix is None and resume is not None and int(resume["epoch"]) == prefix_epoch:
            prefix = resume
        state = replace(state, budget=budget, prefix=prefix)

        def hook(epoch: int, metrics: dict[str, float], run: Run, budget: int = budget, prefix_epoch: int = prefix_epoch) -> None:
            nonlocal state
            bundle = run.bundle()
            if epoch == prefix_epoch:
                state = replace(state, prefix=copy.deepcopy(bundle))
            done = epoch == budget
            state = replace(
                state,
                epochs_trained=state.epochs_trained + 1,
                completed_budget=budget if done else state.completed_budget,
                bundle=bundle,
            )
            extra = {"budget": budget, "epoch": epoch, "epochs_trained": state.epochs_trained, "completed_budget": state.completed_budget}
            if done or len(budgets) == 1:
                extra["objective_step"] = epoch
            on_epoch({**metrics, **extra}, state)

        run = fit(budget_config, hook, resume=resume, **fit_kwargs)
    return run

"""How a trial ended, from what it reported: the one rule the searcher, the MLflow records and the progress line share.

A trial is

- FAIL when it raised, or when its last result has no finite value of the objective metric;
- COMPLETE when it finished its full schedule: its last result says ``max_epochs`` epochs
  (``completed_budget``, the epochs of the last schedule it trained to the end, where the
  trainable reports one; else ``training_iteration``, one report per epoch);
- PRUNED otherwise: the scheduler (ASHA) stopped it early.

This module imports neither Ray nor MLflow nor Optuna, so the rule is tested on hand-written results.
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


def trial_outcome(last_result: Mapping[str, Any] | None, *, error: bool, metric: str, max_epochs: int) -> str:
    """COMPLETE, PRUNED or FAIL for a trial whose last reported result is ``last_result`` (see the module docstring)."""
    if error or not last_result or not is_finite_number(last_result.get(metric)):
        return FAIL
    return COMPLETE if epochs_done(last_result) >= max_epochs else PRUNED

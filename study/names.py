"""The one rule for the names a user gives the study commands: studies, experiments, registered models.

A name becomes a folder (``runs/reports/NAME``, ``runs/logs/NAME.log``, the Tune experiment under
``--storage-path``, an experiment's artifacts), a registered model, and a value in MLflow's search filters
(``tracking.run_filter``). So it is letters, digits, ``_ . -``, starting with a letter or digit, without ``..``,
at most 100 characters, and every command checks each name flag with this rule before anything starts.

MLflow 3.17's own rule for a registered model (``mlflow.utils.validation._validate_model_name``: not empty, no
``/`` or ``:``, no ``..`` part) is looser than this one, so a name this rule accepts is always one MLflow takes.
This module imports neither MLflow, Ray nor torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from study.inputs import UsageError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # matched whole (fullmatch: "$" would let a final newline in)
RULE = "letters, digits, '_', '.', '-' (starting with a letter or digit; no spaces, quotes, path separators or '..'), at most 100"


def is_name(text: str) -> bool:
    """Whether ``text`` follows the name rule."""
    return bool(NAME_PATTERN.fullmatch(text)) and ".." not in text


def check_names(flags: Mapping[str, str | None]) -> None:
    """Each ``{flag: value}`` given (not None) follows the name rule; else a UsageError naming the first that does not."""
    for flag, value in flags.items():
        if value is not None and not is_name(value):
            raise UsageError(f"{flag} {value!r}: expected a name of {RULE}")

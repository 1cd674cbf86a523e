"""Optimizers by name: ``build_optimizer(param_groups, config)``.

:data:`OPTIMIZERS` maps ``config.optimizer`` to a constructor taking the
parameter groups (each with its own ``lr``, from ``schedule.param_groups``) and
the config; its keys are the values TrainConfig allows for ``optimizer``.
``weight_decay`` applies to every optimizer, ``momentum`` to SGD only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import TrainConfig

OPTIMIZERS: dict[str, Callable[[list[dict], TrainConfig], torch.optim.Optimizer]] = {
    "sgd": lambda groups, config: torch.optim.SGD(groups, momentum=config.momentum, weight_decay=config.weight_decay),
    "adam": lambda groups, config: torch.optim.Adam(groups, weight_decay=config.weight_decay),
    "adamw": lambda groups, config: torch.optim.AdamW(groups, weight_decay=config.weight_decay),
}


def build_optimizer(groups: list[dict], config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` over ``groups`` (dicts with ``params`` and ``lr``)."""
    return OPTIMIZERS[config.optimizer](groups, config)

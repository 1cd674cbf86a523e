"""Heating and learning-rate schedules: pure functions of the epoch.

Heating (000_4178e6910e81cd2f, sec. 3.2 and 4) lowers alpha from ``alpha`` to
``heating_target`` once ``heating_start`` of the epochs have passed:

- ``two_stage``: the paper's recipe: train at alpha, then fine-tune at the
  target with the learning rate multiplied by ``heating_lr_factor``;
- ``linear`` / ``cosine``: a gradual anneal from alpha to the target (and of the
  lr factor from 1 to ``heating_lr_factor``) over the remaining epochs;
- ``none``: alpha and the learning rate stay fixed.

Epochs are counted from 0; ``epoch`` may be fractional.
"""

from __future__ import annotations

import math

from .config import TrainConfig


def heating_progress(config: TrainConfig, epoch: float) -> float:
    """How far heating has gone at ``epoch``: 0 before it starts, 1 when done."""
    if config.heating == "none":
        return 0.0
    start = config.heating_start * config.epochs
    if config.heating == "two_stage":
        return 1.0 if epoch >= math.floor(start) and config.heating_start < 1 else 0.0
    span = max(config.epochs - 1 - start, 1e-9)
    t = min(max((epoch - start) / span, 0.0), 1.0)
    return t if config.heating == "linear" else 0.5 * (1 - math.cos(math.pi * t))


def alpha_at(config: TrainConfig, epoch: float) -> float:
    """The inverse temperature to train with at ``epoch``."""
    t = heating_progress(config, epoch)
    return config.alpha + t * (config.heating_target - config.alpha)


def lr_factor_at(config: TrainConfig, epoch: float) -> float:
    """Multiplier of the base learning rates at ``epoch``."""
    t = heating_progress(config, epoch)
    return 1.0 + t * (config.heating_lr_factor - 1.0)


def param_groups(base: list, new: list, config: TrainConfig) -> list[dict]:
    """Optimizer groups: backbone at lr, new layers (head, classifier, alpha) at lr x new_layer_lr_mult.

    Each group remembers its base lr under ``base_lr`` for :func:`set_lr`.
    """
    groups = [{"params": base, "base_lr": config.lr}, {"params": new, "base_lr": config.lr * config.new_layer_lr_mult}]
    for group in groups:
        group["lr"] = group["base_lr"]
    return [g for g in groups if g["params"]]


def set_lr(optimizer, factor: float) -> float:
    """Scale every group's base lr by ``factor``; returns the first group's lr."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]

"""Heating and learning-rate schedules: pure functions of the epoch, scaled to a budget.

Every schedule is defined per *budget*: the number of epochs the run is being
trained to, ``config.epochs``. A scheduler that judges a trial after b epochs
trains it with ``epochs = b``, so heating and the lr decay are complete when it
is judged; both start at fixed *fractions* of the budget.

Heating (000_4178e6910e81cd2f, sec. 3.2 and 4) lowers alpha from ``alpha`` to
``heating_target`` once ``heating_start`` of the budget has passed:

- ``two_stage``: the paper's recipe: train at alpha, then fine-tune at the target
  (with ``lr_schedule: step`` and ``lr_decay_start = heating_start``, at the
  learning rate multiplied by ``heating_lr_factor``, as in the paper);
- ``linear`` / ``cosine``: a gradual anneal from alpha to the target over the rest
  of the budget;
- ``none``: alpha stays fixed.

The learning rate (Li et al., "Budgeted Training: Rethinking Deep Neural Network
Training Under Resource Constraints", ICLR 2020: a schedule that decays to zero
at the end of the budget is best under a budget) is the base lr times a factor
that is 1 until ``lr_decay_start`` of the budget, then:

- ``constant``: stays 1;
- ``step``: drops to ``heating_lr_factor``;
- ``linear``: falls linearly to 0 at the end of the budget (with
  ``lr_decay_start: 0``, the paper's linear-to-zero schedule);
- ``cosine``: follows half a cosine to 0 at the end of the budget.

``epoch`` counts from 0 and may be fractional (the engine updates both per step).
Before ``shared_prefix(config)`` epochs every schedule is the same for every
budget, so a run trained to one budget can be continued to a larger one from
its checkpoint at that epoch.
"""

from __future__ import annotations

import math

from .config import TrainConfig


def _ramp(start: float, end: float, epoch: float) -> float:
    """0 before ``start``, 1 at ``end`` and after, linear in between."""
    if epoch < start:
        return 0.0
    return min((epoch - start) / max(end - start, 1e-9), 1.0)


def heats(config: TrainConfig) -> bool:
    """Whether alpha changes during training (heated-up softmax with a heating schedule)."""
    return config.loss == "softmax" and config.heating != "none" and config.heating_start < 1


def heating_progress(config: TrainConfig, epoch: float) -> float:
    """How far heating has gone at ``epoch``: 0 before it starts, 1 when done."""
    if not heats(config):
        return 0.0
    start = config.heating_start * config.epochs
    if config.heating == "two_stage":
        return 1.0 if epoch >= math.floor(start) else 0.0
    t = _ramp(start, config.epochs, epoch)
    return t if config.heating == "linear" else 0.5 * (1 - math.cos(math.pi * t))


def alpha_at(config: TrainConfig, epoch: float) -> float:
    """The inverse temperature to train with at ``epoch``."""
    t = heating_progress(config, epoch)
    return config.alpha + t * (config.heating_target - config.alpha)


def lr_factor_at(config: TrainConfig, epoch: float) -> float:
    """Multiplier of the base learning rates at ``epoch`` (see the module docstring)."""
    if config.lr_schedule == "constant" or config.lr_decay_start >= 1:
        return 1.0
    start = config.lr_decay_start * config.epochs
    if config.lr_schedule == "step":
        return config.heating_lr_factor if epoch >= math.floor(start) else 1.0
    t = _ramp(start, config.epochs, epoch)
    return 1.0 - t if config.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * t))


def shared_prefix(config: TrainConfig) -> int:
    """Epochs at the start of the budget whose schedule is the same for every larger budget.

    Alpha and the lr factor are constant there (alpha, 1), and the tail after it
    scales with the budget: a run trained to ``config.epochs`` is continued to a
    larger budget from its state after this many epochs.
    """
    starts = [1.0]
    if heats(config):
        starts.append(config.heating_start)
    if config.lr_schedule != "constant":
        starts.append(config.lr_decay_start)
    return math.floor(min(starts) * config.epochs)


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

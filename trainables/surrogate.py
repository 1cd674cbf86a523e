"""A stand-in for ``trainables.dml.train_dml`` that trains nothing: seeded learning curves, for rehearsing a study.

``train_surrogate`` has ``train_dml``'s call signature (plus ``epoch_seconds``), walks the same ladder of budgets
as ``trainables.core.budgets.fit_budgets``, sleeps ``epoch_seconds`` per epoch and reports, every epoch, the
metric names the engine reports in study mode with a small checkpoint, so that a scheduler, a searcher, the
records and a cluster's failure handling can be rehearsed at the cost of a sleep. It imports no torch,
torchvision, faiss or sklearn, so a trial starts in a fraction of a second on any node.
``data_root``, ``device`` and ``num_workers`` are accepted and ignored; the reported device is ``cpu``.

The curve
---------
A deterministic function of (config, budget b, epoch e of that budget, 1-based) plus seeded noise, shaped like
this project's small CNN on Omniglot's test alphabets (the results it follows: docs/findings.md, the papers' tables;
the surrogate has no separate scale for the near-saturated validation characters)::

    R@1(b, e) = clip(R0 + ((A - R0) + T(b, e)) * P(e * v) + 0.01 * z_seed + 0.005 * z_epoch [+ 0.01 * z_fold], 0, 1)

    P(x)    = 1 - 0.6 exp(-x / 1.5) - 0.4 exp(-x / 10)          saturating progress: a fast and a slow phase
    v       = clip((lr / lr*)^0.3, 1/4, 4)                      a larger lr learns faster (lr* by optimizer)
    A       = clip(0.78 + sum of the gains below, R0 + 0.05, 0.95)   the config's asymptote; R0 = 0.10
              - 0.12 (log10(lr / lr*))^2                        lr* = 2e-3 (adam, adamw), 5e-2 (sgd)
              + {bn: 0, l2: -0.015, none: -0.05}[normalization]  (Table 1 of 000_4178e6910e81cd2f, reproduced here)
              - 0.01 (log2(alpha / 5))^2                        softmax with l2 / bn features (Table 5: 4 > 16 > 32 > 64)
              + 0.03 - 0.009 (log2(ice_scale / 20))^2           ice (best s 16-32 here, s = 1 far behind)
              + 0.015 clip(log2(classes_per_batch / 16), -2, 2) more classes per batch: more negatives
              - 0.015 (log2(samples_per_class / 3))^2           k about 3
              + 0.01 clip(log2(embedding_dim / 64), -4, 1)
    T(b, e) = 0.04 d_lr + H(b) d_heat                           the bump of the budget's tail
              d_lr   = 1 - schedule.lr_factor_at(config_b, s)   how far the lr has decayed (Li et al., ICLR 2020)
              d_heat = schedule.heating_progress(config_b, s)
              H(b)   = 0.04 min(1, log2(alpha / heating_target) / 2) tanh((b - 12) / 8)
                       heating costs on a short budget and pays on a long one (docs/findings.md: the papers'
                       tables, and HBN at 30 epochs)

where ``config_b`` is the config with ``epochs = b`` and ``s = e - 1 / steps`` is the fractional epoch of the
epoch's last step (``steps`` = 2,180 Omniglot fit images // batch size), the moment the engine reads ``lr_now``
and ``alpha_now``. ``P`` rises with e and T(b, b) does not fall with b, so a finished larger budget ends higher
than a smaller one. ``z_seed`` (one draw per run: the spread between seeds) comes from
``default_rng([seed, key, 0])`` and ``z_epoch`` (one per evaluation) from ``default_rng([seed, key, 1, b, e])``,
where ``key`` is a sha256 of the keys that change training other than seed, epochs and val_fold
(``config.applicable_keys``), so two configs that train alike draw alike. A confirmation re-run on validation fold
f > 0 (other held-out classes) adds ``0.01 * z_fold``, drawn from ``default_rng([key, 2, f])``: the same for every
seed of the config on that fold, as held-out classes are. The other metrics follow R@1 (r = R@1,
m = 1 - r), with the constants fitted to docs/findings.md's tables::

    val_recall_at_k  = 1 - m (0.45 + 0.5 m)^log2(k)     k in 1, 2, 4, 8
    val_map_at_r     = 0.72 r^2.35                      below R@1
    val_r_precision  = map_at_r^0.85                    a little above MAP@R
    val_nmi          = 0.3 + 0.65 r
    train_loss       = L0 (1 - 0.7 (A - R0) / (1 - R0) P(e v)) (1 - 0.15 d_lr)   falls every epoch of a budget
                       L0 = ln(fit classes) (softmax), (k - 1) ln(C k - k + 1) (ice)
    train_accuracy   = r^1.5
    train_mean_proxy_norm = 0.5 exp(-3 mean_proxy_weight) (1 - 0.5 P(e v))   (softmax)
    lr_now = lr * schedule.lr_factor_at(config_b, s);  alpha_now = schedule.alpha_at(config_b, s)   (softmax)

The ``time/*`` keys are the seconds actually slept: all of it training, none data loading or evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune

from trainables.cadence import CheckpointCadence
from trainables.core import schedule
from trainables.core.budgets import check_budgets
from trainables.core.config import TrainConfig, applicable_keys, held_out_classes

STATE_NAME = "surrogate.json"  # the checkpoint: a LadderPlace as JSON
# The same variable as trainables.dml.FAULT_ENV and the same marker file as train_dml's, spelled again here because
# importing trainables.dml imports torch: each trial raises once, after training this epoch (before reporting it).
FAULT_ENV = "DML_INJECT_FAULT_AT_EPOCH"
FAULT_DONE = "injected_fault_done"
# For tests that act mid-study whatever the machine's load: while the file this names exists, a trial that has trained
# 2 epochs starts no other (its records of them still reach MLflow), so the study cannot end before the test acts
HOLD_ENV = "DML_REHEARSAL_HOLD"
HOLD_AFTER_EPOCHS = 2

R0 = 0.10  # R@1 before training
A_BASE = 0.78  # the asymptote of a config with no gains or penalties
LR_SWEET = {"adam": 2e-3, "adamw": 2e-3, "sgd": 5e-2}
NORMALIZATION_GAIN = {"bn": 0.0, "l2": -0.015, "none": -0.05}
SEED_NOISE, EPOCH_NOISE = 0.01, 0.005  # standard deviations of R@1 between seeds and between evaluations
FOLD_NOISE = 0.01  # of a config's R@1 between validation folds (classes held out), beside fold 0's
OMNIGLOT_TRAIN_CLASSES, OMNIGLOT_IMAGES_PER_CLASS = 136, 20  # images_background_small1: 136 characters x 20 drawers
RECALL_KS = (1, 2, 4, 8)  # Omniglot's


# -- the curve ----------------------------------------------------------------------------------------------------


def progress(x: float) -> float:
    """P(x) of the module docstring: 0 at x = 0, rising to 1; x is epochs times the lr's speed."""
    return 1.0 - 0.6 * math.exp(-x / 1.5) - 0.4 * math.exp(-x / 10.0)


def _lr_decades(config: TrainConfig) -> float:
    return math.log10(config.lr / LR_SWEET[config.optimizer])


def speed(config: TrainConfig) -> float:
    """v of the module docstring: epochs of progress per epoch trained, (lr / lr*)^0.3 within [1/4, 4]."""
    return min(max(10 ** (0.3 * _lr_decades(config)), 0.25), 4.0)


def asymptote(config: TrainConfig) -> float:
    """A of the module docstring: the R@1 a config approaches without its tail's bump, in [R0 + 0.05, 0.95]."""
    gain = -0.12 * _lr_decades(config) ** 2 + NORMALIZATION_GAIN[config.normalization]
    if config.loss == "softmax" and config.normalization != "none":  # raw features carry their own scale
        gain -= 0.01 * math.log2(config.alpha / 5.0) ** 2
    if config.loss == "ice":
        gain += 0.03 - 0.009 * math.log2(config.ice_scale / 20.0) ** 2
    gain += 0.015 * min(max(math.log2(config.classes_per_batch / 16), -2.0), 2.0)
    gain -= 0.015 * math.log2(config.samples_per_class / 3) ** 2
    gain += 0.01 * min(max(math.log2(config.embedding_dim / 64), -4.0), 1.0)
    return min(max(A_BASE + gain, R0 + 0.05), 0.95)


def fit_classes(config: TrainConfig) -> int:
    """Omniglot's training characters less the validation fold, as ``data.split_classes`` holds out: 109 at
    ``val_fraction`` 0.2, 95 at 0.3."""
    return OMNIGLOT_TRAIN_CLASSES - held_out_classes(OMNIGLOT_TRAIN_CLASSES, config.val_fraction)


def steps_per_epoch(config: TrainConfig) -> int:
    """Batches of an Omniglot study epoch, as the sampler counts them (fit images // batch size)."""
    return max(1, fit_classes(config) * OMNIGLOT_IMAGES_PER_CLASS // config.batch_size)


def config_key(config: TrainConfig) -> int:
    """A stable 64-bit hash of the keys that change training, less seed and epochs (never Python's salted hash)."""
    values = {key: getattr(config, key) for key in applicable_keys(config) if key not in ("seed", "epochs", "val_fold")}
    return int.from_bytes(hashlib.sha256(json.dumps(values, sort_keys=True).encode()).digest()[:8], "big")


def surrogate_metrics(config: TrainConfig, budget: int, epoch: int) -> dict[str, float]:
    """The metrics of ``epoch`` (1-based) of ``config`` trained to ``budget`` epochs (the module docstring's formula).

    A pure function of (config less its epochs, budget, epoch): the engine's study-mode names without the ``time/*``
    keys, each value a float; ``alpha_now`` and ``train_mean_proxy_norm`` for the softmax only, as the engine.
    """
    if not 1 <= epoch <= budget:
        raise ValueError(f"epoch={epoch}, budget={budget}: expected 1 <= epoch <= budget")
    config_b = dataclasses.replace(config, epochs=budget)  # the schedule scaled to the budget, as fit_budgets trains it
    s = epoch - 1.0 / steps_per_epoch(config)
    decayed = 1.0 - schedule.lr_factor_at(config_b, s)
    heated = schedule.heating_progress(config_b, s)
    target_octaves = math.log2(config.alpha / config.heating_target) if schedule.heats(config) else 0.0
    heat_gain = 0.04 * min(1.0, target_octaves / 2) * math.tanh((budget - 12) / 8)
    tail = 0.04 * decayed + heat_gain * heated

    a, p = asymptote(config), progress(epoch * speed(config))
    key = config_key(config)
    z_seed = np.random.default_rng([config.seed, key, 0]).standard_normal()
    z_epoch = np.random.default_rng([config.seed, key, 1, budget, epoch]).standard_normal()
    z_fold = np.random.default_rng([key, 2, config.val_fold]).standard_normal() if config.val_fold else 0.0
    r = min(max(R0 + (a - R0 + tail) * p + SEED_NOISE * z_seed + EPOCH_NOISE * z_epoch + FOLD_NOISE * z_fold, 0.0), 1.0)

    miss = 1.0 - r
    map_at_r = 0.72 * r**2.35
    if config.loss == "softmax":
        start_loss = math.log(fit_classes(config))
    else:
        k = config.samples_per_class
        start_loss = (k - 1) * math.log(config.classes_per_batch * k - k + 1)
    metrics = {
        "train_loss": start_loss * (1.0 - 0.7 * (a - R0) / (1.0 - R0) * p) * (1.0 - 0.15 * decayed),
        "train_accuracy": r**1.5,
    }
    if config.loss == "softmax":
        metrics["train_mean_proxy_norm"] = 0.5 * math.exp(-3.0 * config.mean_proxy_weight) * (1.0 - 0.5 * p)
    metrics["lr_now"] = config.lr * schedule.lr_factor_at(config_b, s)
    if config.loss == "softmax":
        metrics["alpha_now"] = schedule.alpha_at(config_b, s)
    for k in RECALL_KS:
        metrics[f"val_recall_at_{k}"] = 1.0 - miss * (0.45 + 0.5 * miss) ** math.log2(k)
    metrics.update({"val_map_at_r": map_at_r, "val_r_precision": map_at_r**0.85, "val_nmi": 0.3 + 0.65 * r})
    return {name: float(value) for name, value in metrics.items()}


# -- the ladder ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LadderPlace:
    """Where a trial is on its ladder after an epoch: what the checkpoint holds, enough to resume it.

    The surrogate's counterpart of ``budgets.LadderState``, with the bundles replaced by the epochs they were taken at.
    """

    budget: int  # the budget being trained
    epoch: int = 0  # epochs of `budget` done (its schedule's epoch; 0: not started)
    epochs_trained: int = 0  # over every budget
    completed_budget: int = 0  # the largest budget whose schedule finished
    prefix_epoch: int | None = None  # the epoch of `budget` a larger budget continues from, once trained (None: none)

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LadderPlace:
        prefix = values.get("prefix_epoch")
        return cls(
            budget=int(values["budget"]),
            epoch=int(values["epoch"]),
            epochs_trained=int(values["epochs_trained"]),
            completed_budget=int(values["completed_budget"]),
            prefix_epoch=None if prefix is None else int(prefix),
        )

    def report_keys(self, single_budget: bool) -> dict[str, int]:
        """The keys fit_budgets adds to an epoch's metrics; ``objective_step`` at a budget's end or with one budget."""
        keys = {
            "budget": self.budget,
            "epoch": self.epoch,
            "epochs_trained": self.epochs_trained,
            "completed_budget": self.completed_budget,
        }
        if self.epoch == self.budget or single_budget:
            keys["objective_step"] = self.epoch
        return keys


def ladder_places(config: TrainConfig, budgets: list[int], place: LadderPlace | None = None) -> Iterator[LadderPlace]:
    """The place after each epoch ``fit_budgets`` trains through ``budgets``, in order, resuming after ``place``.

    Budget b_i is trained with epochs = b_i; b_{i+1} continues from b_i's epoch ``schedule.shared_prefix`` (from
    scratch when that is 0), so a promotion costs b_{i+1} - shared_prefix(b_i) epochs. An interrupted budget goes on
    after its last epoch; a place at a budget's end goes on with the next budget.
    """
    budgets = check_budgets(budgets)
    place = place or LadderPlace(budget=budgets[0])
    for budget in budgets[budgets.index(place.budget) if place.budget in budgets else 0 :]:
        prefix_epoch = schedule.shared_prefix(dataclasses.replace(config, epochs=budget))
        if budget == place.budget and place.epoch > 0:  # continuing an interrupted budget
            start, prefix = place.epoch, place.prefix_epoch
        else:  # a new budget starts from the previous budget's prefix
            start, prefix = place.prefix_epoch or 0, None
        if prefix is None and 0 < start == prefix_epoch:  # the epoch it starts from is its own prefix too
            prefix = start
        place = dataclasses.replace(place, budget=budget, epoch=start, prefix_epoch=prefix)
        for epoch in range(start + 1, budget + 1):
            place = dataclasses.replace(
                place,
                epoch=epoch,
                epochs_trained=place.epochs_trained + 1,
                completed_budget=budget if epoch == budget else place.completed_budget,
                prefix_epoch=epoch if epoch == prefix_epoch else place.prefix_epoch,
            )
            yield place


# -- the trainable ------------------------------------------------------------------------------------------------


def _where() -> dict[str, str]:
    """Where the trial runs, as train_dml tags it (the surrogate computes on the CPU)."""
    return {
        "node": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "device": "cpu",
    }


def train_surrogate(
    config: dict[str, Any],
    *,
    data_root: str | None = None,
    device: str | None = None,
    num_workers: int = 0,
    budgets: list[int] | None = None,
    epoch_seconds: float = 1.0,
    checkpoint_every_s: float = 0.0,
) -> None:
    """Ray Tune function trainable for one trial, ``train_dml``'s reports without training; ``budgets``: ``[config epochs]``.

    Each epoch sleeps ``epoch_seconds``, then reports ``surrogate_metrics``, the ``time/*`` keys, the ladder's keys
    and the trial's place (node, node_ip, node_id, device; ``resumed_from_epoch`` after a resume), with a checkpoint
    of its ``LadderPlace`` at most every ``checkpoint_every_s`` seconds (``trainables.cadence``; 0: every epoch).
    """
    train_config = TrainConfig.from_dict(dict(config), source="trial config")
    budgets = check_budgets(budgets or [train_config.epochs])
    where = _where()

    saved = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = LadderPlace.from_dict(json.loads((Path(folder) / STATE_NAME).read_text()))
        where["resumed_from_epoch"] = str(saved.epochs_trained)  # a tag of the trial's record, as train_dml's

    fault_epoch = int(os.environ.get(FAULT_ENV, "0") or 0)
    fault_done = Path(tune.get_context().get_trial_dir() or tempfile.gettempdir()) / FAULT_DONE
    cadence = CheckpointCadence(checkpoint_every_s)

    hold = os.environ.get(HOLD_ENV)
    for place in ladder_places(train_config, budgets, saved):
        while hold and place.epochs_trained > HOLD_AFTER_EPOCHS and os.path.exists(hold):
            time.sleep(0.05)
        started = time.perf_counter()
        time.sleep(epoch_seconds)
        slept = time.perf_counter() - started
        if place.epochs_trained == fault_epoch and not fault_done.exists():  # a transient failure, for reliability tests
            fault_done.parent.mkdir(parents=True, exist_ok=True)
            fault_done.touch()
            raise RuntimeError(f"injected fault at epoch {place.epochs_trained} (simulated out of memory)")
        times = {"time/data_s": 0.0, "time/compute_s": slept, "time/train_s": slept, "time/eval_s": 0.0, "time/epoch_s": slept}
        metrics = {**surrogate_metrics(train_config, place.budget, place.epoch), **times, **place.report_keys(len(budgets) == 1)}
        if not cadence.take():
            tune.report({**metrics, **where})
            continue
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / STATE_NAME).write_text(json.dumps(place.to_dict()))
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(folder))

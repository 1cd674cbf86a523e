"""The Ray Tune trainable: one trial = one ``trainables.core.budgets.fit_budgets`` in study mode.

The trial's config is the flat dict of TrainConfig keys; runtime settings
(data root, device, loader workers, the ladder of budgets) arrive through
``tune.with_parameters``. It reports once per epoch the engine's metrics,
the ladder's place and where it runs (node, device, ``resumed_from_epoch``
after a resume: strings, for tags) with a checkpoint (the run's bundle, the
bundle before the budget's tail, and where it is on the ladder), and resumes
from ``tune.get_checkpoint()`` after a failure, a node
loss or a restored study. With several budgets the scheduler reads
``completed_budget``: each rung sees a finished schedule. This is the only
module of ``trainables`` that imports ray.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from trainables.cadence import CheckpointCadence
from trainables.core.budgets import LadderState, fit_budgets
from trainables.core.checkpoint import BUNDLE_NAME, load_bundle, save_bundle
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import DatasetError, DatasetSplits, load_dataset, resolve_data_root
from trainables.core.engine import TrainingDiverged

PREFIX_NAME = "prefix.pt"  # the run before its budget's tail, where the next budget continues from
LADDER_NAME = "ladder.json"

DETERMINISTIC_FAILURE = "deterministic_failure.txt"
# Fault injection for reliability tests: each trial raises once, after training this epoch (before reporting it).
FAULT_ENV = "DML_INJECT_FAULT_AT_EPOCH"


def _resources() -> tuple[int, float]:
    """CPUs and GPUs Ray assigned to this trial."""
    try:
        assigned = ray.get_runtime_context().get_assigned_resources()
    except Exception:  # outside a Ray worker (a direct call in a test)
        assigned = {}
    return max(1, int(assigned.get("CPU", 1))), float(assigned.get("GPU", 0.0))


def _placement(device: str | None) -> tuple[str, dict[str, str]]:
    """The trial's device (CUDA when Ray gave it a GPU) and where it runs; sets torch's threads to its CPUs."""
    cpus, gpus = _resources()
    torch.set_num_threads(cpus)
    if device is None:
        device = "cuda" if gpus > 0 and torch.cuda.is_available() else "cpu"
    where = {
        "node": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "device": device,
    }
    return device, where


def save_state(state: LadderState, folder: Path) -> None:
    """A trial checkpoint: the run's bundle, its prefix bundle (if taken) and its place on the ladder."""
    save_bundle(state.bundle, folder / BUNDLE_NAME)
    if state.prefix is not None:
        save_bundle(state.prefix, folder / PREFIX_NAME)
    (folder / LADDER_NAME).write_text(json.dumps(state.to_dict()))


def load_state(folder: Path) -> LadderState:
    """Read what :func:`save_state` wrote (a checkpoint without ladder.json is a single-budget run)."""
    bundle = load_bundle(folder / BUNDLE_NAME)
    ladder = json.loads((folder / LADDER_NAME).read_text()) if (folder / LADDER_NAME).is_file() else {}
    epoch = int(bundle["epoch"])
    budget = int(ladder.get("budget", bundle["config"]["epochs"]))
    return LadderState(
        budget=budget,
        epochs_trained=int(ladder.get("epochs_trained", epoch)),
        completed_budget=int(ladder.get("completed_budget", budget if epoch >= budget else 0)),
        bundle=bundle,
        prefix=load_bundle(folder / PREFIX_NAME) if (folder / PREFIX_NAME).is_file() else None,
    )


@functools.lru_cache(maxsize=2)
def worker_dataset(name: str, data_root: str | None, image_size: int) -> DatasetSplits:
    """The dataset as this worker process decoded it, kept for every budget of the trial and for the next trial
    the worker runs (study.launch reuses workers): a dataset is read once per worker, not once per rung and trial."""
    return load_dataset(name, data_root, image_size)


def train_dml(
    config: dict[str, Any],
    *,
    data_root: str | None = None,
    device: str | None = None,
    num_workers: int | None = None,
    budgets: list[int] | None = None,
    checkpoint_every_s: float = 0.0,
) -> None:
    """Ray Tune function trainable for one trial; ``budgets`` defaults to ``[config epochs]``. An epoch's report carries
    a checkpoint at most every ``checkpoint_every_s`` seconds (``trainables.cadence``; 0: every epoch). ``num_workers``:
    data-loading workers, None for ``engine.loader_workers``' rule (photos on CUDA: the trial's CPUs - 1; else none)."""
    train_config = TrainConfig.from_dict(dict(config), source="trial config")
    device, where = _placement(device)

    # A deterministic failure (divergence, a corrupt image, a bad config) is not worth a retry:
    # the first attempt leaves a marker, and a retry stops at once with the same message.
    marker = Path(tune.get_context().get_trial_dir() or tempfile.gettempdir()) / DETERMINISTIC_FAILURE
    if marker.is_file():
        raise RuntimeError(f"not retried: {marker.read_text().strip()}")

    state = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = load_state(Path(folder))
    if state is not None:  # a retry or a restored study: where it continued, a tag of the trial's record
        where["resumed_from_epoch"] = str(state.epochs_trained)

    fault_epoch = int(os.environ.get(FAULT_ENV, "0") or 0)
    fault_done = marker.with_name("injected_fault_done")
    cadence = CheckpointCadence(checkpoint_every_s)

    def on_epoch(metrics: dict[str, float], state: LadderState) -> None:
        if state.epochs_trained == fault_epoch and not fault_done.exists():  # a transient failure, for reliability tests
            fault_done.parent.mkdir(parents=True, exist_ok=True)
            fault_done.touch()
            raise RuntimeError(f"injected fault at epoch {state.epochs_trained} (simulated out of memory)")
        clean = {k: (v if math.isfinite(v) else float("nan")) for k, v in metrics.items()}
        if not cadence.take():
            tune.report({**clean, **where})
            return
        with tempfile.TemporaryDirectory() as folder:
            save_state(state, Path(folder))
            tune.report({**clean, **where}, checkpoint=tune.Checkpoint.from_directory(folder))

    try:
        root = resolve_data_root(data_root)
        fit_budgets(
            train_config,
            budgets or [train_config.epochs],
            on_epoch,
            state=state,
            mode="study",
            splits=worker_dataset(train_config.dataset, str(root) if root else None, train_config.image_size),
            data_root=root,
            device=torch.device(device),
            num_workers=num_workers,
        )
    except (TrainingDiverged, DatasetError, ConfigError) as error:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{type(error).__name__}: {error}")
        raise

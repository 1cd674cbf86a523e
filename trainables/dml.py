"""The Ray Tune trainable: one trial = one ``trainables.core.engine.fit`` in study mode.

The trial's config is the flat dict of DESIGN.md's contract; runtime settings
(data root, device, loader workers) arrive through ``tune.with_parameters``.
It reports once per epoch (``training_iteration == epoch``) with a checkpoint
bundle, and resumes from ``tune.get_checkpoint()`` after a failure, a node
loss or a restored study. This is the only module of ``trainables`` that
imports ray.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from trainables.core.checkpoint import BUNDLE_NAME, load_bundle, save_bundle
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import DatasetError
from trainables.core.engine import Run, TrainingDiverged, fit

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


def train_dml(
    config: dict[str, Any],
    *,
    data_root: str | None = None,
    device: str | None = None,
    num_workers: int = 0,
) -> None:
    """Ray Tune function trainable for one trial."""
    train_config = TrainConfig.from_dict(dict(config), source="trial config")
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

    # A deterministic failure (divergence, a corrupt image, a bad config) is not worth a retry:
    # the first attempt leaves a marker, and a retry stops at once with the same message.
    marker = Path(tune.get_context().get_trial_dir() or tempfile.gettempdir()) / DETERMINISTIC_FAILURE
    if marker.is_file():
        raise RuntimeError(f"not retried: {marker.read_text().strip()}")

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            resume = load_bundle(Path(folder) / BUNDLE_NAME)

    fault_epoch = int(os.environ.get(FAULT_ENV, "0") or 0)
    fault_done = marker.with_name("injected_fault_done")

    def on_epoch(epoch: int, metrics: dict[str, float], run: Run) -> None:
        if epoch == fault_epoch and not fault_done.exists():  # a transient failure, for reliability tests
            fault_done.parent.mkdir(parents=True, exist_ok=True)
            fault_done.touch()
            raise RuntimeError(f"injected fault at epoch {epoch} (simulated out of memory)")
        clean = {k: (v if math.isfinite(v) else float("nan")) for k, v in metrics.items()}
        with tempfile.TemporaryDirectory() as folder:
            save_bundle(run.bundle(), Path(folder) / BUNDLE_NAME)
            tune.report(
                {**clean, **where, "resumed_from_epoch": int(resume["epoch"]) if resume else 0},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )

    try:
        fit(
            train_config,
            on_epoch,
            mode="study",
            data_root=data_root or os.environ.get("DML_DATA_ROOT"),
            device=torch.device(device),
            resume=resume,
            num_workers=num_workers,
        )
    except (TrainingDiverged, DatasetError, ConfigError) as error:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{type(error).__name__}: {error}")
        raise

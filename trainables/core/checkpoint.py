"""Self-describing checkpoint bundles.

A bundle is one ``torch.save`` d dict of tensors and plain Python values:
the resolved config, the epoch it was written after, the model (with
``embedding_reduction=pca``, its state dict holds the fitted PCA: ``pca.mean``,
``pca.components``, ``pca.explained_variance``, ``pca.fitted``), loss
(classifier and alpha), optimizer and sampler states, every RNG state, and
what is needed to rebuild the model without the dataset (number of classes,
image kind and size, input channels). It is always read back with
``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1
BUNDLE_NAME = "bundle.pt"


class CheckpointError(ValueError):
    """A checkpoint file cannot be used; the message names the file."""


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_bundle(bundle: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write atomically (temp file + rename): a crash never leaves half a bundle."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bundle-", suffix=".tmp")
    os.close(fd)
    try:
        torch.save({"format": FORMAT, **bundle}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


REQUIRED = ("config", "epoch", "model")


def load_bundle(path: str | os.PathLike) -> dict[str, Any]:
    """Read a bundle written by :func:`save_bundle` (a directory holding one is accepted)."""
    path = Path(path)
    if path.is_dir():
        path = path / BUNDLE_NAME
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        bundle = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, foreign pickle, code-executing payload, ...
        text = str(error).strip().splitlines()
        raise CheckpointError(f"{path}: not a loadable checkpoint bundle ({(text[0] if text else type(error).__name__)[:200]})") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT or any(k not in bundle for k in REQUIRED):
        raise CheckpointError(f"{path}: not a checkpoint bundle of this project (expected format {FORMAT} with {', '.join(REQUIRED)})")
    return bundle

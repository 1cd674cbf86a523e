"""PNG plots written by the study commands.

Figures are ``matplotlib.figure.Figure`` objects saved straight to a file: no
pyplot, no backend to select, nothing shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

# a trial's line in the learning curves, by its final Optuna state
STATE_COLORS = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red", "RUNNING": "tab:gray"}
NAMED_CURVES = 12  # up to this many curves are labelled by name in the legend


def pair_similarities(
    embeddings: np.ndarray, labels: np.ndarray, *, max_pairs: int = 200_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine similarities of positive (same class) and negative pairs, each sampled to at most ``max_pairs``.

    embeddings (N, D), labels (N,) -> (positive (P,), negative (Q,)) float32.
    """
    x = np.asarray(embeddings, dtype=np.float32)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    pos_i, pos_j = [], []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        i, j = np.triu_indices(len(members), k=1)
        pos_i.append(members[i])
        pos_j.append(members[j])
    pi, pj = np.concatenate(pos_i), np.concatenate(pos_j)
    if len(pi) > max_pairs:
        keep = rng.choice(len(pi), max_pairs, replace=False)
        pi, pj = pi[keep], pj[keep]
    ni = rng.integers(0, len(x), size=3 * max_pairs)
    nj = rng.integers(0, len(x), size=3 * max_pairs)
    different = labels[ni] != labels[nj]
    ni, nj = ni[different][:max_pairs], nj[different][:max_pairs]
    return np.einsum("nd,nd->n", x[pi], x[pj]), np.einsum("nd,nd->n", x[ni], x[nj])


def similarity_histogram(positive: np.ndarray, negative: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Histograms of positive and negative pair cosine similarities (as in appendix C of 003_d9e52229c07817f3)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    bins = np.linspace(-1, 1, 81)
    ax.hist(negative, bins=bins, density=True, alpha=0.6, label=f"negative pairs (mean {negative.mean():.3f})", color="tab:red")
    ax.hist(positive, bins=bins, density=True, alpha=0.6, label=f"positive pairs (mean {positive.mean():.3f})", color="tab:blue")
    ax.set_xlabel("cosine similarity")
    ax.set_ylabel("density")
    ax.set_title(title or "pair similarities on the test classes")
    ax.legend(loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def curves(
    series: Mapping[str, Mapping[int, float]], path: str | Path, *, ylabel: str, title: str, states: Mapping[str, str] | None = None
) -> Path:
    """A metric against epoch, one line per series ({name: {epoch: value}}).

    With ``states`` ({name: Optuna state name}) the lines are coloured by state,
    one legend entry per state; without, each line has its own colour and, up to
    ``NAMED_CURVES`` lines, its name in the legend.
    """
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    labelled: set[str] = set()
    for name, values in series.items():
        if not values:
            continue
        epochs = sorted(values)
        if states is None:
            color, label = None, name if len(series) <= NAMED_CURVES else None
        else:
            state = states.get(name, "?")
            color, label = STATE_COLORS.get(state, "k"), None if state in labelled else state.lower()
            labelled.add(state)
        ax.plot(epochs, [values[e] for e in epochs], marker=".", color=color, alpha=0.75, label=label)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def note(path: str | Path, title: str, text: str) -> Path:
    """A PNG that says why a plot could not be drawn (e.g. too few complete trials)."""
    fig = Figure(figsize=(6, 2.5))
    ax = fig.subplots()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path

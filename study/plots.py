"""PNG plots written by the study commands (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


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
    fig, ax = plt.subplots(figsize=(6, 4))
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
    plt.close(fig)
    return path

"""PNG plots written by the study commands.

Figures are ``matplotlib.figure.Figure`` objects saved straight to a file: no
pyplot, no backend to select, nothing shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

# a trial's line in the learning curves, by its final Optuna state
STATE_COLORS = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red", "RUNNING": "tab:gray"}
NAMED_CURVES = 12  # up to this many curves are labelled by name in the legend


def save(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """``fig`` written to ``path`` as a PNG; returns the path."""
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path


def unit_rows(x: np.ndarray) -> np.ndarray:
    """(N, D) -> (N, D), each row divided by its L2 norm (a zero row stays zero): cosine similarity is then a dot product."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def pair_similarities(
    embeddings: np.ndarray, labels: np.ndarray, *, max_pairs: int = 200_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine similarities of positive (same class) and negative pairs, each sampled to at most ``max_pairs``.

    embeddings (N, D), labels (N,) -> (positive (P,), negative (Q,)) float32.
    """
    x = unit_rows(np.asarray(embeddings, dtype=np.float32))
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
    return save(fig, path, dpi=110)


def curves(
    series: Mapping[str, Mapping[int, float]],
    path: str | Path,
    *,
    ylabel: str,
    title: str,
    states: Mapping[str, str] | None = None,
    marks: Mapping[str, float | tuple[float, float]] | None = None,
    xlabel: str = "epoch",
) -> Path:
    """:func:`curves_figure` saved to ``path``."""
    return save(curves_figure(series, ylabel=ylabel, title=title, states=states, marks=marks, xlabel=xlabel), path)


def curves_figure(
    series: Mapping[str, Mapping[int, float]],
    *,
    ylabel: str,
    title: str,
    states: Mapping[str, str] | None = None,
    marks: Mapping[str, float | tuple[float, float]] | None = None,
    xlabel: str = "epoch",
) -> Figure:
    """A metric against epoch, one line per series ({name: {epoch: value}}), with integer epoch ticks.

    With ``states`` ({name: Optuna state name}) the lines are coloured by state,
    one legend entry per state; without, each line has its own colour and, up to
    ``NAMED_CURVES`` lines, its name in the legend. ``marks`` ({label: epoch, or
    (first, last) epochs}) draws labelled vertical lines, or a shaded span where
    the epoch differs between series: rungs and budgets in gray, the heating
    start (a label with "heating") in purple.
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
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    for label, at in (marks or {}).items():
        color = "tab:purple" if "heating" in label else "tab:gray"
        if isinstance(at, tuple) and at[0] != at[1]:
            ax.axvspan(at[0], at[1], color=color, alpha=0.12, label=label)
        else:
            ax.axvline(at[0] if isinstance(at, tuple) else at, color=color, linestyle="--", linewidth=1, label=label)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def note(path: str | Path, title: str, text: str) -> Path:
    """A PNG that says why a plot could not be drawn (e.g. too few complete trials)."""
    fig = Figure(figsize=(6, 2.5))
    ax = fig.subplots()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    return save(fig, path)


def parallel_coordinates(
    rows: list[Mapping[str, object]],
    values: list[float],
    path: str | Path,
    *,
    metric: str,
    log_params: frozenset[str] | set[str] = frozenset(),
    choices: Mapping[str, list] | None = None,
) -> Path:
    """:func:`parallel_coordinates_figure` saved to ``path``."""
    return save(parallel_coordinates_figure(rows, values, metric=metric, log_params=log_params, choices=choices), path)


def axis_scale(seen: list, *, log: bool = False, choices: list | None = None) -> tuple[Callable[[object], float], list[tuple[float, str]]]:
    """One parallel-coordinates axis: a map of a value to [0, 1], and its ticks as (position, label).

    Numbers (when ``choices`` is None) are scaled to the range of
    ``seen`` (log10 when ``log`` and all are positive), with the range's ends
    and middle as ticks. Categories (``choices`` as far as seen, else the
    values seen in order) sit evenly spaced, a single one in the middle.
    """
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen)
    if numeric and choices is None:
        log = log and min(seen) > 0
        lo, hi = (math.log10(min(seen)), math.log10(max(seen))) if log else (min(seen), max(seen))
        span = (hi - lo) or 1.0

        def scale(v):
            return ((math.log10(v) if log else v) - lo) / span

        ticks = [lo, (lo + hi) / 2, hi] if hi > lo else [lo]
        return scale, [((t - lo) / span, f"{10**t if log else t:.3g}") for t in ticks]
    order = list(choices or dict.fromkeys(seen))
    order = [c for c in order if c in seen] or order
    step = 1.0 / max(len(order) - 1, 1)

    def place(v):
        return order.index(v) * step if len(order) > 1 else 0.5

    return place, [(place(c), str(c)) for c in order]


def parallel_coordinates_figure(
    rows: list[Mapping[str, object]],
    values: list[float],
    *,
    metric: str,
    log_params: frozenset[str] | set[str] = frozenset(),
    choices: Mapping[str, list] | None = None,
) -> Figure:
    """Parallel coordinates: one vertical axis per parameter, one line per trial, coloured by ``values``.

    ``rows`` are the trials' active parameters ({name: value}); a parameter a
    trial did not have (a conditional one whose condition was false) is left
    out of its line, which joins the axes it has, so no axis shows "None".
    Numbers are scaled to their range (log10 for ``log_params``) with the
    range's ends and middle as ticks; categories (``choices``, else the
    values seen, in order) sit evenly spaced with their names as ticks.
    """
    return family_parallel_coordinates_figure({"": (rows, values)}, metric=metric, log_params=log_params, choices=choices)


def family_parallel_coordinates(
    groups: Mapping[str, tuple[list[Mapping[str, object]], list[float]]],
    path: str | Path,
    *,
    metric: str,
    log_params: frozenset[str] | set[str] = frozenset(),
    choices: Mapping[str, list] | None = None,
) -> Path:
    """:func:`family_parallel_coordinates_figure` saved to ``path``."""
    return save(family_parallel_coordinates_figure(groups, metric=metric, log_params=log_params, choices=choices), path)


def family_parallel_coordinates_figure(
    groups: Mapping[str, tuple[list[Mapping[str, object]], list[float]]],
    *,
    metric: str,
    log_params: frozenset[str] | set[str] = frozenset(),
    choices: Mapping[str, list] | None = None,
) -> Figure:
    """:func:`parallel_coordinates_figure` of each group ({name: (rows, values)}, a loss family each) in a panel of its
    own, one above the other, on one colour scale of ``values``: each panel has only its own trials' parameters, so a
    family's axes are the few it searched. A group named "" has no panel title."""
    groups = {name: group for name, group in groups.items() if group[0]}
    finite = [v for _, values in groups.values() for v in values if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    norm, cmap = Normalize(lo, hi if hi > lo else lo + 1e-9), colormaps["viridis"]
    widest = max((len({n for row in rows for n in row}) for rows, _ in groups.values()), default=1)
    fig = Figure(figsize=(max(8.0, 1.5 * (widest + 1)), 0.6 + 4.6 * max(len(groups), 1)), layout="constrained")
    panels = fig.subplots(max(len(groups), 1), 1, squeeze=False)[:, 0]
    for ax, (name, (rows, values)) in zip(panels, groups.items()):
        _parallel_panel(ax, rows, values, norm, cmap, log_params, choices or {})
        trials = f"{len(rows)} complete trial{'s' if len(rows) != 1 else ''}"
        ax.set_title(f"{name}: {trials}" if name else f"parallel coordinates of {trials}", fontsize=11)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(panels), label=metric)
    fig.suptitle("parallel coordinates (a line skips parameters its trial did not have)", fontsize=11)
    return fig


def _parallel_panel(ax, rows, values, norm, cmap, log_params, choices) -> None:
    """One panel of parallel coordinates: an axis per parameter of ``rows``, a line per trial coloured by its value."""
    names = sorted({name for row in rows for name in row}, key=lambda n: (n in choices, n))
    axes_at = {name: i for i, name in enumerate(names)}
    position: dict[str, Callable[[object], float]] = {}
    for name in names:
        seen = [row[name] for row in rows if name in row]
        position[name], ticks = axis_scale(seen, log=name in log_params, choices=choices.get(name))
        x = axes_at[name]
        ax.axvline(x, color="black", linewidth=0.8)
        for t, label in ticks:
            ax.text(x + 0.03, t, label, fontsize=9, va="center", ha="left", bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0})
    for row, value in sorted(zip(rows, values), key=lambda rv: rv[1] if math.isfinite(rv[1]) else -math.inf):
        active = [n for n in names if n in row]
        ax.plot(
            [axes_at[n] for n in active],
            [position[n](row[n]) for n in active],
            color=cmap(norm(value)) if math.isfinite(value) else "lightgray",
            alpha=0.8,
            linewidth=1.4,
            marker="o",
            markersize=3,
        )
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=10)
    ax.set_xlim(-0.3, len(names) - 0.4)
    ax.set_ylim(-0.08, 1.08)
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def importances(groups: Mapping[str, Mapping[str, float] | str], path: str | Path, *, metric: str) -> Path:
    """:func:`importances_figure` saved to ``path``."""
    return save(importances_figure(groups, metric=metric), path)


def importances_figure(groups: Mapping[str, Mapping[str, float] | str], *, metric: str) -> Figure:
    """Parameter importances as horizontal bars, one panel per group ({name: {parameter: importance}}, a loss family
    each), the most important on top, each bar's value written beside it; a group whose value is a str says why it
    has none."""
    heights = [1.0 + 0.35 * (1 if isinstance(v, str) else len(v)) for v in groups.values()] or [1.0]
    fig = Figure(figsize=(8, 0.8 + sum(heights)))
    panels = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (name, values) in zip(panels, groups.items()):
        ax.set_title(name, fontsize=11, loc="left")
        if isinstance(values, str):
            ax.axis("off")
            ax.text(0.0, 0.5, values, fontsize=10, va="center", wrap=True)
            continue
        order = sorted(values, key=values.get)
        ax.barh(range(len(order)), [values[k] for k in order], color="tab:blue")
        ax.set_yticks(range(len(order)), order, fontsize=10)
        for i, k in enumerate(order):
            ax.text(values[k], i, f" {values[k]:.2f}", va="center", fontsize=9)
        ax.set_xlim(0, max(1.0, max(values.values(), default=0) * 1.15))
    panels[-1].set_xlabel(f"importance for {metric} (fANOVA, sums to 1 within a panel)")
    fig.tight_layout()
    return fig


def retrieval_examples(
    embeddings: np.ndarray,
    labels: np.ndarray,
    *,
    queries: int = 8,
    k: int = 8,
    seed: int = 0,
    gallery_embeddings: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Query indices (Q,) of ``queries`` different classes (seeded) and their ``k`` nearest neighbours (Q, k) by cosine similarity.

    Neighbours are indices into ``embeddings`` without the query itself, or into
    ``gallery_embeddings`` when given. Ties are broken by the lower index.
    """
    x = unit_rows(np.asarray(embeddings, dtype=np.float64))
    g = unit_rows(x if gallery_embeddings is None else np.asarray(gallery_embeddings, dtype=np.float64))
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes = rng.permutation(np.unique(labels))[:queries]
    picked = np.array([rng.choice(np.flatnonzero(labels == c)) for c in classes], dtype=int)
    similarity = x[picked] @ g.T
    if gallery_embeddings is None:
        similarity[np.arange(len(picked)), picked] = -np.inf
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    return picked, order


# the retrieval grid's cells: each image fitted into a square of CELL_PX pixels, framed by its kind's colour and width
# (the query black, a right match matplotlib's tab:green, a wrong one red and twice as thick, so that it shows without
# colour vision)
CELL_PX = 96
FRAMES = {None: ((0, 0, 0), 1), True: ((44, 160, 44), 2), False: ((255, 0, 0), 4)}
FRAME_PAD = max(width for _, width in FRAMES.values())
SLOT_GAP = 6


def slot_step(cell: int) -> int:
    """Pixels from one slot of the retrieval grid to the next: the cell, its frame's room on both sides, the gap."""
    return cell + 2 * FRAME_PAD + SLOT_GAP


def fitted(image: np.ndarray, size: int) -> np.ndarray:
    """(H, W) or (H, W, 3) uint8 -> (size, size, 3) uint8: scaled to fit (aspect kept), centred on white."""
    from PIL import Image

    rgb = np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else np.ascontiguousarray(image[..., :3])
    h, w = rgb.shape[:2]
    nh, nw = max(1, round(h * size / max(h, w))), max(1, round(w * size / max(h, w)))
    if (nh, nw) != (h, w):
        rgb = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.Resampling.BILINEAR))
    out = np.full((size, size, 3), 255, dtype=np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top : top + nh, left : left + nw] = rgb
    return out


def grid_mosaic(
    query_images: list[np.ndarray], neighbour_images: list[list[np.ndarray]], correct: np.ndarray, cell: int = CELL_PX
) -> np.ndarray:
    """The retrieval grid as one RGB image: row r is query r, then its neighbours best first, each in a slot of
    ``cell + 2 * FRAME_PAD`` pixels (SLOT_GAP apart) holding the image fitted into ``cell`` x ``cell`` and its frame
    (FRAMES: the query, a right match, a wrong one). A row with fewer neighbours leaves its last slots white.

    images: uint8 (H, W) or (H, W, 3); ``correct`` (Q, k) bool -> (Q * step - SLOT_GAP, (k + 1) * step - SLOT_GAP, 3)
    uint8, step = :func:`slot_step` (cell).
    """
    rows, k = len(query_images), max((len(n) for n in neighbour_images), default=0)
    step = slot_step(cell)
    mosaic = np.full((max(rows * step - SLOT_GAP, 1), (k + 1) * step - SLOT_GAP, 3), 255, dtype=np.uint8)
    for r in range(rows):
        cells = [(query_images[r], None)] + [(img, bool(correct[r, j])) for j, img in enumerate(neighbour_images[r])]
        for c, (image, right) in enumerate(cells):
            colour, width = FRAMES[right]
            top, left = r * step + FRAME_PAD, c * step + FRAME_PAD
            mosaic[top - width : top + cell + width, left - width : left + cell + width] = colour
            mosaic[top : top + cell, left : left + cell] = fitted(image, cell)
    return mosaic


def retrieval_grid(
    query_images: list[np.ndarray],
    neighbour_images: list[list[np.ndarray]],
    correct: np.ndarray,
    path: str | Path,
    *,
    title: str = "",
) -> Path:
    """One row per query: the query image, then its neighbours best first; wrong matches outlined in red, right ones in green.

    images: uint8 (H, W) or (H, W, 3); ``correct`` (Q, k) bool: the neighbour has the query's class. The cells are
    drawn as one image (:func:`grid_mosaic`): a figure of (k + 1) x Q axes took seconds of a final seed's CPU.
    """
    rows, k = len(query_images), max((len(n) for n in neighbour_images), default=0)
    fig = Figure(figsize=(1.25 * (k + 1) + 0.4, 1.3 * rows + 0.6))
    ax = fig.subplots()
    ax.imshow(grid_mosaic(query_images, neighbour_images, correct), interpolation="nearest")
    ax.set_axis_off()
    step = slot_step(CELL_PX)
    for c in range(k + 1 if rows else 0):
        ax.text(c * step + step / 2 - SLOT_GAP / 2, -4, "query" if c == 0 else f"#{c}", ha="center", va="bottom", fontsize=9)
    fig.suptitle(title or "retrieval on the test classes: query, then its nearest neighbours (wrong class outlined in red)", fontsize=10)
    fig.tight_layout()
    return save(fig, path, dpi=90)


def tsne_map(embeddings: np.ndarray, labels: np.ndarray, path: str | Path, *, classes: int = 20, seed: int = 0, title: str = "") -> Path:
    """A 2-D t-SNE map (scikit-learn, cosine distance) of the embeddings of ``classes`` classes (seeded), coloured by class."""
    from sklearn.manifold import TSNE

    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.permutation(np.unique(labels))[:classes])
    keep = np.isin(labels, chosen)
    x = np.asarray(embeddings, dtype=np.float32)[keep]
    perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3)))
    points = TSNE(2, metric="cosine", init="pca", perplexity=perplexity, random_state=seed).fit_transform(x)
    fig = Figure(figsize=(7, 6.5))
    ax = fig.subplots()
    cmap = colormaps["tab20"]
    for i, c in enumerate(chosen):
        members = labels[keep] == c
        ax.scatter(points[members, 0], points[members, 1], s=12, color=cmap(i % 20), alpha=0.85, linewidths=0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title or f"t-SNE of test embeddings: {len(chosen)} classes, {len(x)} images, one colour per class", fontsize=10)
    fig.tight_layout()
    return save(fig, path)

"""Retrieval and clustering metrics for embeddings: Recall@K, MAP@R, R-precision, NMI.

Everything here works on plain arrays (numpy or torch) and uses faiss for the
nearest-neighbour search and k-means; it never imports ray, optuna or mlflow. The NMI of a
clustering is computed here from its contingency table (:func:`normalized_mutual_info`), not
with scikit-learn: ``sklearn.metrics`` (and the scipy it loads) made every new trial worker
slower to start (docs/performance.md, measurements behind the code), for a sum over a table
that numpy does in microseconds.

Embeddings are l2-normalized inside every public function, so cosine similarity
is the inner product and the search is an exact ``faiss.IndexFlatIP``.

Two evaluation modes:

* **self-retrieval** (CUB-200, Cars-196, SOP, Omniglot): every item queries all
  other items of the same set; the query itself is excluded from its neighbours.
* **query/gallery** (In-shop): ``embeddings`` are the queries and
  ``gallery_embeddings`` the items searched; nothing is excluded.

Metrics (as in Musgrave et al., "A Metric Learning Reality Check", 2020, and
pytorch-metric-learning's ``AccuracyCalculator``):

* ``recall_at_{K}``: fraction of queries with at least one same-label item among
  their K nearest neighbours (the retrieval "Recall@K" of the DML literature; for
  K = 1 it equals precision@1).
* ``r_precision``: for a query whose label has R relevant items available
  (self mode: class size - 1; query/gallery mode: gallery items of that label),
  the fraction of same-label items among its R nearest neighbours.
* ``map_at_r``: ``(1/R) * sum_{i=1..R} P(i) * rel(i)``, where ``P(i)`` is the
  precision among the i nearest neighbours and ``rel(i)`` is 1 when the i-th
  neighbour has the query's label.
* ``nmi``: normalized mutual information (arithmetic mean normalization) between
  the labels and the assignments of a faiss k-means with one centroid per label,
  averaged over several seeds.

Queries with R = 0 (a singleton class in self mode, or a query label absent from
the gallery) are excluded from *all* retrieval metrics, as in
pytorch-metric-learning (its "lone query labels"). When every query is such a
query the retrieval metrics are undefined: they are NaN and a warning is logged
(pytorch-metric-learning 2.x also returns NaN then).

Memory: the neighbour search processes ``chunk_size`` queries at a time and keeps
only ``k`` neighbours per query, so it grows with ``N x k``, never ``N x N``
(``retrieval_metrics`` reduces each chunk to per-query values at once and holds
``chunk_size x k``). The k-means++ seeding of ``nmi`` holds O(N) values plus fixed-size
blocks, never ``N x k``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import faiss
import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["knn", "retrieval_metrics", "nmi", "normalized_mutual_info", "evaluate_embeddings"]

ArrayLike = Any  # numpy array, torch tensor, or anything np.asarray accepts

_SEEDING_BATCH = 1024  # k-means++ proposals drawn per round (see _kmeans_plus_plus)


# -- input conversion ----------------------------------------------------------------------


def _as_float_matrix(x: ArrayLike, name: str) -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 array of shape (N, D), N >= 1, D >= 1, finite."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float32).numpy()
    arr = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (N, D), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape}); need at least one row")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has zero dimensions (shape {arr.shape})")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _as_labels(y: ArrayLike, name: str, n: int, embeddings_name: str) -> np.ndarray:
    """Return ``y`` as an int64 array of shape (n,)."""
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array (N,), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but {embeddings_name} has {n} rows; they must match")
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _l2_normalize(x: np.ndarray, chunk_rows: int = 4096) -> np.ndarray:
    """Rows of ``x`` (N, D) divided by ``max(||row||, 1e-12)``; float32, C-contiguous.

    Norms and quotients are computed in float64, ``chunk_rows`` rows at a time, so the float64
    temporaries stay at ``chunk_rows x D`` whatever N is.
    """
    out = np.empty(x.shape, dtype=np.float32)
    for start in range(0, x.shape[0], chunk_rows):
        block = x[start : start + chunk_rows].astype(np.float64)
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        out[start : start + chunk_rows] = block / np.maximum(norms, 1e-12)
    return out


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks:
        raise ValueError("ks must name at least one K for Recall@K")
    return tuple(_check_positive_int(k, f"every K in ks (ks={ks!r})") for k in ks)


# -- nearest neighbours ----------------------------------------------------------------------


def _search_chunks(
    queries: np.ndarray,
    index: faiss.Index,
    k: int,
    self_ids: np.ndarray | None,
    chunk_size: int,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """k nearest gallery items of each query, searched ``chunk_size`` queries at a time.

    queries: (Nq, D) float32 C-contiguous; index: a faiss index over the gallery (Ng rows);
    self_ids: None, or (Nq,) int64 gallery row of each query, to be excluded from its result.
    Yields (start, stop, similarities (stop - start, k) float32, indices (stop - start, k) int64)
    for the queries ``start:stop``, in order.
    """
    nq = queries.shape[0]
    k_search = k + 1 if self_ids is not None else k
    for start in range(0, nq, chunk_size):
        stop = min(start + chunk_size, nq)
        s, i = index.search(queries[start:stop], k_search)
        if self_ids is not None:
            drop = i == self_ids[start:stop, None]
            # Exact ties can push the query itself out of the k + 1 results; then every
            # result is another item and the last one goes.
            missing = ~drop.any(axis=1)
            drop[missing, -1] = True
            # A row can hold its own id at most once, so exactly one True per row.
            keep = ~drop
            s = s[keep].reshape(stop - start, k)
            i = i[keep].reshape(stop - start, k)
        yield start, stop, s, i


def _search(
    queries: np.ndarray,
    index: faiss.Index,
    k: int,
    self_ids: np.ndarray | None,
    chunk_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """All of :func:`_search_chunks` in two arrays: (similarities (Nq, k) float32, indices (Nq, k) int64)."""
    nq = queries.shape[0]
    sims = np.empty((nq, k), dtype=np.float32)
    ids = np.empty((nq, k), dtype=np.int64)
    for start, stop, s, i in _search_chunks(queries, index, k, self_ids, chunk_size):
        sims[start:stop] = s
        ids[start:stop] = i
    return sims, ids


def knn(
    queries: np.ndarray,
    gallery: np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    chunk_size: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product k nearest neighbours with faiss (``IndexFlatIP``).

    Args:
        queries: (Nq, D) float array (numpy or torch); used as given (not normalized).
        gallery: (Ng, D) float array searched for each query.
        k: neighbours per query, 1 <= k <= Ng (Ng - 1 with ``exclude_self``).
        exclude_self: ``queries`` is ``gallery`` in the same row order, and each query's own
            row is removed from its neighbours. k + 1 neighbours are searched and the position
            holding the query's own index is dropped; when exact ties keep the query out of
            the k + 1 results, the last column is dropped instead.
        chunk_size: queries searched per faiss call; memory is O(Nq * k), never O(Nq * Ng).

    Returns:
        (similarities (Nq, k) float32, indices (Nq, k) int64 rows of ``gallery``), each row
        sorted by decreasing similarity.
    """
    q = _as_float_matrix(queries, "queries")
    g = _as_float_matrix(gallery, "gallery")
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"queries have dimension {q.shape[1]} but gallery has dimension {g.shape[1]}")
    k = _check_positive_int(k, "k")
    chunk_size = _check_positive_int(chunk_size, "chunk_size")
    self_ids = None
    available = g.shape[0]
    if exclude_self:
        if q.shape[0] != g.shape[0]:
            raise ValueError(
                "exclude_self needs queries and gallery to be the same set in the same order, "
                f"got {q.shape[0]} queries and {g.shape[0]} gallery rows"
            )
        self_ids = np.arange(q.shape[0], dtype=np.int64)
        available -= 1
    if k > available:
        raise ValueError(
            f"k={k} exceeds the {available} gallery items available per query"
            + (" (gallery size minus the query itself)" if exclude_self else "")
        )
    index = faiss.IndexFlatIP(g.shape[1])
    index.add(g)
    return _search(q, index, k, self_ids, chunk_size)


# -- retrieval metrics -----------------------------------------------------------------------


def retrieval_metrics(
    embeddings: ArrayLike,
    labels: ArrayLike,
    ks: Sequence[int] = (1, 2, 4, 8),
    *,
    gallery_embeddings: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    chunk_size: int = 4096,
) -> dict[str, float]:
    """Recall@K for each K in ``ks``, MAP@R and R-precision of cosine-similarity retrieval.

    Args:
        embeddings: (N, D) float (numpy or torch); l2-normalized here. The queries, and in
            self-retrieval mode (no gallery) also the items searched, each query's own row
            excluded.
        labels: (N,) integer class labels of ``embeddings``.
        ks: the K of each Recall@K.
        gallery_embeddings: (Ng, D) float, or None for self-retrieval. When given, queries
            search this gallery and nothing is excluded (In-shop protocol).
        gallery_labels: (Ng,) integer labels of the gallery; given exactly when the gallery is.
        chunk_size: queries per faiss search call.

    Returns:
        ``{"recall_at_{K}": ..., "map_at_r": ..., "r_precision": ...}`` as Python floats in
        [0, 1]. R is the number of relevant items available to a query (self mode: its class
        size - 1; query/gallery mode: gallery items of its label). Queries with R = 0 are left
        out of every metric, as in pytorch-metric-learning; if no query has R > 0 every metric
        is NaN (undefined) and a warning is logged.

    One neighbour search with k = max(max(ks), max R) (capped at the gallery size, minus the
    query itself in self mode), ``chunk_size`` queries at a time; each chunk's neighbours are
    turned into per-query values before the next chunk is searched, so memory grows with
    chunk_size x k plus O(N), never N x N.
    """
    ks = _check_ks(ks)
    chunk_size = _check_positive_int(chunk_size, "chunk_size")
    q = _l2_normalize(_as_float_matrix(embeddings, "embeddings"))
    q_labels = _as_labels(labels, "labels", q.shape[0], "embeddings")

    self_mode = gallery_embeddings is None
    if self_mode != (gallery_labels is None):
        raise ValueError("gallery_embeddings and gallery_labels must be given together")
    if self_mode:
        g, g_labels = q, q_labels
    else:
        g = _l2_normalize(_as_float_matrix(gallery_embeddings, "gallery_embeddings"))
        g_labels = _as_labels(gallery_labels, "gallery_labels", g.shape[0], "gallery_embeddings")
        if g.shape[1] != q.shape[1]:
            raise ValueError(f"embeddings have dimension {q.shape[1]} but gallery_embeddings have dimension {g.shape[1]}")

    # R per query: gallery items sharing its label (minus itself in self mode).
    uniq, counts = np.unique(g_labels, return_counts=True)
    pos = np.clip(np.searchsorted(uniq, q_labels), 0, len(uniq) - 1)
    r = np.where(uniq[pos] == q_labels, counts[pos], 0).astype(np.int64)
    if self_mode:
        r -= 1
    valid = np.flatnonzero(r > 0)

    names = [f"recall_at_{k}" for k in ks] + ["map_at_r", "r_precision"]
    if valid.size == 0:
        logger.warning("no query has another item of its label to retrieve; retrieval metrics are NaN")
        return {name: float("nan") for name in names}

    available = g.shape[0] - (1 if self_mode else 0)
    r_valid = r[valid]
    k = min(max(max(ks), int(r_valid.max())), available)

    index = faiss.IndexFlatIP(g.shape[1])
    index.add(g)
    queries = q if valid.size == q.shape[0] else np.ascontiguousarray(q[valid])
    q_labels_valid = q_labels[valid]
    # Per-query values, filled chunk by chunk; only (chunk_size, k) arrays are ever held.
    hit = {kk: np.empty(valid.size, dtype=bool) for kk in ks}
    r_precision = np.empty(valid.size, dtype=np.float64)
    average_precision = np.empty(valid.size, dtype=np.float64)
    ranks = np.arange(1, k + 1, dtype=np.float64)
    for start, stop, _, nn in _search_chunks(queries, index, k, valid if self_mode else None, chunk_size):
        rel = g_labels[nn] == q_labels_valid[start:stop, None]  # (n, k) bool
        for kk in ks:
            hit[kk][start:stop] = rel[:, : min(kk, k)].any(axis=1)
        # r <= k always: R never exceeds the available gallery items.
        r_chunk = r_valid[start:stop]
        cum = np.cumsum(rel, axis=1, dtype=np.int64)  # (n, k) hits among the first i
        r_precision[start:stop] = cum[np.arange(stop - start), r_chunk - 1] / r_chunk
        within_r = ranks[None, :] <= r_chunk[:, None]
        precision_at_hits = np.where(rel & within_r, cum / ranks[None, :], 0.0)
        average_precision[start:stop] = precision_at_hits.sum(axis=1) / r_chunk

    out = {f"recall_at_{kk}": float(hit[kk].mean()) for kk in ks}
    out["map_at_r"] = float(average_precision.mean())
    out["r_precision"] = float(r_precision.mean())
    return {name: out[name] for name in names}


# -- clustering ------------------------------------------------------------------------------


def nmi(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    n_runs: int = 1,
    seed: int = 0,
    niter: int = 20,
) -> float:
    """NMI between ``labels`` and faiss k-means clusters of the l2-normalized embeddings.

    Args:
        embeddings: (N, D) float (numpy or torch).
        labels: (N,) integer labels; k-means uses one centroid per distinct label.
        n_runs: k-means runs with seeds ``seed, seed + 1, ...``; their NMIs are averaged.
        seed: seed of the first run.
        niter: k-means iterations per run.

    Returns:
        Mean :func:`normalized_mutual_info` of the labels and the clusters over the runs
        (scikit-learn's ``normalized_mutual_info_score(labels, clusters)``), a float in [0, 1].

    Each run seeds faiss's Lloyd iterations with k-means++ centroids (drawn with
    ``numpy.random.default_rng(run_seed)``, in batched rounds: see :func:`_kmeans_plus_plus`)
    instead of faiss's default of k random points: with random points several centroids often
    start in one class and none in another, and the NMI of perfectly separated classes then
    often stays well below 1 (docs/performance.md, measurements behind the code). The seeding
    costs about one Lloyd iteration (N x k x D).
    """
    x = _l2_normalize(_as_float_matrix(embeddings, "embeddings"))
    y = _as_labels(labels, "labels", x.shape[0], "embeddings")
    n_runs = _check_positive_int(n_runs, "n_runs")
    niter = _check_positive_int(niter, "niter")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    n, d = x.shape
    n_clusters = int(np.unique(y).size)
    # Train on every point: no subsampling above max_points_per_centroid * k, and no
    # "please provide at least 39*k points" warning below min_points_per_centroid * k.
    max_per_centroid = -(-n // n_clusters) + 1
    scores = []
    for run in range(n_runs):
        run_seed = int(seed) + run
        kmeans = faiss.Kmeans(
            d,
            n_clusters,
            niter=niter,
            seed=run_seed,
            verbose=False,
            min_points_per_centroid=1,
            max_points_per_centroid=max_per_centroid,
        )
        init = _kmeans_plus_plus(x, n_clusters, np.random.default_rng(run_seed))
        kmeans.train(x, init_centroids=init)
        _, assignment = kmeans.index.search(x, 1)
        scores.append(normalized_mutual_info(y, assignment.ravel()))
    return float(np.mean(scores))


def normalized_mutual_info(labels: np.ndarray, clusters: np.ndarray) -> float:
    """NMI of two labelings of the same N items, arithmetic-mean normalization: I(U; V) / ((H(U) + H(V)) / 2).

    labels, clusters: (N,) integer arrays. With the contingency table n_ij (items with label i
    in cluster j), a_i and b_j its row and column sums: I(U; V) = sum_ij (n_ij / N) log(N n_ij /
    (a_i b_j)), H(U) = -sum_i (a_i / N) log(a_i / N), H(V) likewise with b_j (the NMI_sum of
    Vinh, Epps & Bailey, "Information Theoretic Measures for Clusterings Comparison", JMLR 2010).
    Two labelings of one group each are a perfect match (1); otherwise no shared information is 0
    (scikit-learn's ``normalized_mutual_info_score`` with ``average_method="arithmetic"``, its
    default, defines both limits alike).
    """
    _, u = np.unique(labels, return_inverse=True)
    _, v = np.unique(clusters, return_inverse=True)
    rows, cols = int(u.max()) + 1, int(v.max()) + 1
    if rows == cols == 1:
        return 1.0
    joint = np.bincount(u.ravel() * cols + v.ravel(), minlength=rows * cols).reshape(rows, cols) / u.size  # (rows, cols)
    pu, pv = joint.sum(axis=1), joint.sum(axis=0)
    nz = joint > 0
    mi = max(float(np.sum(joint[nz] * np.log(joint[nz] / np.outer(pu, pv)[nz]))), 0.0)
    if mi == 0.0:
        return 0.0
    return mi / max((_entropy(pu) + _entropy(pv)) / 2, np.finfo(np.float64).eps)


def _entropy(p: np.ndarray) -> float:
    """-sum p log p of a distribution (K,) with every p > 0."""
    return -float(np.sum(p * np.log(p)))


def _kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator, batch: int = _SEEDING_BATCH) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii, 2007, Sec. 2.2), drawn in batched rounds.

    x: (N, D) float32 with k <= N. Returns (k, D) float32 centroids, k distinct rows of ``x``.

    k-means++ takes the first centroid uniformly at random and each next one with probability
    ``D(x)^2 / sum_x' D(x')^2``, D(x) being the distance from x to the nearest centroid taken
    so far. One centroid at a time that is k passes over the data. Here the centroids are
    drawn in rounds: a round draws up to ``batch`` proposals independently with the
    probabilities at its start and goes through them in order, accepting proposal p with
    probability ``D'(p)^2 / D(p)^2``, where D' also counts the centroids accepted earlier in the
    round (the proposals' distances to each other come from one small matrix product). That
    is rejection sampling from the updated distribution, so each accepted point is distributed
    exactly as the next k-means++ centroid; a proposal next to a centroid accepted in the same
    round (another point of a class just covered) is almost always rejected. After a round,
    the distances of all N points to its new centroids are folded in with one chunked matrix
    product.

    Over all rounds these products cost N x k x D multiply-adds, as much as one Lloyd iteration,
    plus at most ``batch x D`` per accepted centroid for the proposals; memory is O(N + batch^2).
    When every point coincides with a centroid (duplicates), the remaining centroids are drawn
    uniformly from the points not taken yet.
    """
    n = x.shape[0]
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(n)
    n_chosen = 1
    sq_norms = np.einsum("ij,ij->i", x, x, dtype=np.float64)
    closest = _sq_dist_to_nearest(x, sq_norms, x[chosen[:1]])  # (N,) D(x)^2
    closest[chosen[0]] = 0.0
    while n_chosen < k:
        need = k - n_chosen
        cum = np.cumsum(closest)
        potential = cum[-1]
        if not potential > 0:
            rest = np.setdiff1d(np.arange(n), chosen[:n_chosen], assume_unique=True)
            chosen[n_chosen:] = rng.choice(rest, size=need, replace=False)
            break
        m = min(batch, 2 * need)
        proposals = np.minimum(np.searchsorted(cum, rng.random(m) * potential, side="right"), n - 1)
        before = closest[proposals]  # D(p)^2 at the start of the round
        # Accept proposal j when u_j * D(p_j)^2 < D'(p_j)^2, u_j uniform on [0, 1).
        thresholds = rng.random(m) * before
        p = x[proposals]
        between = sq_norms[proposals, None] + sq_norms[None, proposals] - 2.0 * (p @ p.T)  # (m, m)
        current = before.copy()
        accepted = []
        for j in range(m):
            if thresholds[j] < current[j]:
                accepted.append(j)
                if len(accepted) == need:
                    break
                np.minimum(current, between[j], out=current)
                current[proposals == proposals[j]] = 0.0
        new = proposals[accepted]
        chosen[n_chosen : n_chosen + new.size] = new
        n_chosen += new.size
        np.minimum(closest, _sq_dist_to_nearest(x, sq_norms, x[new]), out=closest)
        closest[new] = 0.0
    return x[chosen]


def _sq_dist_to_nearest(x: np.ndarray, sq_norms: np.ndarray, centroids: np.ndarray, chunk_rows: int = 4096) -> np.ndarray:
    """(N,) float64 squared l2 distance from each row of ``x`` to its nearest row of ``centroids``.

    ``||x||^2 + min_c (||c||^2 - 2 x.c)``, clipped at 0; sq_norms: (N,) float64 ``||x||^2``. The
    products are float32 blocks of ``chunk_rows x len(centroids)``.
    """
    c_sq = np.einsum("ij,ij->i", centroids, centroids, dtype=np.float64).astype(np.float32)
    out = np.empty(x.shape[0], dtype=np.float64)
    for start in range(0, x.shape[0], chunk_rows):
        block = x[start : start + chunk_rows] @ centroids.T  # (rows, m) float32
        block *= -2.0
        block += c_sq
        out[start : start + chunk_rows] = block.min(axis=1)
    out += sq_norms
    return np.maximum(out, 0.0, out=out)


# -- everything ------------------------------------------------------------------------------


def evaluate_embeddings(
    embeddings: ArrayLike,
    labels: ArrayLike,
    ks: Sequence[int] = (1, 2, 4, 8),
    *,
    gallery_embeddings: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    nmi_runs: int = 1,
    seed: int = 0,
    chunk_size: int = 4096,
) -> dict[str, float]:
    """:func:`retrieval_metrics` plus ``"nmi"`` (see :func:`nmi`); keys carry no split prefix.

    Args are those of :func:`retrieval_metrics`; ``nmi_runs`` and ``seed`` go to :func:`nmi`.
    In query/gallery mode NMI is computed on the queries and the gallery together
    ((N + Ng, D) embeddings, (N + Ng,) labels).
    """
    out = retrieval_metrics(
        embeddings,
        labels,
        ks,
        gallery_embeddings=gallery_embeddings,
        gallery_labels=gallery_labels,
        chunk_size=chunk_size,
    )
    if gallery_embeddings is None:
        x, y = embeddings, labels
    else:
        # Inputs were validated by retrieval_metrics; convert them to stack them.
        q = _as_float_matrix(embeddings, "embeddings")
        g = _as_float_matrix(gallery_embeddings, "gallery_embeddings")
        x = np.concatenate([q, g])
        y = np.concatenate(
            [
                _as_labels(labels, "labels", q.shape[0], "embeddings"),
                _as_labels(gallery_labels, "gallery_labels", g.shape[0], "gallery_embeddings"),
            ]
        )
    out["nmi"] = nmi(x, y, n_runs=nmi_runs, seed=seed)
    return out


def one_shot_error(
    embeddings: ArrayLike,
    labels: ArrayLike,
    groups: dict[int, Any] | None = None,
    *,
    ways: int = 20,
    episodes: int = 400,
    seed: int = 0,
) -> float:
    """Error of N-way one-shot classification by the nearest support embedding (cosine similarity).

    embeddings (N, D), labels (N,). Each seeded episode (Lake et al., Science 2015: 20-way
    one-shot on Omniglot) draws ``ways`` classes, within one group when ``groups`` maps every
    class to one (Omniglot's alphabets; groups with fewer than ``ways`` classes are never drawn),
    else from all classes; then two images of each class, a support and a query. Every query is
    classified by its most similar support. Returns the share of misclassified queries over all
    episodes (``ways x episodes`` queries). Raises ValueError when no group can fill an episode.
    """
    x = _l2_normalize(_as_float_matrix(embeddings, "embeddings"))
    y = _as_labels(labels, "labels", len(x), "embeddings")
    ways, episodes = _check_positive_int(ways, "ways"), _check_positive_int(episodes, "episodes")
    members = {int(c): np.flatnonzero(y == c) for c in np.unique(y)}
    usable = [c for c, idx in members.items() if len(idx) >= 2]
    by_group: dict[Any, list[int]] = {}
    for c in usable:
        by_group.setdefault(groups.get(c) if groups else None, []).append(c)
    pools = [sorted(classes) for _, classes in sorted(by_group.items(), key=lambda kv: str(kv[0])) if len(classes) >= ways]
    if not pools:
        raise ValueError(f"one-shot: no group has {ways} classes with 2 or more images; expected ways <= the classes of a group")
    rng = np.random.default_rng(seed)
    wrong = 0
    for _ in range(episodes):
        pool = pools[rng.integers(len(pools))]
        classes = rng.choice(pool, size=ways, replace=False)
        pairs = np.stack([rng.choice(members[int(c)], size=2, replace=False) for c in classes])  # (ways, 2): support, query
        similarity = x[pairs[:, 1]] @ x[pairs[:, 0]].T  # (queries, supports)
        wrong += int(np.sum(np.argmax(similarity, axis=1) != np.arange(ways)))
    return wrong / (ways * episodes)

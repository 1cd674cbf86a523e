"""Tests of trainables.core.metrics against hand-computed values and independent references.

References: numbers worked out by hand, pytorch-metric-learning's AccuracyCalculator, and a
brute-force numpy implementation (full N x N similarity matrix, argsort, Python loops).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from sklearn.metrics import normalized_mutual_info_score

from trainables.core.metrics import _kmeans_plus_plus, evaluate_embeddings, knn, nmi, normalized_mutual_info, retrieval_metrics

KS = (1, 2, 4, 8)


# -- data ------------------------------------------------------------------------------------


def clustered(n: int, d: int, n_classes: int, seed: int, noise: float = 1.0):
    """Gaussian classes of unequal sizes around random unit centres; one singleton class."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    sizes = rng.multinomial(n - n_classes - 1, np.ones(n_classes) / n_classes) + 1
    labels = np.repeat(np.arange(n_classes), sizes)
    labels = np.concatenate([labels, [n_classes]])  # a singleton class
    centres = np.vstack([centres, rng.normal(size=(1, d))])
    x = centres[labels] + noise * rng.normal(size=(len(labels), d)) / math.sqrt(d)
    x *= rng.uniform(0.5, 2.0, size=(len(labels), 1))  # norms must not matter
    perm = rng.permutation(len(labels))
    return x[perm].astype(np.float32), labels[perm]


def angles_to_points(degrees, radii=None) -> np.ndarray:
    rad = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    pts = np.stack([np.cos(rad), np.sin(rad)], axis=1)
    if radii is not None:
        pts *= np.asarray(radii, dtype=np.float64)[:, None]
    return pts.astype(np.float32)


# -- brute-force reference -------------------------------------------------------------------


def brute_force(q, q_labels, g=None, g_labels=None, ks=KS):
    """Every metric from the full similarity matrix with Python loops (float64)."""
    self_mode = g is None
    qn = q.astype(np.float64)
    qn /= np.linalg.norm(qn, axis=1, keepdims=True)
    if self_mode:
        gn, g_labels = qn, q_labels
    else:
        gn = g.astype(np.float64)
        gn /= np.linalg.norm(gn, axis=1, keepdims=True)
    sim = qn @ gn.T
    recall = {k: [] for k in ks}
    rprec, mapr = [], []
    for i in range(len(qn)):
        order = np.argsort(-sim[i], kind="stable")
        if self_mode:
            order = order[order != i]
        rel = [int(g_labels[j] == q_labels[i]) for j in order]
        r = sum(rel)
        if r == 0:
            continue
        for k in ks:
            recall[k].append(1.0 if any(rel[:k]) else 0.0)
        rprec.append(sum(rel[:r]) / r)
        hits, ap = 0, 0.0
        for pos in range(r):
            if rel[pos]:
                hits += 1
                ap += hits / (pos + 1)
        mapr.append(ap / r)
    out = {f"recall_at_{k}": float(np.mean(recall[k])) for k in ks}
    out["map_at_r"] = float(np.mean(mapr))
    out["r_precision"] = float(np.mean(rprec))
    return out


# -- 1. hand-computed ------------------------------------------------------------------------


def test_hand_computed_self_retrieval():
    # Six points on the unit circle (radii differ: normalization must undo them).
    #   p0   0 deg A | p1  20 deg B | p2  45 deg A | p3 100 deg B | p4 345 deg A | p5 265 deg C
    # Cosine order = angular-distance order. Neighbours of each query (angle, label):
    #   p0 (A, R=2): p4 15 A, p1 20 B, p2 45 A, p5 95 C, p3 100 B  rel 1 0 1 0 0
    #   p1 (B, R=1): p0 20 A, p2 25 A, p4 35 A, p3 80 B, p5 115 C  rel 0 0 0 1 0
    #   p2 (A, R=2): p1 25 B, p0 45 A, p3 55 B, p4 60 A, p5 140 C  rel 0 1 0 1 0
    #   p3 (B, R=1): p2 55 A, p1 80 B, p0 100 A, p4 115 A, p5 165 C rel 0 1 0 0 0
    #   p4 (A, R=2): p0 15 A, p1 35 B, p2 60 A, p5 80 C, p3 115 B  rel 1 0 1 0 0
    #   p5 (C): singleton, R=0 -> left out of every metric (5 queries remain).
    # Recall@1: 1 0 0 0 1 -> 2/5;  Recall@2: 1 0 1 1 1 -> 4/5;  Recall@4 and @8: all -> 1.
    # R-precision (hits among the R nearest / R): 1/2, 0, 1/2, 0, 1/2 -> 1.5/5 = 0.3
    # MAP@R = (1/R) sum_{i<=R} P(i) rel(i):
    #   p0: (1/2)(1/1)=1/2; p1: 0; p2: (1/2)(1/2)=1/4; p3: 0; p4: 1/2  -> 1.25/5 = 0.25
    x = angles_to_points([0, 20, 45, 100, 345, 265], radii=[1, 2, 0.5, 3, 1.5, 0.7])
    y = np.array([0, 1, 0, 1, 0, 2])
    got = retrieval_metrics(x, y, ks=KS)
    expected = {
        "recall_at_1": 0.4,
        "recall_at_2": 0.8,
        "recall_at_4": 1.0,
        "recall_at_8": 1.0,
        "map_at_r": 0.25,
        "r_precision": 0.3,
    }
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key


def test_hand_computed_query_gallery():
    # Gallery: g0 10 deg B, g1 30 deg A, g2 50 deg A, g3 90 deg C.
    # q0   0 deg A (R=2): g0 B, g1 A, g2 A, g3 C -> rel 0 1 1 0
    #   R@1 0, R@2 1, R-precision 1/2, MAP@R (1/2)(0 + 1/2) = 1/4
    # q1  12 deg B (R=1): g0 B first -> R@1 1, R-precision 1, MAP@R 1
    # q2 200 deg D: no D in the gallery -> left out.
    # Means over q0, q1: R@1 0.5, R@2 1, R-precision 0.75, MAP@R 0.625.
    g = angles_to_points([10, 30, 50, 90])
    g_labels = np.array([1, 0, 0, 2])
    q = angles_to_points([0, 12, 200])
    q_labels = np.array([0, 1, 3])
    got = retrieval_metrics(q, q_labels, ks=(1, 2), gallery_embeddings=g, gallery_labels=g_labels)
    assert got == pytest.approx(
        {"recall_at_1": 0.5, "recall_at_2": 1.0, "map_at_r": 0.625, "r_precision": 0.75},
        abs=1e-12,
    )


# -- 2. pytorch-metric-learning --------------------------------------------------------------


def pml_metrics(q, q_labels, ref, ref_labels, ref_includes_query):
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        device=torch.device("cpu"),
    )

    def unit(a):  # PML's default faiss kNN ranks by L2: the same order on unit vectors
        return torch.from_numpy(a / np.linalg.norm(a, axis=1, keepdims=True))

    return calc.get_accuracy(
        unit(q),
        torch.from_numpy(q_labels),
        unit(ref),
        torch.from_numpy(ref_labels),
        ref_includes_query=ref_includes_query,
    )


def test_matches_pytorch_metric_learning_self_mode():
    x, y = clustered(300, 16, 20, seed=1)
    ours = retrieval_metrics(x, y, ks=(1,))
    pml = pml_metrics(x, y, x, y, ref_includes_query=True)
    assert ours["recall_at_1"] == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["map_at_r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-6)
    # Not trivially perfect or zero.
    assert 0.2 < ours["map_at_r"] < 0.95


def test_matches_pytorch_metric_learning_query_gallery_mode():
    x, y = clustered(400, 16, 20, seed=2)
    q, q_labels, g, g_labels = x[:150], y[:150], x[150:], y[150:]
    q_labels = q_labels.copy()
    q_labels[:3] = 99  # labels absent from the gallery: left out by both
    ours = retrieval_metrics(q, q_labels, ks=(1,), gallery_embeddings=g, gallery_labels=g_labels)
    pml = pml_metrics(q, q_labels, g, g_labels, ref_includes_query=False)
    assert ours["recall_at_1"] == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["map_at_r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-6)


# -- 3. brute force --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [3, 4])
def test_matches_brute_force_self_mode(seed):
    x, y = clustered(250, 12, 15, seed=seed)
    got = retrieval_metrics(x, y, ks=KS)
    assert got == pytest.approx(brute_force(x, y), abs=1e-9)


@pytest.mark.parametrize("seed", [5, 6])
def test_matches_brute_force_query_gallery_mode(seed):
    x, y = clustered(320, 12, 15, seed=seed)
    q, q_labels, g, g_labels = x[:120], y[:120], x[120:], y[120:]
    got = retrieval_metrics(q, q_labels, ks=KS, gallery_embeddings=g, gallery_labels=g_labels)
    assert got == pytest.approx(brute_force(q, q_labels, g, g_labels), abs=1e-9)


def test_torch_input_equals_numpy_input():
    x, y = clustered(120, 8, 6, seed=7)
    from_numpy = retrieval_metrics(x, y)
    x_torch = torch.from_numpy(x).double().requires_grad_()
    from_torch = retrieval_metrics(x_torch, torch.from_numpy(y))
    assert from_torch == from_numpy


def test_large_ks_are_capped_at_the_gallery():
    x, y = clustered(20, 4, 3, seed=8)
    got = retrieval_metrics(x, y, ks=(1, 50))
    assert got["recall_at_50"] == 1.0
    assert got == pytest.approx(brute_force(x, y, ks=(1, 50)), abs=1e-9)


# -- 4. chunking -----------------------------------------------------------------------------


def test_chunked_equals_unchunked():
    x, y = clustered(300, 16, 20, seed=9)
    q, q_labels, g, g_labels = x[:100], y[:100], x[100:], y[100:]
    assert retrieval_metrics(x, y, chunk_size=7) == retrieval_metrics(x, y, chunk_size=100000)
    small = retrieval_metrics(q, q_labels, gallery_embeddings=g, gallery_labels=g_labels, chunk_size=7)
    big = retrieval_metrics(q, q_labels, gallery_embeddings=g, gallery_labels=g_labels, chunk_size=100000)
    assert small == big
    s7, i7 = knn(x, x, 5, exclude_self=True, chunk_size=7)
    sb, ib = knn(x, x, 5, exclude_self=True, chunk_size=100000)
    np.testing.assert_array_equal(i7, ib)
    np.testing.assert_array_equal(s7, sb)


# -- knn -------------------------------------------------------------------------------------


def test_knn_matches_brute_force():
    rng = np.random.default_rng(10)
    q = rng.normal(size=(40, 8)).astype(np.float32)
    g = rng.normal(size=(60, 8)).astype(np.float32)
    sims, idx = knn(q, g, 5, exclude_self=False)
    assert sims.shape == idx.shape == (40, 5)
    assert sims.dtype == np.float32 and idx.dtype == np.int64
    full = q.astype(np.float64) @ g.astype(np.float64).T
    np.testing.assert_array_equal(idx, np.argsort(-full, axis=1)[:, :5])
    np.testing.assert_allclose(sims, np.take_along_axis(full, idx, axis=1), rtol=1e-5, atol=1e-5)

    sims, idx = knn(g, g, 5, exclude_self=True)
    full = g.astype(np.float64) @ g.astype(np.float64).T
    np.fill_diagonal(full, -np.inf)
    np.testing.assert_array_equal(idx, np.argsort(-full, axis=1)[:, :5])


# -- 5. NMI ----------------------------------------------------------------------------------


def separated(n_classes, per_class, d, seed, noise=0.01):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, d))
    labels = np.repeat(np.arange(n_classes), per_class)
    x = centres[labels] + noise * rng.normal(size=(len(labels), d))
    return x.astype(np.float32), labels


@pytest.mark.parametrize("seed", range(5))
def test_nmi_of_separated_clusters_is_one(seed):
    x, y = separated(20, 15, 32, seed)
    assert nmi(x, y, n_runs=2, seed=seed) > 0.99


def test_nmi_of_random_embeddings_is_small():
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        x = rng.normal(size=(300, 16))
        y = rng.integers(0, 20, size=300)
        # chance level for 20 clusters of ~15 points is about 0.23
        assert nmi(x, y, n_runs=1, seed=seed) < 0.4


def test_nmi_is_deterministic_for_a_seed():
    x, y = clustered(300, 16, 20, seed=11, noise=1.5)
    a = nmi(x, y, n_runs=2, seed=3)
    assert a == nmi(x, y, n_runs=2, seed=3)
    assert 0.0 < a < 1.0


def test_nmi_equals_sklearn_on_a_permuted_perfect_clustering():
    # NMI is label-permutation invariant: cluster ids never match label ids, score is 1.
    x, y = separated(4, 10, 8, seed=12)
    y = np.array([7, 3, 11, 5])[y]
    assert nmi(x, y, n_runs=1) == pytest.approx(normalized_mutual_info_score(y, y), abs=1e-12)


def test_normalized_mutual_info_by_hand():
    # labels (0 0 1 1), clusters (0 0 0 1): the table [[2, 0], [1, 1]] / 4, row sums (1/2, 1/2), column sums (3/4, 1/4)
    mi = 0.5 * math.log(0.5 / (0.5 * 0.75)) + 0.25 * math.log(0.25 / (0.5 * 0.75)) + 0.25 * math.log(0.25 / (0.5 * 0.25))
    h_labels = math.log(2)
    h_clusters = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    expected = mi / ((h_labels + h_clusters) / 2)
    assert normalized_mutual_info(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1])) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_normalized_mutual_info_equals_sklearn(seed):
    rng = np.random.default_rng(seed)
    n, k = [(10, 2), (50, 5), (200, 20), (500, 40), (7, 7), (300, 3)][seed]
    y = rng.integers(0, k, size=n) * 3 - 5  # ids neither from 0 nor consecutive
    clusters = np.where(rng.random(n) < 0.6, y, rng.integers(0, k, size=n))  # related to y, but not equal
    assert normalized_mutual_info(y, clusters) == pytest.approx(normalized_mutual_info_score(y, clusters), abs=1e-12)
    shuffled = rng.permutation(y)  # independent of y but for chance
    assert normalized_mutual_info(y, shuffled) == pytest.approx(normalized_mutual_info_score(y, shuffled), abs=1e-12)


def test_normalized_mutual_info_limits_match_sklearn():
    one, two = np.zeros(6, int), np.array([0, 1, 0, 1, 0, 1])
    cases = [(one, one + 4), (one, two), (two, one), (two, 1 - two), (np.arange(6), np.arange(6)[::-1])]
    cases.append((two, np.array([0, 0, 1, 1, 2, 2])))
    for labels, clusters in cases:
        assert normalized_mutual_info(labels, clusters) == pytest.approx(normalized_mutual_info_score(labels, clusters), abs=1e-12)
    assert normalized_mutual_info(one, one) == 1.0 and normalized_mutual_info(one, two) == 0.0


def rows_of(x: np.ndarray, centroids: np.ndarray) -> list[int]:
    """Row index in ``x`` of each centroid (centroids are rows of x; the first copy of a repeated row)."""
    first: dict[bytes, int] = {}
    for i, row in enumerate(x):
        first.setdefault(row.tobytes(), i)
    return [first[c.tobytes()] for c in centroids]


def kmeans_plus_plus_set_probabilities(x: np.ndarray, k: int) -> dict[frozenset, float]:
    """Exact probability of each set of k seeds under sequential k-means++ (Arthur & Vassilvitskii,
    2007): first seed uniform, each next one with probability D(x)^2 / sum D^2, summed over orders."""
    n = len(x)
    sq = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
    probs: Counter = Counter()
    for order in itertools.permutations(range(n), k):
        p = 1.0 / n
        for t in range(1, k):
            d2 = sq[:, list(order[:t])].min(axis=1)
            p *= d2[order[t]] / d2.sum()
        probs[frozenset(order)] += p
    return probs


@pytest.mark.parametrize("batch", [2, 1024])
def test_batched_kmeans_plus_plus_draws_as_sequential_kmeans_plus_plus(batch):
    # Two tight pairs, a far point and a point between: the rounds' rejection step must give every
    # set of seeds its sequential k-means++ probability, also when a round holds several seeds
    # (batch=1024: all proposals in one round) or seeds come over several rounds (batch=2).
    x = np.array([[0, 0], [1, 0], [10, 0], [11, 0], [5, 6], [5, 1]], dtype=np.float32)
    k, draws = 4, 4000
    expected = kmeans_plus_plus_set_probabilities(x, k)
    counts: Counter = Counter()
    for seed in range(draws):
        rows = rows_of(x, _kmeans_plus_plus(x, k, np.random.default_rng(seed), batch=batch))
        assert len(set(rows)) == k
        counts[frozenset(rows)] += 1
    assert set(counts) <= set(expected)
    for key, p in expected.items():
        # binomial standard deviation <= sqrt(0.25 / 4000) = 0.008
        assert counts[key] / draws == pytest.approx(p, abs=0.03), sorted(key)


@pytest.mark.parametrize("batch", [16, 1024])
def test_kmeans_plus_plus_seeds_one_point_in_each_separated_class(batch):
    # 300 classes of 3 copies of one of 300 orthonormal vectors: every two classes are sqrt(2)
    # apart, copies coincide. Seeds come in many rounds (batch=16) or few large ones, each round
    # accepting several. Hand check: exactly one seed in every class.
    q, _ = np.linalg.qr(np.random.default_rng(15).normal(size=(300, 300)))
    y = np.repeat(np.arange(300), 3)
    x = q[y].astype(np.float32)
    centroids = _kmeans_plus_plus(x, 300, np.random.default_rng(0), batch=batch)
    assert sorted(y[rows_of(x, centroids)]) == list(range(300))
    if batch == 16:
        assert nmi(x, y, n_runs=1) == pytest.approx(1.0, abs=1e-12)


def test_kmeans_plus_plus_with_fewer_distinct_points_than_seeds():
    # Five distinct points, each four times, eight seeds: the five come first (positive D^2),
    # the last three are drawn among the copies; seeds are distinct rows.
    rng = np.random.default_rng(16)
    base = rng.normal(size=(5, 8)).astype(np.float32)
    x = np.repeat(base, 4, axis=0)
    centroids = _kmeans_plus_plus(x, 8, np.random.default_rng(0))
    assert centroids.shape == (8, 8)
    assert {tuple(c) for c in centroids} == {tuple(b) for b in base}
    y = np.arange(20) % 8
    assert 0.0 <= nmi(x, y, n_runs=2) <= 1.0


def test_evaluate_embeddings_keys_and_gallery_nmi():
    x, y = separated(5, 12, 8, seed=13)
    out = evaluate_embeddings(x, y, ks=(1, 2))
    assert list(out) == ["recall_at_1", "recall_at_2", "map_at_r", "r_precision", "nmi"]
    assert out["recall_at_1"] == 1.0 and out["map_at_r"] == 1.0
    assert out["nmi"] == pytest.approx(1.0, abs=1e-9)
    q_idx = np.arange(len(y)) % 3 == 0
    out = evaluate_embeddings(x[q_idx], y[q_idx], ks=(1,), gallery_embeddings=x[~q_idx], gallery_labels=y[~q_idx])
    assert out["recall_at_1"] == 1.0
    assert out["nmi"] == pytest.approx(1.0, abs=1e-9)


# -- 6. ties and self exclusion --------------------------------------------------------------


def test_duplicates_never_return_the_query_itself():
    rng = np.random.default_rng(14)
    base = rng.normal(size=(3, 6)).astype(np.float32)
    # 12 identical copies of one point: far more exact ties than k + 1 = 4.
    x = np.vstack([np.repeat(base[:1], 12, axis=0), base[1:], base[1:] * 2.0])
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    sims, idx = knn(x, x, 3, exclude_self=True, chunk_size=5)
    rows = np.arange(len(x))[:, None]
    assert not (idx == rows).any()
    assert all(len(set(row)) == 3 for row in idx.tolist())
    assert (idx >= 0).all()
    np.testing.assert_allclose(sims[:12], 1.0, atol=1e-5)  # the copies find each other

    y = np.array([0] * 12 + [1, 2, 1, 2])
    got = retrieval_metrics(x, y, ks=(1,), chunk_size=5)
    assert got == {"recall_at_1": 1.0, "map_at_r": 1.0, "r_precision": 1.0}


def test_all_identical_points_in_two_classes():
    # Every point ties with every other; with the query excluded, k = N - 1 covers all.
    x = np.ones((6, 3), dtype=np.float32)
    y = np.array([0, 0, 0, 1, 1, 1])
    _, idx = knn(x, x, 5, exclude_self=True)
    for i, row in enumerate(idx.tolist()):
        assert sorted(row) == [j for j in range(6) if j != i]
    assert retrieval_metrics(x, y, ks=(5,))["recall_at_5"] == 1.0


def test_only_singletons_give_nan():
    x = np.eye(3, dtype=np.float32)
    got = retrieval_metrics(x, np.array([0, 1, 2]), ks=(1,))
    assert all(math.isnan(v) for v in got.values())


# -- 7. validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: retrieval_metrics(np.ones((5, 2)), np.zeros(4, int)), "labels has 4 entries"),
        (lambda: retrieval_metrics(np.ones((0, 2)), np.zeros(0, int)), "empty"),
        (lambda: retrieval_metrics(np.ones(5), np.zeros(5, int)), "2-D"),
        (lambda: retrieval_metrics(np.ones((5, 2)), np.zeros((5, 1), int)), "1-D"),
        (lambda: retrieval_metrics(np.ones((5, 2)), np.zeros(5)), "integers"),
        (lambda: retrieval_metrics(np.full((5, 2), np.nan), np.zeros(5, int)), "NaN"),
        (lambda: retrieval_metrics(np.ones((5, 2)), np.zeros(5, int), ks=(0,)), "ks"),
        (lambda: retrieval_metrics(np.ones((5, 2)), np.zeros(5, int), ks=()), "ks"),
        (lambda: retrieval_metrics(np.ones((5, 2)), np.zeros(5, int), chunk_size=0), "chunk"),
        (
            lambda: retrieval_metrics(np.ones((5, 2)), np.zeros(5, int), gallery_embeddings=np.ones((5, 2))),
            "together",
        ),
        (
            lambda: retrieval_metrics(
                np.ones((5, 2)),
                np.zeros(5, int),
                gallery_embeddings=np.ones((5, 3)),
                gallery_labels=np.zeros(5, int),
            ),
            "dimension",
        ),
        (lambda: knn(np.ones((5, 2)), np.ones((5, 2)), 0, exclude_self=False), "k must be"),
        (lambda: knn(np.ones((5, 2)), np.ones((5, 2)), 5, exclude_self=True), "exceeds"),
        (lambda: knn(np.ones((5, 2)), np.ones((6, 2)), 1, exclude_self=True), "same set"),
        (lambda: knn(np.ones((5, 2)), np.ones((5, 3)), 1, exclude_self=False), "dimension"),
        (lambda: nmi(np.ones((5, 2)), np.zeros(6, int)), "labels has 6 entries"),
        (lambda: nmi(np.ones((5, 2)), np.zeros(5, int), n_runs=0), "n_runs"),
    ],
)
def test_invalid_inputs_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()

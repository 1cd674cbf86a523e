"""Tests of trainables.core.losses against hand computations and independent references.

References:
- heated-up softmax (000_4178e6910e81cd2f): eq. 1 (p = softmax(alpha z)), eq. 2
  (dl/dz_m = alpha (p_m - q_m)), eq. 3 (dl/df = alpha sum_m (p_m - q_m) w_hat_m) and the
  hard/easy behaviour in alpha of sec. 3.1, computed with explicit Python loops in float64;
- pytorch-metric-learning's NormalizedSoftmaxLoss (the l2 softmax with temperature 1/alpha);
- mean-proxy regularizer ||(1/M) sum_c w_c/||w_c|| ||_2 (002_ad8188f3a39a9075, eq. 3.10) by hand;
- ICE (004_44fc264e74e143df): eqs. 3 and 5 (value, averaged over the anchors that have a
  positive and a negative) and eqs. 11-14 (per-pair gradient weights) with explicit O(N^2)
  loops over anchors, positives and negatives in Python floats.

The loss modules compute in float32 (they cast their inputs with ``.float()``), so comparisons
with the module use float32-level tolerances; ``ice_terms`` keeps the dtype of ``sim`` and is
checked in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from trainables.core.config import TrainConfig
from trainables.core.losses import LOSSES, HeatedSoftmaxLoss, ICELoss, build_loss, ice_terms, mean_proxy_norm

# float(loss) on a tensor that requires grad is fine here: values are only compared
pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")

# -- heated-up softmax: references -----------------------------------------------------------


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def on_circle(degrees: float) -> np.ndarray:
    r = math.radians(degrees)
    return np.array([math.cos(r), math.sin(r)])


def softmax_reference(f_hat: np.ndarray, w_hat: np.ndarray, label: int, alpha: float):
    """Eqs. 1-3 for one sample with explicit loops: returns (loss, p, dl/dz, dl/df)."""
    m_count, dim = w_hat.shape
    z = [sum(f_hat[d] * w_hat[m, d] for d in range(dim)) for m in range(m_count)]
    top = max(alpha * zm for zm in z)
    e = [math.exp(alpha * zm - top) for zm in z]
    total = sum(e)
    p = [em / total for em in e]
    q = [1.0 if m == label else 0.0 for m in range(m_count)]
    loss = -math.log(p[label])
    dl_dz = [alpha * (p[m] - q[m]) for m in range(m_count)]  # eq. 2
    dl_df = [sum(alpha * (p[m] - q[m]) * w_hat[m, d] for m in range(m_count)) for d in range(dim)]  # eq. 3
    return loss, np.array(p), np.array(dl_dz), np.array(dl_df)


def make_softmax(weights: np.ndarray, alpha: float, **kwargs) -> HeatedSoftmaxLoss:
    m_count, dim = weights.shape
    loss_fn = HeatedSoftmaxLoss(m_count, dim, alpha=alpha, **kwargs)
    with torch.no_grad():
        loss_fn.weight.copy_(torch.as_tensor(weights, dtype=torch.float32))
    return loss_fn


def random_problem(seed: int, batch: int = 6, classes: int = 5, dim: int = 8):
    rng = np.random.default_rng(seed)
    raw_w = rng.normal(size=(classes, dim)) * rng.uniform(0.3, 3.0, size=(classes, 1))  # norms vary
    f = rng.normal(size=(batch, dim))
    f_hat = f / np.linalg.norm(f, axis=1, keepdims=True)
    labels = rng.integers(0, classes, size=batch)
    return raw_w, f_hat, labels


# -- heated-up softmax: eqs. 1-3 -------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 4.0, 16.0, 64.0])
def test_softmax_gradient_wrt_feature_is_eq3(alpha):
    raw_w, f_hat, labels = random_problem(seed=int(alpha))
    w_hat = raw_w / np.linalg.norm(raw_w, axis=1, keepdims=True)
    batch = len(labels)
    loss_fn = make_softmax(raw_w, alpha)
    f = torch.tensor(f_hat, dtype=torch.float32, requires_grad=True)
    loss = loss_fn(f, torch.as_tensor(labels))
    loss.backward()

    ref_losses, ref_grads = [], []
    for b in range(batch):
        value, _, _, dl_df = softmax_reference(f_hat[b], w_hat, int(labels[b]), alpha)
        ref_losses.append(value)
        ref_grads.append(dl_df / batch)  # F.cross_entropy averages over the batch
    assert float(loss.detach()) == pytest.approx(sum(ref_losses) / batch, rel=1e-5, abs=1e-6)
    ref = np.stack(ref_grads)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(f.grad.numpy(), ref, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("alpha", [1.0, 16.0, 64.0])
def test_softmax_gradient_wrt_logits_is_eq2(alpha):
    raw_w, f_hat, labels = random_problem(seed=10 + int(alpha), batch=4, classes=3, dim=5)
    w_hat = raw_w / np.linalg.norm(raw_w, axis=1, keepdims=True)
    loss_fn = make_softmax(raw_w, alpha)
    captured = {}
    original = loss_fn.logits

    def logits_with_grad(embeddings):
        out = original(embeddings)
        out.retain_grad()
        captured["logits"] = out
        return out

    loss_fn.logits = logits_with_grad
    loss = loss_fn(torch.tensor(f_hat, dtype=torch.float32), torch.as_tensor(labels))
    loss.backward()
    logits = captured["logits"]
    batch = len(labels)
    for b in range(batch):
        _, p, dl_dz, _ = softmax_reference(f_hat[b], w_hat, int(labels[b]), alpha)
        z = w_hat @ f_hat[b]
        # logits are alpha * z_m (eq. 1) ...
        np.testing.assert_allclose(logits[b].detach().numpy(), alpha * z, rtol=1e-5, atol=1e-5)
        # ... so dl/dz_m = alpha * dl/dlogit_m = alpha (p_m - q_m) (eq. 2), / batch for the mean
        np.testing.assert_allclose(alpha * logits.grad[b].numpy(), dl_dz / batch, rtol=1e-4, atol=1e-6 * alpha)


# -- heated-up softmax: sec. 3.1, gradient assignment by alpha ---------------------------------


def feature_grad_norm(w_hat: np.ndarray, f_hat: np.ndarray, label: int, alpha: float) -> float:
    loss_fn = make_softmax(w_hat, alpha)
    f = torch.tensor(f_hat[None], dtype=torch.float32, requires_grad=True)
    loss_fn(f, torch.tensor([label])).backward()
    return float(f.grad.norm())


W_HAT = np.stack([on_circle(0), on_circle(90), on_circle(200)])  # three unit proxies in the plane


def test_hard_sample_gradient_grows_with_alpha():
    # f at 70 deg: closer to proxy 1 (90 deg) than to its own class 0 (0 deg) -> misclassified
    f_hat = on_circle(70)
    assert (W_HAT @ f_hat).argmax() != 0
    norms = [feature_grad_norm(W_HAT, f_hat, 0, a) for a in (1.0, 4.0, 16.0, 64.0)]
    refs = [np.linalg.norm(softmax_reference(f_hat, W_HAT, 0, a)[3]) for a in (1.0, 4.0, 16.0, 64.0)]
    np.testing.assert_allclose(norms, refs, rtol=1e-4)
    assert all(b > a for a, b in zip(norms, norms[1:])), norms
    # alpha -> inf: p -> one-hot at the wrong class, |grad| -> alpha |w_1 - w_0| = alpha sqrt(2)
    assert norms[-1] == pytest.approx(64.0 * math.sqrt(2.0), rel=1e-3)


def test_easy_sample_gradient_vanishes_with_alpha():
    f_hat = on_circle(10)  # well inside class 0's region
    assert (W_HAT @ f_hat).argmax() == 0
    g4 = feature_grad_norm(W_HAT, f_hat, 0, 4.0)
    g64 = feature_grad_norm(W_HAT, f_hat, 0, 64.0)
    ref4 = np.linalg.norm(softmax_reference(f_hat, W_HAT, 0, 4.0)[3])
    assert g4 == pytest.approx(ref4, rel=1e-4)
    assert g4 > 0.05
    assert g64 < 1e-3 * g4
    assert g64 < 1e-12  # ~ 64 sqrt(2) exp(-64 (cos 10 - sin 10)) ~ 1e-20


# -- l2 softmax == pytorch-metric-learning's NormalizedSoftmaxLoss -----------------------------


@pytest.mark.parametrize("alpha", [1.0, 4.0, 16.0, 64.0])
def test_l2_softmax_matches_pml_normalized_softmax(alpha):
    from pytorch_metric_learning.losses import NormalizedSoftmaxLoss

    raw_w, f_hat, labels = random_problem(seed=100 + int(alpha), batch=12, classes=7, dim=10)
    ours = make_softmax(raw_w, alpha)
    pml = NormalizedSoftmaxLoss(num_classes=7, embedding_size=10, temperature=1.0 / alpha)
    assert tuple(pml.W.shape) == (10, 7)
    with torch.no_grad():
        pml.W.copy_(ours.weight.detach().t())
    emb = torch.tensor(f_hat, dtype=torch.float32)
    y = torch.as_tensor(labels)
    ours_value = ours(emb, y)
    pml_value = pml(emb, y)
    assert float(ours_value) == pytest.approx(float(pml_value), rel=1e-5, abs=1e-6)
    # same gradient w.r.t. the (raw) class weights: both normalize W per class
    ours_value.backward()
    pml_value.backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), pml.W.grad.t().numpy(), rtol=1e-4, atol=1e-6)


# -- mean-proxy regularizer (eq. 3.10 of 002_ad8188f3a39a9075) --------------------------------


def mean_proxy_reference(weights) -> float:
    weights = np.asarray(weights, dtype=np.float64)
    rows = [w / math.sqrt(sum(x * x for x in w)) for w in weights]
    mean = [sum(r[d] for r in rows) / len(rows) for d in range(weights.shape[1])]
    return math.sqrt(sum(x * x for x in mean))


def test_mean_proxy_norm_by_hand():
    # two orthogonal unit weights: mean (1/2, 1/2), norm sqrt(2)/2
    assert float(mean_proxy_norm(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))) == pytest.approx(math.sqrt(2) / 2)
    # norms do not matter: weights are normalized first
    assert float(mean_proxy_norm(torch.tensor([[5.0, 0.0], [0.0, 0.2]]))) == pytest.approx(math.sqrt(2) / 2)
    # opposite proxies cancel
    assert float(mean_proxy_norm(torch.tensor([[3.0, 4.0], [-0.3, -0.4]]))) == pytest.approx(0.0, abs=1e-7)
    # identical directions: norm 1
    assert float(mean_proxy_norm(torch.tensor([[1.0, 2.0, 2.0], [2.0, 4.0, 4.0]]))) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 4)) * rng.uniform(0.1, 10, size=(6, 1))
    assert float(mean_proxy_norm(torch.tensor(w))) == pytest.approx(mean_proxy_reference(w), rel=1e-12)


@pytest.mark.parametrize("lam", [0.1, 1.0, 2.5])
def test_mean_proxy_weight_adds_lambda_times_norm(lam):
    raw_w, f_hat, labels = random_problem(seed=7, batch=5, classes=4, dim=6)
    w_hat = raw_w / np.linalg.norm(raw_w, axis=1, keepdims=True)
    emb = torch.tensor(f_hat, dtype=torch.float32)
    y = torch.as_tensor(labels)
    plain = make_softmax(raw_w, 16.0)
    regularized = make_softmax(raw_w, 16.0, mean_proxy_weight=lam)
    value_plain, value_reg = float(plain(emb, y)), float(regularized(emb, y))
    norm = mean_proxy_reference(raw_w)
    assert value_reg - value_plain == pytest.approx(lam * norm, rel=1e-5, abs=1e-6)
    ce = sum(softmax_reference(f_hat[b], w_hat, int(labels[b]), 16.0)[0] for b in range(len(labels))) / len(labels)
    assert value_reg == pytest.approx(ce + lam * norm, rel=1e-5)
    assert regularized.stats["mean_proxy_norm"] == pytest.approx(norm, rel=1e-6)
    assert plain.stats["mean_proxy_norm"] == pytest.approx(norm, rel=1e-6)  # reported even when weight 0


def test_mean_proxy_term_gradient_on_weights():
    # d/dW of lam * ||mean_c w_hat_c||, checked against autograd on a float64 expression of our own
    raw_w, f_hat, labels = random_problem(seed=8, batch=5, classes=4, dim=6)
    lam = 0.7
    emb = torch.tensor(f_hat, dtype=torch.float32)
    y = torch.as_tensor(labels)
    plain, reg = make_softmax(raw_w, 16.0), make_softmax(raw_w, 16.0, mean_proxy_weight=lam)
    plain(emb, y).backward()
    reg(emb, y).backward()
    w = torch.tensor(raw_w, dtype=torch.float64, requires_grad=True)
    (lam * (w / w.norm(dim=1, keepdim=True)).mean(0).norm()).backward()
    np.testing.assert_allclose((reg.weight.grad - plain.weight.grad).numpy(), w.grad.numpy(), rtol=1e-4, atol=1e-6)


# -- heat buffer and learnable alpha -----------------------------------------------------------


def test_heat_scales_alpha():
    raw_w, f_hat, labels = random_problem(seed=9, batch=3, classes=4, dim=5)
    w_hat = raw_w / np.linalg.norm(raw_w, axis=1, keepdims=True)
    loss_fn = make_softmax(raw_w, 16.0)
    assert "heat" in dict(loss_fn.named_buffers()) and "alpha" in dict(loss_fn.named_buffers())
    assert not any(p is loss_fn.alpha for p in loss_fn.parameters())
    assert loss_fn.current_alpha == pytest.approx(16.0)
    loss_fn.heat.fill_(0.25)
    assert loss_fn.current_alpha == pytest.approx(4.0)
    logits = loss_fn.logits(torch.tensor(f_hat, dtype=torch.float32))
    np.testing.assert_allclose(logits.detach().numpy(), 4.0 * f_hat @ w_hat.T, rtol=1e-5, atol=1e-6)
    value = float(loss_fn(torch.tensor(f_hat, dtype=torch.float32), torch.as_tensor(labels)))
    ref = sum(softmax_reference(f_hat[b], w_hat, int(labels[b]), 4.0)[0] for b in range(3)) / 3
    assert value == pytest.approx(ref, rel=1e-5)
    assert "heat" in loss_fn.state_dict()


def test_learnable_alpha_is_a_parameter_with_gradient():
    raw_w, f_hat, labels = random_problem(seed=11, batch=4, classes=3, dim=5)
    w_hat = raw_w / np.linalg.norm(raw_w, axis=1, keepdims=True)
    loss_fn = make_softmax(raw_w, 8.0, learn_alpha=True)
    assert isinstance(loss_fn.alpha, nn.Parameter)
    assert any(p is loss_fn.alpha for p in loss_fn.parameters())
    loss_fn.heat.fill_(0.5)
    assert loss_fn.current_alpha == pytest.approx(4.0)
    loss_fn(torch.tensor(f_hat, dtype=torch.float32), torch.as_tensor(labels)).backward()
    assert loss_fn.alpha.grad is not None
    # l = mean_b CE(alpha * heat * z_b): dl/dalpha = mean_b heat * sum_m (p_m - q_m) z_m
    ref = 0.0
    for b in range(4):
        _, p, _, _ = softmax_reference(f_hat[b], w_hat, int(labels[b]), 4.0)
        z = w_hat @ f_hat[b]
        q = np.eye(3)[labels[b]]
        ref += 0.5 * float(((p - q) * z).sum()) / 4
    assert float(loss_fn.alpha.grad) == pytest.approx(ref, rel=1e-4, abs=1e-7)


def test_set_alpha_heats_a_fixed_alpha_to_the_schedule_value():
    raw_w, f_hat, labels = random_problem(seed=12, batch=3, classes=4, dim=5)
    w_hat = raw_w / np.linalg.norm(raw_w, axis=1, keepdims=True)
    loss_fn = make_softmax(raw_w, 16.0)
    assert loss_fn.schedule_metrics() == {"alpha_now": pytest.approx(16.0)}
    loss_fn.set_alpha(4.0)
    assert float(loss_fn.heat) == pytest.approx(0.25) and float(loss_fn.alpha) == 16.0
    assert loss_fn.current_alpha == pytest.approx(4.0)
    assert loss_fn.schedule_metrics() == {"alpha_now": pytest.approx(4.0)}
    logits = loss_fn.logits(torch.tensor(f_hat, dtype=torch.float32))
    np.testing.assert_allclose(logits.detach().numpy(), 4.0 * f_hat @ w_hat.T, rtol=1e-5, atol=1e-6)
    loss_fn.set_alpha(16.0)  # back to the start: no drift from repeated calls
    assert float(loss_fn.heat) == 1.0 and loss_fn.current_alpha == pytest.approx(16.0)


def test_set_alpha_scales_a_learned_alpha_by_the_schedule_ratio():
    loss_fn = HeatedSoftmaxLoss(3, 5, alpha=8.0, learn_alpha=True)
    with torch.no_grad():
        loss_fn.alpha.fill_(10.0)  # as if training had moved it from 8 to 10
    loss_fn.set_alpha(4.0)  # the schedule halves alpha_init
    assert float(loss_fn.heat) == pytest.approx(0.5)
    assert loss_fn.schedule_metrics() == {"alpha_now": pytest.approx(5.0)}
    assert isinstance(loss_fn.alpha, nn.Parameter) and float(loss_fn.alpha) == 10.0


def test_ice_ignores_set_alpha_and_reports_no_schedule_metrics():
    torch.manual_seed(13)
    f, labels = torch.randn(8, 6), torch.arange(4).repeat_interleave(2)
    loss_fn = ICELoss(scale=16.0)
    before = float(loss_fn(f, labels))
    loss_fn.set_alpha(4.0)
    assert float(loss_fn(f, labels)) == before and loss_fn.scale == 16.0
    assert loss_fn.schedule_metrics() == {}
    assert dict(loss_fn.state_dict()) == {}


def test_softmax_accuracy_stat():
    w = np.eye(3)
    f_hat = np.stack([unit([1, 0.1, 0]), unit([0.1, 1, 0]), unit([1, 0, 0.2]), unit([0, 0, 1])])
    labels = torch.tensor([0, 1, 1, 2])  # third one is wrong
    loss_fn = make_softmax(w, 16.0)
    loss_fn(torch.tensor(f_hat, dtype=torch.float32), labels)
    assert loss_fn.stats["accuracy"] == pytest.approx(0.75)


# -- ICE: references ---------------------------------------------------------------------------


def ice_reference(sim, labels, s: float):
    """Eqs. 3, 5, 11-14 with explicit loops (Python floats). Returns (loss, G, valid, n_valid).

    G[a, b] = dL/dsim[a, b] as prescribed by eq. 15: -w_bar(i; a) for a positive i of anchor a
    (eq. 13), +w_bar(j; a) for a negative j (eq. 14), 0 on the diagonal and for anchors without
    a positive or a negative. N in eqs. 13-14 and the loss normalisation is the number of such
    valid anchors (all anchors in a batch of C x k with k >= 2).
    """
    sim = [[float(x) for x in row] for row in np.asarray(sim, dtype=np.float64)]
    labels = [int(y) for y in labels]
    n = len(labels)
    pos = [[i for i in range(n) if i != a and labels[i] == labels[a]] for a in range(n)]
    neg = [[j for j in range(n) if labels[j] != labels[a]] for a in range(n)]
    valid = [bool(pos[a]) and bool(neg[a]) for a in range(n)]
    n_valid = sum(valid)
    total_loss = 0.0
    G = [[0.0] * n for _ in range(n)]
    for a in range(n):
        if not valid[a]:
            continue
        sum_neg = sum(math.exp(s * sim[a][j]) for j in neg[a])
        one_minus_p = {}
        for i in pos[a]:
            e_pos = math.exp(s * sim[a][i])
            p_hat = e_pos / (e_pos + sum_neg)  # eq. 3 with scale s
            total_loss += -math.log(p_hat)  # eq. 5
            one_minus_p[i] = sum_neg / (e_pos + sum_neg)  # eq. 11
        norm = sum(one_minus_p.values())
        for i in pos[a]:
            G[a][i] = -one_minus_p[i] / (2 * n_valid * norm)  # eq. 13
        for j in neg[a]:
            w_hat = sum(math.exp(s * sim[a][j]) / (math.exp(s * sim[a][i]) + sum_neg) for i in pos[a])  # eq. 12
            G[a][j] = w_hat / (2 * n_valid * norm)  # eq. 14
    return total_loss / n_valid, np.array(G), valid, n_valid


LAYOUTS = {
    "3x2": [0, 0, 1, 1, 2, 2],
    "2x3": [0, 0, 0, 1, 1, 1],
    "4x4": [c for c in range(4) for _ in range(4)],
    "uneven": [0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 3, 3],
}
SCALES = [1.0, 16.0, 64.0, 128.0]


def layout(name: str, seed: int):
    rng = np.random.default_rng(seed)
    labels = np.array(LAYOUTS[name])
    perm = rng.permutation(len(labels))  # labels need not be grouped
    return labels[perm]


def unit_features(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# -- ICE: value and weights of ice_terms -------------------------------------------------------


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("s", SCALES)
def test_ice_terms_match_loop(name, s):
    labels = layout(name, seed=len(name))
    f = unit_features(len(labels), 5, seed=int(s) + len(name))
    sim = torch.tensor(f @ f.T, dtype=torch.float64)
    loss, grad = ice_terms(sim, torch.as_tensor(labels), s)
    ref_loss, ref_G, valid, n_valid = ice_reference(f @ f.T, labels, s)
    assert all(valid) and n_valid == len(labels)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert float(loss) == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad.numpy(), ref_G, rtol=1e-8, atol=1e-14)
    # structure of eq. 15: positives pulled (<= 0), negatives pushed (>= 0), nothing on the diagonal
    same = labels[:, None] == labels[None, :]
    g = grad.numpy()
    assert np.all(np.diag(g) == 0)
    assert np.all(g[same] <= 0) and np.all(g[~same] >= 0)
    # per anchor, positives and negatives each carry 1/(2N) in total (eqs. 13-14)
    for a in range(len(labels)):
        pos = same[a].copy()
        pos[a] = False
        assert -g[a, pos].sum() == pytest.approx(1 / (2 * n_valid), rel=1e-9)
        assert g[a, ~same[a]].sum() == pytest.approx(1 / (2 * n_valid), rel=1e-9)


ICE_OVERFLOW = (
    "losses.py ice_terms, w_neg line: torch.exp(logits + log_sum_inv[:, None]) is evaluated for every "
    "entry and only then multiplied by the mask `neg`; at masked entries (diagonal, positives) the "
    "exponent s*sim_ab - D(a,i) exceeds 88.7 in float32 (e.g. s=128 with sims near 0, or s=64 when an "
    "anchor's positive and negatives all have sim < -0.39), exp gives inf and inf * 0 = NaN; "
    "mask before exp (masked_fill(~neg, -inf)) instead"
)


def test_ice_terms_float32_high_scale_stays_finite():
    # exp(128) overflows float32: the implementation must work in the log domain
    labels = layout("4x4", seed=1)
    f = unit_features(len(labels), 4, seed=5)
    sim = torch.tensor(f @ f.T, dtype=torch.float32)
    loss, grad = ice_terms(sim, torch.as_tensor(labels), 128.0)
    ref_loss, ref_G, _, _ = ice_reference(sim.double().numpy(), labels, 128.0)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert float(loss) == pytest.approx(ref_loss, rel=1e-4)
    np.testing.assert_allclose(grad.numpy(), ref_G, rtol=1e-3, atol=1e-6 * np.abs(ref_G).max())


def test_ice_terms_two_samples_per_class_case_study():
    # sec. 3.5: with one positive per anchor, eq. 13 gives exactly 1/(2N) to that positive
    labels = np.array([0, 1, 2, 0, 1, 2])
    f = unit_features(6, 3, seed=2)
    _, grad = ice_terms(torch.tensor(f @ f.T), torch.as_tensor(labels), 16.0)
    for a in range(6):
        (i,) = [b for b in range(6) if b != a and labels[b] == labels[a]]
        assert float(grad[a, i]) == pytest.approx(-1 / 12, rel=1e-12)


def test_ice_terms_anchor_without_positive_left_out():
    labels = np.array([0, 0, 1, 1, 1, 2, 3, 3])  # class 2 is a singleton
    f = unit_features(len(labels), 4, seed=3)
    sim = torch.tensor(f @ f.T)
    loss, grad = ice_terms(sim, torch.as_tensor(labels), 16.0)
    ref_loss, ref_G, valid, n_valid = ice_reference(f @ f.T, labels, 16.0)
    assert valid == [True] * 5 + [False] + [True] * 2 and n_valid == 7
    assert float(loss) == pytest.approx(ref_loss, rel=1e-10)
    np.testing.assert_allclose(grad.numpy(), ref_G, rtol=1e-8, atol=1e-14)
    assert torch.all(grad[5] == 0)  # the singleton is no anchor ...
    assert torch.all(grad[labels != 2, 5] > 0)  # ... but still a negative of every other anchor
    for a in np.flatnonzero(valid):
        pos = (labels == labels[a]) & (np.arange(len(labels)) != a)
        assert -grad[a, pos].sum().item() == pytest.approx(1 / (2 * n_valid), rel=1e-9)
        assert grad[a, labels != labels[a]].sum().item() == pytest.approx(1 / (2 * n_valid), rel=1e-9)


def test_ice_loss_value_when_nothing_matches_is_log_of_negatives():
    # all similarities 0: p_hat = 1 / (1 + #neg) for every pair, so loss = (#pos per anchor) log(1 + #neg)
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    loss, _ = ice_terms(torch.zeros(6, 6, dtype=torch.float64), labels, 64.0)
    assert float(loss) == pytest.approx(2 * math.log(4))


# -- ICELoss end to end ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["3x2", "4x4", "uneven"])
@pytest.mark.parametrize("s", [1.0, 16.0, 64.0])
def test_ice_loss_backward_is_eq15(name, s):
    labels = layout(name, seed=7)
    rng = np.random.default_rng(int(s) + 3)
    raw = rng.normal(size=(len(labels), 6)) * rng.uniform(0.5, 3.0, size=(len(labels), 1))  # not unit norm
    f = torch.tensor(raw, dtype=torch.float64, requires_grad=True)
    loss_fn = ICELoss(scale=s)
    loss = loss_fn(f, torch.as_tensor(labels))
    loss.backward()

    f_hat_np = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    ref_loss, G, _, _ = ice_reference(f_hat_np @ f_hat_np.T, labels, s)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-4, abs=1e-5)
    # reference gradient: autograd of sum(G * f_hat f_hat^T) with G held constant
    f_ref = torch.tensor(raw, dtype=torch.float64, requires_grad=True)
    f_hat = f_ref / torch.sqrt((f_ref * f_ref).sum(1, keepdim=True))
    (torch.tensor(G) * (f_hat @ f_hat.t())).sum().backward()
    scale = f_ref.grad.abs().max().item()
    np.testing.assert_allclose(f.grad.numpy(), f_ref.grad.numpy(), rtol=1e-3, atol=1e-4 * scale)


@pytest.mark.parametrize("s", [64.0, 128.0])
def test_ice_loss_float32_far_apart_points_gradient_finite(s):
    # 2-d points: class 0 at 0 and 180 deg, class 1 at 120 and 240 deg; every anchor's positive
    # and negatives have similarity -1/2. In float32 (the dtype ICELoss computes in).
    angles = torch.tensor([0.0, 180.0, 120.0, 240.0]) * math.pi / 180
    f = torch.stack([angles.cos(), angles.sin()], 1).requires_grad_()
    labels = np.array([0, 0, 1, 1])
    loss = ICELoss(scale=s)(f, torch.as_tensor(labels))
    loss.backward()
    f_np = f.detach().double().numpy()
    ref_loss, _, _, _ = ice_reference(f_np @ f_np.T, labels, s)
    assert torch.isfinite(f.grad).all()
    assert float(loss) == pytest.approx(ref_loss, rel=1e-4)


def test_ice_loss_scale_128_random_init_gradient_finite():
    # random 64-d embeddings (similarities near 0, as at initialisation), 8 classes x 4, s = 128
    torch.manual_seed(0)
    labels = torch.arange(8).repeat_interleave(4)
    f = torch.randn(32, 64, requires_grad=True)
    loss = ICELoss(scale=128.0)(f, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(f.grad).all()


def test_ice_loss_accuracy_stat():
    # nearest neighbour (self excluded) of each point, by hand
    f = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.8, 0.3]])
    labels = torch.tensor([0, 0, 1, 1, 1])  # the last one's nearest neighbour is class 0
    loss_fn = ICELoss(scale=16.0)
    loss_fn(f, labels)
    assert loss_fn.stats["accuracy"] == pytest.approx(4 / 5)


# -- the registry ------------------------------------------------------------------------------


def test_build_loss_reads_the_config_keys_of_each_loss():
    softmax = build_loss(
        TrainConfig.from_dict({"loss": "softmax", "embedding_dim": 12, "alpha": 32.0, "learn_alpha": True, "mean_proxy_weight": 0.5}),
        num_classes=7,
    )
    assert type(softmax) is HeatedSoftmaxLoss and softmax.weight.shape == (7, 12)
    assert isinstance(softmax.alpha, nn.Parameter) and float(softmax.alpha) == 32.0
    assert softmax.weight_norm is True and softmax.bias is None and softmax.mean_proxy_weight == 0.5
    plain = build_loss(TrainConfig.from_dict({"weight_norm": False, "heating": "none"}), num_classes=3)
    assert plain.weight_norm is False and plain.bias is not None and plain.bias.shape == (3,)
    ice = build_loss(TrainConfig.from_dict({"loss": "ice", "ice_scale": 32.0}), num_classes=7)
    assert type(ice) is ICELoss and ice.scale == 32.0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_registered_loss_keeps_the_engine_contract(name):
    """What the engine relies on: a scalar with a gradient, batch-mean stats, set_alpha and schedule_metrics."""
    torch.manual_seed(14)
    config = TrainConfig.from_dict({"loss": name, "embedding_dim": 6, "samples_per_class": 2})
    loss_fn = build_loss(config, num_classes=4)
    assert type(loss_fn) is LOSSES[name]
    f = torch.randn(8, 6, requires_grad=True)
    loss = loss_fn(f, torch.arange(4).repeat_interleave(2))
    loss.backward()
    assert loss.shape == () and torch.isfinite(loss) and f.grad is not None
    assert 0.0 <= loss_fn.stats["accuracy"] <= 1.0
    assert all(isinstance(v, float) for v in loss_fn.stats.values())
    loss_fn.set_alpha(config.heating_target)
    metrics = loss_fn.schedule_metrics()
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics == ({"alpha_now": pytest.approx(config.heating_target)} if name == "softmax" else {})

"""Tests of the embedding reductions of 001_df21db8a9bc1b516 (sec. 3.1, Fig. 3): PCA, FCR1, FCR2.

References: scikit-learn's PCA (fitted independently on the same features), a 2-D example
worked out by hand, and the config rules for ``embedding_reduction`` and ``dropout``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.decomposition import PCA

from trainables.core.checkpoint import load_bundle, save_bundle
from trainables.core.config import ConfigError, TrainConfig, applicable_keys
from trainables.core.models import EmbeddingNet, PCAReduction

SMALL = dict(dataset="synthetic", classes_per_batch=8, samples_per_class=2, embedding_dim=16, normalization="l2", heating="none")


def correlated_features(n: int = 300, dim: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim)) * np.linspace(3, 0.1, dim)[:, None]  # distinct variances
    return rng.normal(size=(n, dim)) @ mixing + rng.normal(size=dim) * 5


# -- PCAReduction against references -----------------------------------------------------------


def test_pca_matches_scikit_learn():
    x = correlated_features()
    ref = PCA(n_components=5).fit(x)
    pca = PCAReduction(12, 5).fit(torch.from_numpy(x))
    # fitted in float64, stored as float32 buffers
    np.testing.assert_allclose(pca.mean.numpy(), ref.mean_, rtol=1e-6)
    np.testing.assert_allclose(pca.explained_variance.numpy(), ref.explained_variance_, rtol=1e-6)
    # components agree up to the sign of each row (sign conventions differ between libraries)
    signs = np.sign(np.sum(pca.components.numpy() * ref.components_, axis=1))
    assert set(np.abs(signs)) == {1.0}
    np.testing.assert_allclose(pca.components.numpy() * signs[:, None], ref.components_, atol=1e-6)
    queries = correlated_features(20, seed=1)
    out = pca(torch.from_numpy(queries)).numpy()  # computed in float32
    np.testing.assert_allclose(out * signs, ref.transform(queries), rtol=1e-4, atol=1e-3)


def test_pca_by_hand_on_a_line():
    # points t * (1, 2) + (3, -1): one direction of variance, (1, 2) / sqrt(5), centered at (3, -1) + mean(t) * (1, 2)
    t = torch.tensor([-2.0, -1.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    x = t[:, None] * torch.tensor([1.0, 2.0], dtype=torch.float64) + torch.tensor([3.0, -1.0], dtype=torch.float64)
    pca = PCAReduction(2, 1).fit(x)
    torch.testing.assert_close(pca.components[0].double(), torch.tensor([1.0, 2.0], dtype=torch.float64) / math.sqrt(5))
    torch.testing.assert_close(pca.mean.double(), torch.tensor([3.6, 0.2], dtype=torch.float64))
    # projection = (t - mean(t)) * |(1, 2)| = (t - 0.6) * sqrt(5); variance = sum(((t - 0.6) sqrt 5)^2) / (n - 1)
    expected = (t - 0.6) * math.sqrt(5)
    torch.testing.assert_close(pca(x)[:, 0].double(), expected, rtol=1e-6, atol=1e-6)
    assert float(pca.explained_variance[0]) == pytest.approx(float((expected**2).sum() / 4))


def test_pca_sign_convention_and_refit():
    x = torch.from_numpy(correlated_features(seed=2))
    a = PCAReduction(12, 4).fit(x)
    b = PCAReduction(12, 4).fit(-x)  # mirrored data: same directions; the sign rule fixes them
    biggest = a.components.gather(1, a.components.abs().argmax(1, keepdim=True))
    assert bool((biggest > 0).all())
    torch.testing.assert_close(a.components, b.components)
    torch.testing.assert_close(a.components @ a.components.T, torch.eye(4, dtype=a.components.dtype), atol=1e-6, rtol=0)


def test_pca_refuses_use_before_fit_and_bad_shapes():
    pca = PCAReduction(8, 3)
    assert not pca.is_fitted
    with pytest.raises(RuntimeError, match="not fitted"):
        pca(torch.zeros(2, 8))
    with pytest.raises(ValueError, match=r"\(N, 8\) with N > 3"):
        pca.fit(torch.zeros(3, 8))
    with pytest.raises(ValueError, match="out_dim"):
        PCAReduction(4, 5)


# -- EmbeddingNet with each reduction ----------------------------------------------------------


def test_embedding_net_pca_trains_on_pool_features_and_evaluates_on_their_pca():
    torch.manual_seed(0)
    net = EmbeddingNet("small_cnn", 16, "l2", in_channels=1, image_size=32, reduction="pca")
    images = torch.randn(40, 1, 32, 32)
    with torch.no_grad():
        net.train()
        train_out = net(images)
        # train mode: the l2-normalized pool features, which the loss trains on
        torch.testing.assert_close(train_out, F.normalize(net.backbone(images), dim=1))
        net.eval()  # from here on the backbone's batch norm uses fixed statistics
        pool = net.backbone(images)
        assert net.train_dim == pool.shape[1] == 256
        net.pca.fit(pool)
        out = net(images)
    assert out.shape == (40, 16)
    # applied before the normalization: l2(PCA(pool)); scikit-learn's PCA as the reference, compared through
    # cosine similarities, which a sign flip of a component does not change
    ref = F.normalize(torch.from_numpy(PCA(16).fit(pool.double().numpy()).transform(pool.double().numpy())).float(), dim=1)
    torch.testing.assert_close(out @ out.T, ref @ ref.T, atol=1e-4, rtol=0)
    assert [name for name, _ in net.named_parameters() if name.startswith(("embed", "pca"))] == []


def test_embedding_net_pca_cannot_add_dimensions():
    with pytest.raises(ConfigError, match="embedding_dim=512 with embedding_reduction=pca.*expected embedding_dim <= 256"):
        EmbeddingNet("small_cnn", 512, "l2", in_channels=1, image_size=32, reduction="pca")


def test_fcr2_drops_after_the_fc_layer_and_fcr1_does_not():
    torch.manual_seed(1)
    fcr2 = EmbeddingNet("small_cnn", 32, "none", in_channels=1, image_size=32, dropout=0.5, reduction="fc_dropout")
    x = torch.randn(8, 1, 32, 32)
    with torch.no_grad():
        fcr2.eval()
        pool = fcr2.backbone(x)
        full = F.linear(pool, fcr2.embed.weight, fcr2.embed.bias)
        torch.testing.assert_close(fcr2(x), full)  # no dropout in evaluation
        fcr2.train()
        fcr2.backbone.eval()  # keep batch statistics out of it: only the dropout differs
        dropped = fcr2(x)
    zeros = dropped == 0
    assert 0.3 < float(zeros.float().mean()) < 0.7  # whole embedding coordinates dropped, after the FC layer
    torch.testing.assert_close(dropped[~zeros], (full * 2)[~zeros])  # inverted dropout scales the kept ones by 1 / (1 - p)
    fcr1 = EmbeddingNet("small_cnn", 32, "none", in_channels=1, image_size=32, reduction="fc")
    assert isinstance(fcr1.dropout, torch.nn.Identity) and fcr1.pca is None


# -- config --------------------------------------------------------------------------------------


def test_config_reduction_rules():
    assert TrainConfig().embedding_reduction == "fc"
    old = {k: v for k, v in TrainConfig().to_dict().items() if k != "embedding_reduction"}
    assert TrainConfig.from_dict(old).embedding_reduction == "fc"  # configs written before the key stay valid
    assert TrainConfig.from_dict({"embedding_reduction": "fc_dropout", "dropout": 0.5}).dropout == 0.5
    cases = [
        ({"embedding_reduction": "lda"}, "embedding_reduction='lda' is not allowed; expected one of fc, fc_dropout, pca"),
        ({"dropout": 0.3}, "dropout=0.3 applies only to the dropout layer of embedding_reduction=fc_dropout"),
        ({"embedding_reduction": "pca", "dropout": 0.3, "normalization": "l2"}, "expected embedding_reduction: fc_dropout, or dropout: 0"),
        ({"embedding_reduction": "fc_dropout"}, "dropout=0.0 is not allowed; expected a probability in \\(0, 1\\)"),
        ({"embedding_reduction": "pca"}, "normalization='bn' with embedding_reduction=pca is not allowed"),
    ]
    for values, message in cases:
        with pytest.raises(ConfigError, match=message):
            TrainConfig.from_dict(values, source="x.yaml")
    # best_config.yaml keeps dropout only where it acts
    assert "dropout" not in applicable_keys(TrainConfig.from_dict({"embedding_reduction": "pca", "normalization": "l2"}))
    fcr2 = TrainConfig.from_dict({"embedding_reduction": "fc_dropout", "dropout": 0.5})
    assert {"embedding_reduction", "dropout"} <= set(applicable_keys(fcr2))


# -- training, checkpoint and logged model ---------------------------------------------------------


@pytest.mark.usefixtures("one_thread")
def test_fit_with_pca_fits_on_the_training_images_and_the_bundle_carries_it(tmp_path):
    from study.final.pyfunc import EmbeddingModel
    from trainables.core.data import load_dataset
    from trainables.core.engine import embed, fit

    config = TrainConfig.from_dict({**SMALL, "epochs": 1, "embedding_reduction": "pca"})
    splits = load_dataset("synthetic", None, 0)
    run = fit(config, mode="final", splits=splits, device=torch.device("cpu"))
    assert run.loss_fn.weight.shape[1] == run.model.train_dim == 256  # the classifier is on the pool features
    assert "test_recall_at_1" in run.metrics
    # the PCA is the one of the pool features of the training images, fitted after the last epoch
    pool = embed(run.model.backbone, run.train_set, run.image_size, run.device).double().numpy()
    ref = PCA(16).fit(pool)
    np.testing.assert_allclose(run.model.pca.mean.numpy(), ref.mean_, atol=1e-6)
    np.testing.assert_allclose(np.abs(np.sum(run.model.pca.components.numpy() * ref.components_, axis=1)), 1.0, atol=1e-5)

    path = save_bundle(run.bundle(), tmp_path / "bundle.pt")
    state = load_bundle(path)["model"]
    assert bool(state["pca.fitted"]) and state["pca.components"].shape == (16, 256)
    model = EmbeddingModel()
    model.load_context(SimpleNamespace(artifacts={"bundle": str(path)}))
    images = np.stack([run.eval_set.load(i) for i in range(6)])
    served = model.predict(None, images)
    expected = F.normalize(embed(run.model, run.eval_set, run.image_size, run.device)[:6], dim=1).numpy()
    assert served.shape == (6, 16)
    np.testing.assert_allclose(served, expected, atol=1e-5)


def test_logged_model_without_a_fitted_pca_is_refused(tmp_path):
    from study.final.pyfunc import EmbeddingModel
    from trainables.core.checkpoint import CheckpointError
    from trainables.core.engine import build_model

    config = TrainConfig.from_dict({**SMALL, "embedding_reduction": "pca"})
    model = build_model(config, "characters", 32)
    bundle = {"config": config.to_dict(), "epoch": 1, "model": model.state_dict(), "kind": "characters", "image_size": 32}
    path = save_bundle(bundle, tmp_path / "bundle.pt")
    with pytest.raises(CheckpointError, match="no fitted PCA"):
        EmbeddingModel().load_context(SimpleNamespace(artifacts={"bundle": str(path)}))

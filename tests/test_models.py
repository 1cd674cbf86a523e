"""Tests of trainables.core.models: feature normalization, output shapes, local weights files.

References: eq. 7 of 000_4178e6910e81cd2f (f_BN = BN(f)/sqrt(d), BN without learned scale)
computed by hand from batch statistics; torchvision's resnet18 for weights; shapes worked out
from the layer arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import torchvision

from tests.conftest import write_malicious_pickle
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.models import BACKBONES, NORMALIZATIONS, BNNormalize, EmbeddingNet, SmallCNN, WeightsError

# -- feature normalization -------------------------------------------------------------------


def test_bn_normalize_is_eq7_by_hand():
    torch.manual_seed(0)
    d = 16
    x = torch.randn(64, d) * torch.rand(d) * 5 + torch.randn(d) * 3
    layer = BNNormalize(d).train()
    with torch.no_grad():
        layer.bias.copy_(torch.randn(d))
    out = layer(x)
    mean = x.mean(0)
    var = ((x - mean) ** 2).mean(0)  # biased variance, as batch norm normalizes with
    ref = ((x - mean) / torch.sqrt(var + 1e-5) + layer.bias) / math.sqrt(d)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # no learned scale: only the shift is a parameter
    assert [n for n, _ in layer.named_parameters()] == ["bias"]


def test_bn_normalize_norms_close_to_one():
    torch.manual_seed(1)
    d = 64
    x = torch.randn(256, d) * 7.0 + 3.0
    with torch.no_grad():
        out = BNNormalize(d).train()(x)
    norms = out.norm(dim=1)
    # per dimension zero mean, unit (biased) variance: mean squared norm is d/d = 1
    assert float((norms**2).mean()) == pytest.approx(1.0, abs=1e-3)
    assert abs(float(norms.mean()) - 1.0) < 0.05


def test_embedding_net_bn_norms_close_to_one_in_train_mode():
    torch.manual_seed(2)
    net = EmbeddingNet("small_cnn", 64, "bn", in_channels=1, image_size=32).train()
    with torch.no_grad():
        out = net(torch.randn(256, 1, 32, 32))
    assert out.shape == (256, 64)
    assert abs(float(out.norm(dim=1).mean()) - 1.0) < 0.05


def test_embedding_net_l2_norms_exactly_one():
    torch.manual_seed(3)
    net = EmbeddingNet("small_cnn", 32, "l2", in_channels=1, image_size=32).eval()
    out = net(torch.randn(8, 1, 32, 32))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(8), rtol=0, atol=1e-6)


def test_embedding_net_none_leaves_the_linear_embedding_unchanged():
    torch.manual_seed(4)
    net = EmbeddingNet("small_cnn", 32, "none", in_channels=1, image_size=32).eval()
    x = torch.randn(4, 1, 32, 32)
    out = net(x)
    ref = F.linear(net.backbone(x), net.embed.weight, net.embed.bias)
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(out.norm(dim=1), torch.ones(4), atol=1e-3)


# -- shapes ----------------------------------------------------------------------------------


def reference_small_cnn(net: SmallCNN, x: torch.Tensor) -> torch.Tensor:
    """The textbook block order, conv -> BN -> ReLU -> maxpool, written with torch.nn.functional on ``net``'s own
    parameters and batch statistics (training mode), independent of the module's layer order."""
    convs = [m for m in net.features if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in net.features if isinstance(m, torch.nn.BatchNorm2d)]
    for conv, norm in zip(convs, norms, strict=True):
        x = F.conv2d(x, conv.weight, padding=1)
        x = F.batch_norm(x, None, None, norm.weight, norm.bias, training=True, eps=norm.eps)
        x = F.max_pool2d(F.relu(x), 2)
    return x.flatten(1)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_small_cnn_pools_before_its_relu_with_the_same_values_and_gradients(layout):
    # max-pooling commutes with the ReLU (a non-decreasing function): the same floats out and the same gradients in,
    # to the last bit, as the textbook order; the test's input has exact ties at 0 (a constant patch) and negatives
    torch.manual_seed(5)
    net = SmallCNN(in_channels=1, image_size=32).train().to(memory_format=layout)
    x = torch.randn(16, 1, 32, 32)
    x[:, :, :8, :8] = 0.0
    x = x.contiguous(memory_format=layout)
    upstream = torch.randn(16, net.out_dim)
    out = net(x)
    (out * upstream).sum().backward()
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    ref = reference_small_cnn(net, x)
    (ref * upstream).sum().backward()
    assert torch.equal(out, ref)
    assert all(torch.equal(a, p.grad) for a, p in zip(got, net.parameters(), strict=True))
    assert any(bool((a != 0).any()) for a in got)


def test_small_cnn_loads_a_state_dict_of_the_textbook_layer_order():
    # models trained before the pooling moved ahead of the ReLU: their keys name the same conv and BN layers
    old = torch.nn.Sequential()
    for i, channels in enumerate([1, 64, 64, 64]):
        block = [torch.nn.Conv2d(channels, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        old.extend(block)
        torch.nn.init.normal_(old[4 * i + 1].weight)
    net = SmallCNN(in_channels=1, image_size=32).eval()
    net.features.load_state_dict(old.state_dict())
    x = torch.randn(4, 1, 32, 32)
    torch.testing.assert_close(net(x), old.eval()(x).flatten(1), rtol=0, atol=0)


@pytest.mark.parametrize("size, spatial", [(28, 1), (32, 2)])  # 28->14->7->3->1, 32->16->8->4->2
def test_small_cnn_output_shape(size, spatial):
    net = SmallCNN(in_channels=1, image_size=size).eval()
    out = net(torch.randn(3, 1, size, size))
    assert out.shape == (3, 64 * spatial * spatial)
    assert net.out_dim == 64 * spatial * spatial
    emb = EmbeddingNet("small_cnn", 24, "l2", in_channels=1, image_size=size).eval()
    assert emb(torch.randn(3, 1, size, size)).shape == (3, 24)


@pytest.mark.parametrize("width", [8, 32, 96])
def test_small_cnn_width_sets_every_blocks_channels_and_the_parameter_count(width):
    # by hand: four 3x3 convs without bias (1 -> w, then w -> w three times) and four batch norms of w scales and shifts
    net = SmallCNN(in_channels=1, width=width, image_size=32)
    assert sum(p.numel() for p in net.parameters()) == 1 * width * 9 + 3 * width * width * 9 + 4 * 2 * width
    assert [m.out_channels for m in net.modules() if isinstance(m, torch.nn.Conv2d)] == [width] * 4
    assert net(torch.randn(2, 1, 32, 32)).shape == (2, width * 2 * 2) and net.out_dim == width * 4


def test_backbone_width_reaches_the_model_built_from_a_config():
    from trainables.core.engine import build_model

    config = TrainConfig.from_dict({"dataset": "synthetic", "backbone_width": 24, "embedding_dim": 16})
    model = build_model(config, "characters", 32)
    assert model.backbone.out_dim == 24 * 2 * 2 and model.embed.in_features == 96  # 32 px -> 2 x 2 after four poolings
    default = build_model(TrainConfig.from_dict({"dataset": "synthetic"}), "characters", 32)
    assert default.backbone.out_dim == 64 * 2 * 2


def test_backbone_width_other_than_the_default_is_refused_for_a_torchvision_backbone():
    with pytest.raises(ConfigError, match=r"backbone_width=32 .*expected 64 \(the default\) with backbone=resnet18"):
        TrainConfig.from_dict({"backbone": "resnet18", "backbone_width": 32})
    assert TrainConfig.from_dict({"backbone": "resnet18"}).backbone_width == 64


def test_small_cnn_runs_at_the_smallest_image_size_the_config_accepts():
    # 16 -> 8 -> 4 -> 2 -> 1: four halvings leave one pixel
    config = TrainConfig.from_dict({"backbone": "small_cnn", "image_size": 16, "dataset": "synthetic"})
    net = EmbeddingNet("small_cnn", 16, "l2", in_channels=1, image_size=config.image_size).eval()
    assert net(torch.randn(2, 1, 16, 16)).shape == (2, 16)


@pytest.mark.parametrize("size", [8, 15])
def test_small_cnn_below_16_px_is_refused_by_the_config(size):
    # 15 -> 7 -> 3 -> 1 -> 0: the last pooling would leave no pixel
    with pytest.raises(ConfigError, match=rf"image_size={size}\b.*backbone=small_cnn"):
        TrainConfig.from_dict({"backbone": "small_cnn", "image_size": size, "dataset": "synthetic"})
    assert TrainConfig.from_dict({"backbone": "resnet18", "image_size": size}).image_size == size


@pytest.mark.parametrize("channels", [1, 3])
def test_resnet18_embedding_shape(channels):
    torch.manual_seed(5)
    net = EmbeddingNet("resnet18", 16, "l2", in_channels=channels, image_size=64, pretrained="none").eval()
    with torch.no_grad():
        out = net(torch.randn(2, channels, 64, 64))
    assert out.shape == (2, 16)


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_every_registered_normalization_is_a_config_choice(name):
    assert TrainConfig.from_dict({"normalization": name}).normalization == name
    net = EmbeddingNet("small_cnn", 8, name, in_channels=1, image_size=16).eval()
    assert net(torch.randn(2, 1, 16, 16)).shape == (2, 8)


def test_backbone_registry_is_the_config_choices():
    for name in BACKBONES:
        assert TrainConfig.from_dict({"backbone": name}).backbone == name
    with pytest.raises(ConfigError, match="backbone='vgg16'.*one of small_cnn, resnet18, resnet50, googlenet"):
        TrainConfig.from_dict({"backbone": "vgg16"})


@pytest.mark.parametrize("name", [n for n in sorted(BACKBONES) if n != "small_cnn"])
def test_imagenet_weights_are_loaded_into_every_torchvision_backbone(name, monkeypatch):
    """pretrained=imagenet with the download replaced by a seeded state dict of the full classifier."""
    torch.manual_seed(7)
    extra = {"aux_logits": True, "init_weights": False} if name == "googlenet" else {}
    published = torchvision.models.get_model(name, weights=None, **extra).state_dict()
    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", lambda self, *a, **k: published)
    net = EmbeddingNet(name, 16, "l2", in_channels=1, image_size=64, pretrained="imagenet").eval()
    loaded = net.backbone.net.state_dict()
    assert loaded and all(torch.equal(value, published[key]) for key, value in loaded.items())
    assert not any(key.startswith(("fc.", "aux")) for key in loaded)
    with torch.no_grad():
        assert net(torch.randn(2, 1, 64, 64)).shape == (2, 16)  # grayscale repeated to 3 channels


# -- local weights files ---------------------------------------------------------------------


def test_local_weights_file_is_loaded(tmp_path):
    torch.manual_seed(6)
    reference = torchvision.models.resnet18(weights=None)
    state = reference.state_dict()
    path = tmp_path / "resnet18.pt"
    torch.save(state, path)
    net = EmbeddingNet("resnet18", 16, "l2", in_channels=3, image_size=64, pretrained=str(path))
    loaded = net.backbone.net.state_dict()
    assert set(loaded) == {k for k in state if not k.startswith("fc.")}
    for key, value in loaded.items():
        assert torch.equal(value, state[key]), key
    # a fresh random init differs, so the equality above is not a coincidence
    other = EmbeddingNet("resnet18", 16, "l2", in_channels=3, image_size=64, pretrained="none")
    assert not torch.equal(other.backbone.net.state_dict()["conv1.weight"], state["conv1.weight"])


def test_weights_of_another_backbone_raise(tmp_path):
    path = tmp_path / "small_cnn.pt"
    torch.save(SmallCNN(in_channels=3).state_dict(), path)
    with pytest.raises(WeightsError, match="small_cnn.pt"):
        EmbeddingNet("resnet18", 16, "l2", in_channels=3, image_size=64, pretrained=str(path))


def test_truncated_weights_file_raises(tmp_path):
    good = tmp_path / "good.pt"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), good)
    data = good.read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="truncated.pt"):
        EmbeddingNet("resnet18", 16, "l2", in_channels=3, image_size=64, pretrained=str(bad))


def test_missing_weights_file_raises(tmp_path):
    with pytest.raises(WeightsError, match="nowhere.pt"):
        EmbeddingNet("small_cnn", 16, "l2", in_channels=1, image_size=32, pretrained=str(tmp_path / "nowhere.pt"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_code_executing_pickle_is_refused(tmp_path, writer):
    pwned = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    write_malicious_pickle(path, pwned, writer, key="conv1.weight")
    assert not pwned.exists()
    with pytest.raises(WeightsError, match="evil.pt"):
        EmbeddingNet("resnet18", 16, "l2", in_channels=3, image_size=64, pretrained=str(path))
    assert not pwned.exists()

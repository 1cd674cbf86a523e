"""Backbones, the embedding head and feature normalization.

``EmbeddingNet`` = backbone -> embedding reduction -> feature normalization.
The reduction (config ``embedding_reduction``, :data:`config.REDUCTION_CHOICES`) is one of the
three of 001_df21db8a9bc1b516, sec. 3.1 and Fig. 3: ``fc`` (FCR1, Fig. 3b: a
trained linear layer), ``fc_dropout`` (FCR2, Fig. 3c: the linear layer followed
by dropout) or ``pca`` (Fig. 3a: the network trains on the pool features, and
a PCA fitted on the training images' pool features reduces them to
``embedding_dim`` at evaluation, before the normalization). Feature normalization follows
000_4178e6910e81cd2f sec. 3.3: ``none`` (SM), ``l2`` (LN) or ``bn`` (BN, eq. 7:
batch norm without learned scale, divided by sqrt(d), so features have norm
close to 1).

:data:`BACKBONES` and :data:`NORMALIZATIONS` map the config's ``backbone`` and
``normalization`` values to their builders; their keys are the values
TrainConfig allows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import REDUCTION_CHOICES, SMALL_CNN_WIDTH, ConfigError

log = logging.getLogger(__name__)


class WeightsError(ValueError):
    """A pretrained weights file cannot be used; the message names the file."""


class SmallCNN(nn.Module):
    """Four conv(3x3)-BN-ReLU-maxpool blocks of ``width`` channels (64 by default), for small grayscale images on a CPU
    (each computed as conv-BN-maxpool-ReLU, below).

    (B, in_channels, S, S) -> (B, width * (S // 16) ** 2).

    Each block runs its max-pooling before its ReLU: max-pooling commutes with a non-decreasing function, so
    ``relu(maxpool(y))`` equals ``maxpool(relu(y))`` value for value and passes the same gradients (both route a
    window's gradient to its first maximum, and both give zero where that maximum is <= 0), while the ReLU and its
    backward pass touch a quarter of the elements, and a training step takes less time (docs/findings.md, engineering
    decisions). The layers keep their indices (ReLU and pooling hold no parameters), so state dicts of either order
    load into the other.
    """

    def __init__(self, in_channels: int = 1, width: int = SMALL_CNN_WIDTH, image_size: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for _ in range(4):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.MaxPool2d(2), nn.ReLU(inplace=True)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.out_dim = width * max(1, image_size // 16) ** 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).flatten(1)


class BackboneNet(NamedTuple):
    """What a backbone builder returns: the net (B, net_channels, S, S) -> (B, out_dim)."""

    net: nn.Module
    out_dim: int
    net_channels: int


def _small_cnn(in_channels: int, image_size: int, imagenet: bool, width: int = SMALL_CNN_WIDTH) -> BackboneNet:
    net = SmallCNN(in_channels, width=width, image_size=image_size)
    return BackboneNet(net, net.out_dim, in_channels)


def _torchvision(name: str, weights: str, in_channels: int, image_size: int, imagenet: bool, **kwargs: Any) -> BackboneNet:
    """torchvision's ImageNet classifier ``name`` without its last layer; ``weights`` when ``imagenet``."""
    from torchvision.models import get_model

    net = get_model(name, weights=weights if imagenet else None, **kwargs)
    out_dim = net.fc.in_features
    net.fc = nn.Identity()
    return BackboneNet(net, out_dim, 3)


def _googlenet(in_channels: int, image_size: int, imagenet: bool) -> BackboneNet:
    # Pretrained GoogLeNet expects ImageNet-normalized input already: no transform_input. With
    # weights, torchvision itself drops the auxiliary heads and refuses aux_logits or init_weights.
    kwargs = {} if imagenet else {"aux_logits": False, "init_weights": True}
    return _torchvision("googlenet", "IMAGENET1K_V1", in_channels, image_size, imagenet, transform_input=False, **kwargs)


# config.backbone -> builder (in_channels, image_size, imagenet) -> BackboneNet; small_cnn's also takes its width
BACKBONES: dict[str, Callable[..., BackboneNet]] = {
    "small_cnn": _small_cnn,
    "resnet18": partial(_torchvision, "resnet18", "IMAGENET1K_V1"),
    "resnet50": partial(_torchvision, "resnet50", "IMAGENET1K_V2"),
    "googlenet": _googlenet,
}


class Backbone(nn.Module):
    """A feature extractor; grayscale input is repeated to 3 channels for ImageNet backbones."""

    def __init__(self, name: str, in_channels: int, image_size: int, pretrained: str, width: int = SMALL_CNN_WIDTH) -> None:
        super().__init__()
        self.name = name
        options = {"width": width} if name == "small_cnn" else {}
        self.net, self.out_dim, net_channels = BACKBONES[name](in_channels, image_size, pretrained == "imagenet", **options)
        self.expand = net_channels != in_channels
        if pretrained not in ("none", "imagenet"):
            load_weights(self.net, pretrained, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.expand:
            x = x.expand(-1, 3, -1, -1)
        return self.net(x)


def load_weights(net: nn.Module, path: str, backbone: str) -> None:
    """Load a plain state dict (optionally under 'state_dict' or 'model') into ``net`` strictly."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise WeightsError(f"{file}: pretrained weights file not found (config key 'pretrained')")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for corrupt or unsafe files
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightsError(f"{file}: not a loadable plain state dict ({first[:200]})") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{file}: expected a state dict of tensors for backbone {backbone!r}")
    state = {k.removeprefix("module.").removeprefix("net."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    result = net.load_state_dict(state, strict=False)
    own = net.state_dict()
    wrong = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if result.missing_keys or result.unexpected_keys or wrong:
        detail = (
            (wrong and f"shape mismatch at {wrong[0]}")
            or (result.missing_keys and f"missing {result.missing_keys[0]}")
            or f"unexpected {result.unexpected_keys[0]}"
        )
        raise WeightsError(f"{file}: does not fit backbone {backbone!r} ({detail})")


class BNNormalize(nn.Module):
    """Eq. 7 of 000_4178e6910e81cd2f: f_BN = BN(f) / sqrt(d), batch norm without learned scale.

    Keeps the learned shift (as TF-slim's batch norm with scale=False does).
    (B, d) -> (B, d) with norms close to 1.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, affine=False)
        self.bias = nn.Parameter(torch.zeros(dim))
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.bn(x) + self.bias) * self.scale


class L2Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


# config.normalization -> builder (embedding_dim) -> module (B, d) -> (B, d)
NORMALIZATIONS: dict[str, Callable[[int], nn.Module]] = {
    "none": lambda dim: nn.Identity(),
    "l2": lambda dim: L2Normalize(),
    "bn": BNNormalize,
}


class PCAReduction(nn.Module):
    """PCA of 001_df21db8a9bc1b516 (sec. 3.1, Fig. 3a): (B, in_dim) -> (B, out_dim), y = (x - mean) @ components.T.

    :meth:`fit` takes the pool features of the training images; the fitted
    ``mean`` (in_dim,), ``components`` (out_dim, in_dim) (orthonormal rows, in
    order of decreasing variance) and ``explained_variance`` (out_dim,) are
    buffers, so the model's state dict (checkpoint, logged model) carries them.
    Not whitened, as scikit-learn's PCA by default. Each component's sign makes
    its entry of largest magnitude positive, so refits of the same data agree.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        if not 1 <= out_dim <= in_dim:
            raise ValueError(f"PCA to {out_dim} dimensions of {in_dim}-dimensional features; expected 1 <= out_dim <= {in_dim}")
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("components", torch.zeros(out_dim, in_dim))
        self.register_buffer("explained_variance", torch.zeros(out_dim))
        self.register_buffer("fitted", torch.tensor(False))

    @property
    def is_fitted(self) -> bool:
        return bool(self.fitted)

    @torch.no_grad()
    def fit(self, features: torch.Tensor) -> PCAReduction:
        """Fit on features (N, in_dim), N > out_dim; computed in float64 by SVD of the centered features."""
        out_dim, in_dim = self.components.shape
        if features.ndim != 2 or features.shape[1] != in_dim or features.shape[0] <= out_dim:
            raise ValueError(f"PCA fit needs features (N, {in_dim}) with N > {out_dim}; got {tuple(features.shape)}")
        x = features.detach().to(torch.float64)
        mean = x.mean(0)
        _, singular, vt = torch.linalg.svd(x - mean, full_matrices=False)
        vt = vt[:out_dim]
        signs = torch.sign(vt.gather(1, vt.abs().argmax(1, keepdim=True)))
        self.mean.copy_(mean)
        self.components.copy_(vt * signs)
        self.explained_variance.copy_(singular[:out_dim] ** 2 / (len(x) - 1))
        self.fitted.fill_(True)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.is_fitted:
            raise RuntimeError("embedding_reduction=pca: the PCA is not fitted yet (engine.fit_reduction fits it on the training images)")
        with torch.autocast(x.device.type, enabled=False):  # float32 even under bf16 autocast
            return (x.float() - self.mean.float()) @ self.components.float().T


class EmbeddingNet(nn.Module):
    """images (B, C, S, S) -> features (B, embedding_dim), normalized as configured.

    With ``reduction="pca"`` the train-mode output is the normalized pool
    features (B, ``train_dim`` = backbone.out_dim), on which the loss trains;
    the eval-mode output is the normalized PCA of the pool features (B,
    embedding_dim), which needs ``pca.fit`` first. For ``fc`` and
    ``fc_dropout`` both are (B, embedding_dim).
    """

    def __init__(
        self,
        backbone: str,
        embedding_dim: int,
        normalization: str,
        *,
        in_channels: int = 3,
        image_size: int = 224,
        pretrained: str = "none",
        dropout: float = 0.0,
        reduction: str = "fc",
        backbone_width: int = SMALL_CNN_WIDTH,
    ) -> None:
        super().__init__()
        if reduction not in REDUCTION_CHOICES:
            raise ValueError(f"reduction={reduction!r}; expected one of {', '.join(REDUCTION_CHOICES)}")
        self.backbone = Backbone(backbone, in_channels, image_size, pretrained, backbone_width)
        self.reduction = reduction
        self.pca: PCAReduction | None = None
        if reduction == "pca":
            if embedding_dim > self.backbone.out_dim:
                raise ConfigError(
                    f"embedding_dim={embedding_dim} with embedding_reduction=pca: PCA cannot add dimensions to the "
                    f"{self.backbone.out_dim} pool features of {backbone!r}; expected embedding_dim <= {self.backbone.out_dim}"
                )
            self.embed: nn.Module = nn.Identity()
            self.pca = PCAReduction(self.backbone.out_dim, embedding_dim)
            self.train_dim = self.backbone.out_dim
        else:
            self.embed = nn.Linear(self.backbone.out_dim, embedding_dim)
            self.train_dim = embedding_dim
        # FCR2 (Fig. 3c): dropout after the FC reduction layer
        self.dropout = nn.Dropout(dropout) if reduction == "fc_dropout" and dropout > 0 else nn.Identity()
        # l2 and none do not depend on the dimension; bn (refused with pca by TrainConfig) would
        self.normalize = NORMALIZATIONS[normalization](self.train_dim)

    def new_layers(self) -> list[nn.Module]:
        """Layers the backbone did not have (they get lr x new_layer_lr_mult)."""
        return [self.embed, self.normalize]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.backbone(x)
        if self.pca is not None and not self.training:
            return self.normalize(self.pca(features))
        return self.normalize(self.dropout(self.embed(features)))

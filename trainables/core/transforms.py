"""Images as tensors: the training jitter and evaluation resize of ``data.ImageSet`` s, and batches for serving.

Kept apart from ``data`` so that reading and checking a dataset (a study's driver does) needs no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from .data import IMAGENET_MEAN, IMAGENET_STD, ImageSet


def normalization_stats(kind: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel that images of ``kind`` are normalized with: 0.5 for the one channel of characters
    (ink in [0, 1] to [-1, 1]), ImageNet's for photos (the pretrained backbones' inputs)."""
    return ((0.5,), (0.5,)) if kind == "characters" else (IMAGENET_MEAN, IMAGENET_STD)


def to_tensor(array: np.ndarray, kind: str) -> torch.Tensor:
    """uint8 image (H, W) or (H, W, C) -> float tensor (C, H, W) in [0, 1]; characters inverted (ink = 1)."""
    if kind == "characters":
        if array.ndim == 3:
            array = np.asarray(Image.fromarray(array[..., :3] if array.shape[-1] >= 3 else array[..., 0]).convert("L"))
        return torch.from_numpy(255 - np.ascontiguousarray(array)).float().div_(255).unsqueeze(0)
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    elif array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    elif array.shape[-1] == 4:
        array = array[..., :3]
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1).float().div_(255)


def train_transform(kind: str, image_size: int, strength: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """The random jitter of training images at ``strength`` (config key ``augment``; 0: none, 1: standard).

    Characters: an affine jitter whose ranges grow with the strength (rotation
    10 s degrees, shift 8 s % of the size, scale 1 +- 0.1 s, shear 5 s degrees).
    Photos: a random resized crop of at least max(0.08, 1 - 0.92 s) of the image's
    area (0.08 at s = 1, the papers' standard, which larger s keeps) and a
    horizontal flip. At strength 0 the training images are prepared as
    :func:`eval_transform` prepares evaluation images.
    """
    if strength == 0:
        return eval_transform(kind, image_size)
    mean, std = normalization_stats(kind)
    if kind == "characters":
        jitter = v2.RandomAffine(
            degrees=10 * strength, translate=(0.08 * strength,) * 2, scale=(1 - 0.1 * strength, 1 + 0.1 * strength), shear=5 * strength
        )
        steps = [v2.Resize((image_size, image_size), antialias=True), jitter]
    else:
        smallest = max(0.08, 1 - 0.92 * strength)
        steps = [v2.RandomResizedCrop(image_size, scale=(smallest, 1.0), antialias=True), v2.RandomHorizontalFlip()]
    return v2.Compose([*steps, v2.Normalize(mean, std)])


def eval_transform(kind: str, image_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Resize (+ centre crop for photos, from 256/224 of the size as in the papers)."""
    mean, std = normalization_stats(kind)
    if kind == "characters":
        steps = [v2.Resize((image_size, image_size), antialias=True)]
    else:
        steps = [v2.Resize(int(round(image_size * 256 / 224)), antialias=True), v2.CenterCrop(image_size)]
    return v2.Compose([*steps, v2.Normalize(mean, std)])


def preprocess_batch(images: np.ndarray | Sequence[np.ndarray], kind: str, image_size: int) -> torch.Tensor:
    """uint8 images (N, H, W) or (N, H, W, C), or a list of uint8 (H, W) / (H, W, C) images, of any size -> (N, C, S, S).

    Gray, RGB and RGBA inputs all fit: :func:`to_tensor` converts them to the
    model's channels. :func:`as_uint8_images` brings other input to this form.
    """
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(f"expected a uint8 array of shape (N, H, W) or (N, H, W, C), got {images.dtype} {images.shape}")
    else:
        for i, image in enumerate(images):
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim not in (2, 3):
                got = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
                raise ValueError(f"image {i}: expected a uint8 array of shape (H, W) or (H, W, C), got {got}")
    transform = eval_transform(kind, image_size)
    return torch.stack([transform(to_tensor(image, kind)) for image in images])


class TorchImages(torch.utils.data.Dataset):
    """An ImageSet as a torch Dataset of (image (C, S, S), label index) pairs.

    ``label_index`` maps dataset class ids to 0..num_classes-1 for the classifier.
    """

    def __init__(self, images: ImageSet, transform: Callable, label_index: dict[int, int] | None = None):
        self.images, self.transform = images, transform
        self.label_index = label_index

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        label = int(self.images.labels[i])
        if self.label_index is not None:
            label = self.label_index[label]
        return self.transform(to_tensor(self.images.load(i), self.images.kind)), label

"""Images as tensors: the training jitter and evaluation resize of ``data.ImageSet`` s, and batches for serving.

Kept apart from ``data`` so that reading and checking a dataset (a study's driver does) needs no torch. Torchvision
is imported by the image-by-image transforms only (:func:`train_transform`, :func:`eval_transform`): the batch-wise
paths (characters, the decoded cache) never load it (its models and ops: a worker starts sooner without them, though
not by much: the ``torch._dynamo`` torchvision's ops import is loaded by torch's optimizers anyway; docs/performance.md,
measurements behind the code)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.nn import functional as nn_functional

from .data import IMAGENET_MEAN, IMAGENET_STD, ImageSet, source_size


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


@dataclass(frozen=True)
class Jitter:
    """The ranges of the characters' affine jitter: rotation in +-``degrees``, shift in +-``shift`` of the size (whole
    pixels), scale in 1 +- ``scale``, shear along x in +-``shear`` degrees."""

    degrees: float
    shift: float
    scale: float
    shear: float


def character_jitter(strength: float) -> Jitter:
    """The jitter of characters at ``strength`` (config key ``augment``): ranges that grow with it, 10, 8 %, 0.1 and
    5 degrees at 1. The one place both training paths (:func:`train_transform`, :class:`CharacterImages`) read."""
    return Jitter(degrees=10 * strength, shift=0.08 * strength, scale=0.1 * strength, shear=5 * strength)


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
    from torchvision.transforms import v2  # here, not at import: a trial training batch-wise never loads torchvision

    mean, std = normalization_stats(kind)
    if kind == "characters":
        j = character_jitter(strength)
        jitter = v2.RandomAffine(degrees=j.degrees, translate=(j.shift,) * 2, scale=(1 - j.scale, 1 + j.scale), shear=j.shear)
        steps = [v2.Resize((image_size, image_size), antialias=True), jitter]
    else:
        steps = [v2.RandomResizedCrop(image_size, scale=(crop_area(strength), 1.0), antialias=True), v2.RandomHorizontalFlip()]
    return v2.Compose([*steps, v2.Normalize(mean, std)])


def eval_transform(kind: str, image_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Resize (+ centre crop for photos, from 256/224 of the size as in the papers)."""
    from torchvision.transforms import v2  # as in train_transform

    mean, std = normalization_stats(kind)
    if kind == "characters":
        steps = [v2.Resize((image_size, image_size), antialias=True)]
    else:
        steps = [v2.Resize(source_size(image_size), antialias=True), v2.CenterCrop(image_size)]
    return v2.Compose([*steps, v2.Normalize(mean, std)])


def preprocess_batch(images: np.ndarray | Sequence[np.ndarray], kind: str, image_size: int) -> torch.Tensor:
    """uint8 images (N, H, W) or (N, H, W, C), or a list of uint8 (H, W) / (H, W, C) images, of any size -> (N, C, S, S).

    Gray, RGB and RGBA inputs all fit: :func:`to_tensor` converts them to the
    model's channels. :func:`study.final.images.as_uint8_images` brings other input to this form.
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


# ----------------------------------------------------------------------------- batch-wise, from the decoded cache
RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect ratios, the papers' standard
TRIES = 10  # torchvision's attempts at a crop inside the image before its central fallback


def crop_area(strength: float) -> float:
    """The smallest share of an image's area a training crop of ``strength`` keeps (:func:`train_transform`)."""
    return max(0.08, 1 - 0.92 * strength)


def random_crop_boxes(shapes: torch.Tensor, strength: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random resized crops of images of original (height, width) ``shapes`` (B, 2) -> boxes (B, 4) x0, y0, x1, y1 in pixels.

    torchvision's ``RandomResizedCrop.get_params`` for a batch: up to 10 draws of an area share in
    [crop_area(strength), 1] and a log-uniform aspect ratio in [3/4, 4/3]; the first that fits the image wins,
    else the central crop of the image clamped to those ratios.
    """
    shapes = shapes.to(torch.float64)
    height, width = shapes[:, :1], shapes[:, 1:]
    b = len(shapes)
    uniform = torch.rand(b, TRIES, 4, generator=generator, dtype=torch.float64)
    low = crop_area(strength)
    area = height * width * (low + (1 - low) * uniform[..., 0])
    log_low, log_high = math.log(RATIO[0]), math.log(RATIO[1])
    aspect = torch.exp(log_low + (log_high - log_low) * uniform[..., 1])
    w = torch.round(torch.sqrt(area * aspect))
    h = torch.round(torch.sqrt(area / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    w, h = w.gather(1, first), h.gather(1, first)
    # torch.randint(0, n + 1) as torchvision draws it: floor(u * (n + 1))
    y0 = torch.floor(uniform[..., 2].gather(1, first) * (height - h + 1))
    x0 = torch.floor(uniform[..., 3].gather(1, first) * (width - w + 1))
    ratio = width / height
    fallback_w = torch.where(ratio > RATIO[1], torch.round(height * RATIO[1]), width)
    fallback_h = torch.where(ratio < RATIO[0], torch.round(width / RATIO[0]), height)
    fallback = ~fits.any(dim=1, keepdim=True)
    w, h = torch.where(fallback, fallback_w, w), torch.where(fallback, fallback_h, h)
    x0 = torch.where(fallback, torch.div(width - w, 2, rounding_mode="floor"), x0)
    y0 = torch.where(fallback, torch.div(height - h, 2, rounding_mode="floor"), y0)
    return torch.cat([x0, y0, x0 + w, y0 + h], dim=1)


def center_crop_boxes(shapes: torch.Tensor, image_size: int) -> torch.Tensor:
    """:func:`eval_transform`'s crop of images of original (height, width) ``shapes`` (B, 2) -> boxes (B, 4) in pixels:
    the shorter side resized to source_size(S), then the central S x S, is the central square of side
    shorter x S / source_size(S)."""
    shapes = shapes.to(torch.float64)
    side = shapes.min(dim=1, keepdim=True).values * image_size / source_size(image_size)
    y0, x0 = (shapes[:, :1] - side) / 2, (shapes[:, 1:] - side) / 2
    return torch.cat([x0, y0, x0 + side, y0 + side], dim=1)


def crop_resize(pixels: torch.Tensor, shapes: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, image_size: int) -> torch.Tensor:
    """Crop ``boxes`` (B, 4, in original pixels) out of squashed images ``pixels`` (B, R, R, 3) uint8, resize each to
    S x S and flip where ``flips`` (B,) bool -> uint8 (B, 3, S, S), channels last in memory.

    The squashed image spans the original's extent, so a box in original pixels is scaled to R / width and
    R / height and rounded to whole pixels, as torchvision crops. The resize is torch's bilinear, antialiased
    interpolation of uint8 channels-last images (the kernel torchvision's resize of uint8 tensors uses), one
    image at a time since every crop has its own size; a flip is taken as the resized image is copied into the
    batch (one pass, not a second pass over the flipped half). Boxes and the batch's gather are batch-wise.
    """
    rows, cols = pixels.shape[1:3]
    scale = torch.stack([cols / shapes[:, 1], rows / shapes[:, 0]], dim=1).to(torch.float64).repeat(1, 2)
    x0, y0, x1, y1 = torch.round(boxes * scale).to(torch.int64).unbind(1)
    x0, y0 = x0.clamp(0, cols - 1), y0.clamp(0, rows - 1)
    x1, y1 = torch.maximum(x1.clamp(max=cols), x0 + 1), torch.maximum(y1.clamp(max=rows), y0 + 1)
    images = pixels.permute(0, 3, 1, 2)  # (B, 3, R, R), channels last in memory
    out = torch.empty(len(boxes), 3, image_size, image_size, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    size = (image_size, image_size)
    for i, (a, b, c, d, flip) in enumerate(zip(x0.tolist(), y0.tolist(), x1.tolist(), y1.tolist(), flips.tolist())):
        resized = nn_functional.interpolate(images[i : i + 1, :, b:d, a:c], size, mode="bilinear", antialias=True)
        out[i : i + 1] = resized.flip(-1) if flip else resized
    return out


def keep_batch(batch):
    """The DataLoader's collate_fn for :class:`CachedImages`: its ``__getitems__`` returns whole batches."""
    return batch


def normalize_batch(images: torch.Tensor, kind: str) -> torch.Tensor:
    """A loader's batch (B, C, S, S) as the model's input: uint8 (the decoded cache's, :class:`CachedImages`)
    converted to float and normalized with ``kind``'s statistics on its own device, in the same operations as
    the loader used to (the same values on the CPU); float batches (the PIL path's) are normalized already."""
    if images.dtype != torch.uint8:
        return images
    scale, shift = _normalizer(kind, images.device)
    return images.float().mul_(scale).sub_(shift)


@functools.lru_cache(maxsize=8)
def _normalizer(kind: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 / (255 std), mean / std), each (1, C, 1, 1) on ``device``: x / 255 normalized is x scale - shift."""
    mean, std = (torch.tensor(v, dtype=torch.float32) for v in normalization_stats(kind))
    return (1 / (255 * std)).view(1, -1, 1, 1).to(device), (mean / std).view(1, -1, 1, 1).to(device)


class BatchImages(torch.utils.data.Dataset):
    """A Dataset read a batch at a time (``__getitems__``, the DataLoader's batch fetch): ``labels`` (N,) int64, the
    classifier's label indices of ``images`` (its class ids without ``label_index``)."""

    def __init__(self, images: ImageSet, label_index: dict[int, int] | None = None):
        labels = images.labels if label_index is None else np.array([label_index[int(c)] for c in images.labels])
        self.labels = torch.as_tensor(labels, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([i])
        return images[0], int(labels[0])


class CachedImages(BatchImages):
    """An ImageSet with a decoded cache (``ImageSet.decoded``) as a torch Dataset fetched a batch at a time.

    ``__getitems__(indices)`` -> (images (B, 3, S, S) uint8 channels last, labels (B,) int64): the batch's rows
    are read from the memory map at once, cropped, resized and flipped in uint8 (:func:`crop_resize`), with
    the crops of :func:`train_transform` (``strength`` > 0) or :func:`eval_transform` (``strength`` None or 0).
    The batch stays uint8 to the device, 4x fewer bytes to pin and copy than float; :func:`normalize_batch`
    makes it the model's input there. Use it with ``collate_fn=keep_batch``. Randomness comes from torch's
    generator, which the DataLoader seeds per worker, as for the PIL path.
    """

    def __init__(self, images: ImageSet, image_size: int, strength: float | None = None, label_index: dict[int, int] | None = None):
        if images.decoded is None:
            raise ValueError("CachedImages needs an ImageSet with a decoded cache (cache.attach_cache)")
        super().__init__(images, label_index)
        self.images, self.image_size, self.strength = images, image_size, strength or 0.0

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = np.asarray(indices, dtype=np.int64)
        decoded = self.images.decoded
        rows = decoded.rows[index]
        pixels = torch.from_numpy(decoded.pixels[rows])  # one gather from the memory map
        shapes = torch.from_numpy(decoded.shapes[rows])
        if self.strength > 0:
            boxes = random_crop_boxes(shapes, self.strength)
            flips = torch.rand(len(index)) < 0.5
        else:
            boxes, flips = center_crop_boxes(shapes, self.image_size), torch.zeros(len(index), dtype=torch.bool)
        return crop_resize(pixels, shapes, boxes, flips, self.image_size), self.labels[index]


# ----------------------------------------------------------------------------- batch-wise, characters in memory
def draw_jitter(b: int, jitter: Jitter, size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(b, 5) float64 draws of torchvision's ``RandomAffine`` with ``jitter``'s ranges for images of ``size`` x ``size``,
    one row per image: angle (degrees), tx, ty (whole pixels: a uniform shift rounded, as torchvision rounds it),
    scale, shear along x (degrees). The shear along y is 0, as for a single shear value."""
    u = torch.rand(b, 5, generator=generator, dtype=torch.float64) * 2 - 1  # uniform in [-1, 1)
    max_shift = jitter.shift * size
    return torch.stack(
        [u[:, 0] * jitter.degrees, torch.round(u[:, 1] * max_shift), torch.round(u[:, 2] * max_shift), 1 + u[:, 3] * jitter.scale,
         u[:, 4] * jitter.shear], dim=1,
    )  # fmt: skip


def inverse_affine(params: torch.Tensor) -> torch.Tensor:
    """(B, 5) angle, tx, ty, scale, shear_x rows (:func:`draw_jitter`) -> (B, 2, 3) float64 maps from an output pixel
    to the input pixel it samples, in pixel units about the image's centre (x right, y down).

    The forward map is T(t) R(angle) S(scale) Sh_x(shear): a point p goes to t + scale R Sh p, where
    R = [[cos, -sin], [sin, cos]] (a positive angle turns clockwise on screen, y pointing down) and
    Sh_x = [[1, -tan(shear)], [0, 1]] (torchvision's convention: ``affine``'s matrix with the y shear 0). Its inverse
    sends q to (R Sh)^-1 (q - t) / scale; det(R Sh) = 1, so (R Sh)^-1 = [[d, -b], [-c, a]] for
    R Sh = [[a, b], [c, d]]."""
    angle, tx, ty, scale, shear = (torch.deg2rad(params[:, 0]), params[:, 1], params[:, 2], params[:, 3], torch.deg2rad(params[:, 4]))
    a, c, tan = torch.cos(angle), torch.sin(angle), torch.tan(shear)
    b, d = -(a * tan + c), a - c * tan
    m00, m01, m10, m11 = d / scale, -b / scale, -c / scale, a / scale
    return torch.stack([torch.stack([m00, m01, -(m00 * tx + m01 * ty)], 1), torch.stack([m10, m11, -(m10 * tx + m11 * ty)], 1)], dim=1)


def affine_batch(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """float images (B, C, S, S), each moved by its row of ``params`` (:func:`draw_jitter`) -> (B, C, S, S): the
    nearest input pixel, 0 outside the image (``RandomAffine``'s defaults: nearest, fill 0). One ``grid_sample``
    for the batch: each output pixel's centre, in pixels about the image's centre, mapped by :func:`inverse_affine`
    and scaled to grid_sample's [-1, 1] (align_corners False: -1 and 1 are the outer edges of the border pixels)."""
    h, w = images.shape[-2:]
    ys = torch.arange(h, dtype=torch.float64) - (h - 1) / 2
    xs = torch.arange(w, dtype=torch.float64) - (w - 1) / 2
    points = torch.stack([xs.expand(h, w), ys[:, None].expand(h, w), torch.ones(h, w, dtype=torch.float64)], dim=-1)  # (S, S, 3)
    source = torch.einsum("hwk,bjk->bhwj", points, inverse_affine(params))  # (B, S, S, 2) x, y in pixels
    grid = (source / torch.tensor([w / 2, h / 2], dtype=torch.float64)).to(images.dtype)
    return nn_functional.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)


class CharacterImages(BatchImages):
    """Characters decoded in memory (``ImageSet.arrays`` (N, S, S) uint8, at the training size S) as a torch Dataset
    fetched a batch at a time, the characters' counterpart of :class:`CachedImages`.

    ``__getitems__(indices)`` -> (images (B, 1, S, S) float32 normalized, labels (B,) int64): ink inverted to
    [0, 1] (:func:`to_tensor`), the affine jitter of ``strength`` (:func:`character_jitter`; none at None or 0)
    drawn for each image and applied to the whole batch at once (:func:`affine_batch`), then normalized as
    :func:`train_transform` and :func:`eval_transform` do. Image by image, torchvision's transforms took much of a
    small model's epoch on the CPU (docs/findings.md, engineering decisions). Use it with ``collate_fn=keep_batch``;
    randomness comes from torch's generator, which the DataLoader seeds per worker.
    """

    def __init__(self, images: ImageSet, strength: float | None = None, label_index: dict[int, int] | None = None):
        if images.arrays is None or images.kind != "characters" or images.arrays.ndim != 3:
            raise ValueError("CharacterImages needs characters decoded in memory: ImageSet.arrays (N, S, S) uint8")
        super().__init__(images, label_index)
        self.arrays, self.jitter = images.arrays, character_jitter(strength) if strength else None

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = np.asarray(indices, dtype=np.int64)
        ink = torch.from_numpy(255 - self.arrays[index]).unsqueeze(1).float().div_(255)
        if self.jitter is not None:
            ink = affine_batch(ink, draw_jitter(len(index), self.jitter, ink.shape[-1]))
        (mean,), (std,) = normalization_stats("characters")
        return ink.sub_(mean).div_(std), self.labels[index]


def image_dataset(
    images: ImageSet, image_size: int, strength: float | None = None, label_index: dict[int, int] | None = None
) -> tuple[torch.utils.data.Dataset, Callable | None]:
    """(dataset, collate_fn) for a DataLoader over ``images``: training crops of ``strength``, or evaluation ones (None).

    Through the decoded cache (batch-wise, :class:`CachedImages`: uint8 batches) when the set has one; characters in
    memory at the size batch-wise too (:class:`CharacterImages`: float batches); else image by image through PIL and
    torchvision (:class:`TorchImages`, the streaming path: float batches; collate_fn None is the default). Each
    batch becomes the model's input through :func:`normalize_batch`.
    """
    if images.decoded is not None:
        return CachedImages(images, image_size, strength, label_index), keep_batch
    if images.kind == "characters" and images.arrays is not None and images.arrays.shape[1:] == (image_size, image_size):
        return CharacterImages(images, strength, label_index), keep_batch
    transform = eval_transform(images.kind, image_size) if strength is None else train_transform(images.kind, image_size, strength)
    return TorchImages(images, transform, label_index), None

"""The serving input grammar: what the final model's predict accepts as images, brought to uint8 images, or refused
in one line that says what is expected."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

IMAGE_INPUT_RULES = (
    "expected a batch (N, H, W) or (N, H, W, C), one image (H, W) or (H, W, C), or a list of images or PIL images, "
    "channels last with C in 1, 3, 4, and integer or bool values in 0..255 or floats in [0, 1] or [0, 255]"
)


CHANNELS = (1, 3, 4)  # gray, RGB, RGBA


def as_uint8_images(images: Any, channels: int | None = None) -> np.ndarray | list[np.ndarray]:
    """Images in any of the accepted forms -> uint8 images for ``transforms.preprocess_batch``.

    Accepted (``IMAGE_INPUT_RULES``), channels last:

    - an array (N, H, W) or (N, H, W, C) with C in 1, 3, 4 (gray, RGB, RGBA);
      N may be 0 (an empty batch; an empty list too);
    - one image (H, W) or (H, W, C). A 3-D array whose last axis is 1, 3 or 4
      long is one image with channels: (32, 32, 3) is one RGB image, never 32
      images 3 pixels wide; any other 3-D array is a batch (N, H, W), except
      that for a model of ``channels`` = 3 (RGB) an array (3, H, W) or
      (4, H, W) is refused: it reads as one channels-first image as well as 3
      or 4 gray images (the error says how to write either);
    - a list of such images or of PIL images, of any sizes (a nested list of
      numbers, as JSON gives, reads as an array);
    - values: bool (True = 255), integers in 0..255 of any integer type, or
      floats in [0, 1] or [0, 255]: floats whose maximum is at most 1 are
      scaled by 255. The maximum is that of the whole array (of each image in
      a list), so one batch is read on one scale.

    Returns a uint8 array (N, H, W) or (N, H, W, C) for array input, else a
    list of uint8 (H, W) / (H, W, C) images. Raises ValueError naming what was
    given and what is expected.
    """
    if isinstance(images, Image.Image):
        images = [images]
    if isinstance(images, (list, tuple)) and all(isinstance(x, (Image.Image, np.ndarray)) for x in images):
        return [_one_image(x, f"image {i} of the list") for i, x in enumerate(images)]
    array = _numeric(images)
    if array is None:  # ragged nested lists (images of different sizes) or objects: one image per item
        items = images.tolist() if isinstance(images, np.ndarray) else images
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"got {type(images).__name__}; {IMAGE_INPUT_RULES}")
        return [_one_image(x, f"image {i} of the list") for i, x in enumerate(items)]
    what = f"got an array of {array.dtype}, shape {array.shape}"
    if array.ndim == 1 and array.size == 0:
        return []  # an empty batch, as {"inputs": []} gives
    if array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in CHANNELS):
        array = array[None]
    elif array.ndim == 3 and channels == 3 and array.shape[0] in CHANNELS[1:]:
        n, h, w = array.shape
        raise ValueError(
            f"{what}: ambiguous for this RGB model, one channels-first image or {n} gray images; "
            f"pass one image channels last, ({h}, {w}, {n}) (array.transpose(1, 2, 0)), or {n} gray images as ({n}, {h}, {w}, 1)"
        )
    if array.ndim not in (3, 4) or (array.ndim == 4 and array.shape[-1] not in CHANNELS) or 0 in array.shape[1:3]:
        first = " (channels first? expected channels last)" if array.ndim == 4 and array.shape[1] in CHANNELS else ""
        raise ValueError(f"{what}{first}; {IMAGE_INPUT_RULES}")
    _check_pixels(array.shape[1] * array.shape[2], what)
    return _to_uint8(array, what)


def _check_pixels(pixels: int, what: str) -> None:
    """One image may hold at most Pillow's decompression-bomb limit of pixels (a request cannot ask for gigabytes)."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and pixels > limit:
        raise ValueError(f"{what}: {pixels} pixels per image; expected at most {limit}")


def _numeric(values: Any) -> np.ndarray | None:
    """``values`` as a numeric or bool array, or None where they are ragged or not numbers."""
    try:
        array = np.asarray(values.tolist() if isinstance(values, np.ndarray) and values.dtype == object else values)
    except (ValueError, TypeError):
        return None
    return None if array.dtype == object else array


def _one_image(image: Any, where: str) -> np.ndarray:
    """One image (PIL, array or nested list) -> uint8 (H, W) or (H, W, C)."""
    if isinstance(image, Image.Image):
        if image.mode not in ("1", "L", "RGB", "RGBA", "I", "I;16", "F"):  # palette, LA, CMYK, ...
            image = image.convert("RGB")
        image = np.asarray(image)
    array = _numeric(image)
    if array is None:
        raise ValueError(f"{where}: not an array of numbers; {IMAGE_INPUT_RULES}")
    what = f"{where}: an array of {array.dtype}, shape {array.shape}"
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in CHANNELS) or 0 in array.shape[:2]:
        raise ValueError(f"{what}, not one image (H, W) or (H, W, C); {IMAGE_INPUT_RULES}")
    _check_pixels(array.shape[0] * array.shape[1], what)
    return _to_uint8(array, what)


def _to_uint8(array: np.ndarray, what: str) -> np.ndarray:
    """bool, integer or float pixel values -> uint8 0..255, by the rules of :func:`as_uint8_images`."""
    if array.dtype == np.uint8:
        return array
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * np.uint8(255)
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise ValueError(f"{what}: {array.dtype} values; {IMAGE_INPUT_RULES}")
    if array.size == 0:
        return array.astype(np.uint8)
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise ValueError(f"{what}: NaN or infinite values; {IMAGE_INPUT_RULES}")
    low, high = array.min(), array.max()
    if low < 0 or high > 255:
        raise ValueError(f"{what}: values from {low} to {high}; {IMAGE_INPUT_RULES}")
    if np.issubdtype(array.dtype, np.floating):
        return np.rint(array * 255 if high <= 1 else array).astype(np.uint8)
    return array.astype(np.uint8)

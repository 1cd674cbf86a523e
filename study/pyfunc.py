"""The trained embedding model as an MLflow pyfunc model.

``predict`` takes images and returns l2-normalized float32 embeddings (N, d),
after the training run's evaluation preprocessing. It reads images as
:func:`trainables.core.data.as_uint8_images` does: a batch (N, H, W) or
(N, H, W, C), one image (H, W) or (H, W, C) (a 3-D array whose last axis is 1,
3 or 4 long is one image with channels; an RGB model refuses (3, H, W) and
(4, H, W), which read as one channels-first image as well as a batch), or a
list of images; an empty batch gives (0, d); channels last,
C in 1, 3, 4; bool, integer values in 0..255, or floats in [0, 1] or [0, 255]
(floats whose maximum is at most 1 are scaled by 255). RGB and RGBA images
given to a grayscale model become gray (luminance, alpha dropped), gray images
given to an RGB model are replicated. Any size: images are resized as in
evaluation.

Over REST (``mlflow models serve``) the same arrays go as nested JSON lists,
``{"inputs": [[[0, 255, ...], ...]]}`` (or ``{"instances": ...}``); images of
one request may differ in size. A payload that is not images is answered with
HTTP 400 and one line saying what was expected; in-process the same error is a
ValueError. ``dataframe_split`` is not accepted: an image is not a table row.

Through ``mlflow.pyfunc.load_model(uri).predict`` the input must be an array
(MLflow checks that before the model sees it): pass a list of PIL images as
``np.asarray(images)`` when they share a size and mode, or call
``model.unwrap_python_model().predict(None, images)``, which takes any list.
"""

from __future__ import annotations

import logging
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types import Schema, TensorSpec
from PIL import Image

import study
import trainables
from trainables.core.checkpoint import CheckpointError, load_bundle, save_bundle
from trainables.core.config import TrainConfig
from trainables.core.data import ImageSet, as_uint8_images
from trainables.core.engine import build_model
from trainables.core.transforms import preprocess_batch

INPUT_NAME = "images"
# What the model imports; pinned to the installed versions when it is logged.
REQUIREMENTS = ("torch", "torchvision", "numpy", "pillow", "faiss-cpu", "pyyaml", "mlflow")
EXAMPLE_SIZE = 28  # side of the input example's images: real test images, small enough to read in MLmodel's folder


class ImageInputError(MlflowException, ValueError):
    """A payload that is not images: HTTP 400 over REST (INVALID_PARAMETER_VALUE), a ValueError in-process."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


class EmbeddingModel(mlflow.pyfunc.PythonModel):
    """Images -> embeddings, with the preprocessing of the run that trained it."""

    batch_size = 256

    def load_context(self, context) -> None:
        bundle = load_bundle(context.artifacts["bundle"])
        self.config = TrainConfig.from_dict(bundle["config"], source=context.artifacts["bundle"])
        self.kind, self.image_size = bundle["kind"], int(bundle["image_size"])
        config = self.config.replace(pretrained="none")  # the weights below replace any pretrained ones
        self.model = build_model(config, self.kind, self.image_size)
        self.model.load_state_dict(bundle["model"])  # with embedding_reduction=pca, also its fitted PCA (buffers)
        self.model.eval()
        if self.model.pca is not None and not self.model.pca.is_fitted:
            raise CheckpointError(f"{context.artifacts['bundle']}: embedding_reduction=pca, but the model holds no fitted PCA")

    # np.ndarray is the hint MLflow documents as "no validation from type hints": the signature below
    # describes the input, and as_uint8_images checks it. What arrives is {"images": array} from MLflow
    # (the signature names its input), or an array or a list of images when called directly.
    def predict(self, context, model_input: np.ndarray, params: dict[str, Any] | None = None) -> np.ndarray:
        """Images (see the module docstring) -> l2-normalized float32 embeddings (N, d)."""
        if isinstance(model_input, dict) and set(model_input) == {INPUT_NAME}:
            model_input = model_input[INPUT_NAME]
        try:
            images = as_uint8_images(model_input, channels=1 if self.kind == "characters" else 3)
        except ValueError as error:
            raise ImageInputError(str(error)) from None
        out = []
        with torch.no_grad():
            for start in range(0, len(images), self.batch_size):
                batch = preprocess_batch(images[start : start + self.batch_size], self.kind, self.image_size)
                out.append(torch.nn.functional.normalize(self.model(batch).float(), dim=1))
        if not out:
            return np.zeros((0, self.config.embedding_dim), np.float32)
        return torch.cat(out).numpy().astype(np.float32)


def signature(embedding_dim: int) -> ModelSignature:
    """Input: one named tensor of images; output: (N, embedding_dim) float32.

    The input's dtype is ``object`` with shape (-1,) because it is the one
    tensor spec MLflow lets through with any dtype and number of axes (a uint8
    (-1, -1, -1) spec would refuse RGB batches, bools and floats in-process,
    and over REST would cast JSON floats to uint8 by truncation). The input
    example shows the usual form: uint8 (N, H, W).
    """
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(object), (-1,), INPUT_NAME)]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, embedding_dim))]),
    )


def input_example(images: ImageSet, count: int = 2) -> np.ndarray:
    """``count`` images of different classes of ``images``, shrunk to EXAMPLE_SIZE: uint8 (N, S, S) or (N, S, S, 3)."""
    _, first = np.unique(images.labels, return_index=True)
    picked = [images.load(int(i)) for i in np.sort(first)[:count]]
    size = (EXAMPLE_SIZE, EXAMPLE_SIZE)
    return np.stack([np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR)) for image in picked])


def pinned_requirements() -> list[str]:
    """REQUIREMENTS as ``name==version`` of the installed distributions.

    A local version label (``+cu130``) is left out: any build of that version
    serves the model, and the registry has no such label. A distribution that
    is not installed stays unpinned.
    """
    pins = []
    for name in REQUIREMENTS:
        try:
            pins.append(f"{name}=={metadata.version(name).split('+')[0]}")
        except metadata.PackageNotFoundError:
            pins.append(name)
    return pins


def log_embedding_model(bundle: dict[str, Any], example: np.ndarray, workdir: Path, name: str, registered_model_name: str | None = None):
    """Log the model of ``bundle`` (a run's bundle without its training state: config, weights, kind, image size) as
    ``name`` under the active MLflow run, with signature, input example (``input_example``) and pinned requirements.

    Returns MLflow's ModelInfo (``model_id``, ``model_uri``, ``registered_model_version``).
    """
    path = save_bundle(bundle, workdir / f"{name}.pt")
    embedding_dim = TrainConfig.from_dict(bundle["config"], source=name).embedding_dim
    code = [str(Path(trainables.__file__).parent), str(Path(study.__file__).parent)]
    quiet = logging.getLogger("mlflow.pyfunc")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its notice about cloudpickle: the class is importable code shipped in code_paths
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return mlflow.pyfunc.log_model(
                name=name,
                python_model=EmbeddingModel(),
                artifacts={"bundle": str(path)},
                code_paths=code,
                registered_model_name=registered_model_name,
                signature=signature(embedding_dim),
                input_example=example,
                pip_requirements=pinned_requirements(),
            )
    finally:
        quiet.setLevel(level)


def version_description(config: TrainConfig, test: dict[str, float], origin: str, run_id: str) -> str:
    """Markdown for a registered model version: where it came from, its test metrics, its config."""
    import yaml

    metrics = "\n".join(f"| {key.removeprefix('test_')} | {value:.4f} |" for key, value in sorted(test.items()))
    return (
        f"Embedding model from {origin}; trained by study.final (run {run_id}), seed {config.seed}, "
        f"{config.loss} loss on {config.dataset}.\n\n"
        f"Test metrics on the unseen test classes:\n\n| metric | value |\n| --- | --- |\n{metrics}\n\n"
        f"Config:\n\n```yaml\n{yaml.safe_dump(config.to_dict(), sort_keys=False)}```\n"
    )

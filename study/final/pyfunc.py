"""The trained embedding model as an MLflow pyfunc model.

``predict`` takes images and returns l2-normalized float32 embeddings (N, d),
after the training run's evaluation preprocessing. It reads images as
:func:`study.final.images.as_uint8_images` does: a batch (N, H, W) or
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
from study.final.images import as_uint8_images
from trainables.core.checkpoint import CheckpointError, load_bundle, save_bundle
from trainables.core.config import TrainConfig
from trainables.core.data import ImageSet
from trainables.core.engine import Embeddings, build_model, concatenated
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
    """Images -> embeddings, with the preprocessing of the run that trained it.

    An ensemble (``study.final --seeds N``: N seeds of one configuration, or of a study's tied candidates) is one such
    model over N bundles (artifacts ``bundle``, ``bundle1``, ...): each member embeds the images, its embeddings are
    l2-normalized, and the N are set side by side and scaled by 1/sqrt(N), so the result is unit length and its cosine
    similarity is the mean of the members' (as wide as the members' widths together).
    """

    batch_size = 256

    def load_context(self, context) -> None:
        loaded = [self.load_member(context.artifacts[key]) for key in member_keys(context.artifacts)]
        self.members = [(model, image_size) for model, image_size, _ in loaded]
        self.model, self.image_size, self.config = loaded[0]  # the first member's: the single model's, as before ensembles
        self.width = sum(config.embedding_dim for *_, config in loaded)  # members of a study's tie may differ in size

    def load_member(self, path: str) -> tuple[torch.nn.Module, int, TrainConfig]:
        """The model of the bundle at ``path`` in eval mode, the image size it embeds at and its config; ``kind`` is the
        members' (seeds of one configuration, or of a study's tied candidates: one dataset)."""
        bundle = load_bundle(path)
        trained = TrainConfig.from_dict(bundle["config"], source=path)
        config = trained.replace(pretrained="none")  # its weights replace any pretrained ones
        self.kind, image_size = bundle["kind"], int(bundle["image_size"])
        model = build_model(config, self.kind, image_size)
        model.load_state_dict(bundle["model"])  # with embedding_reduction=pca, also its fitted PCA (buffers)
        model.eval()
        if model.pca is not None and not model.pca.is_fitted:
            raise CheckpointError(f"{path}: embedding_reduction=pca, but the model holds no fitted PCA")
        return model, image_size, trained

    # np.ndarray is the hint MLflow documents as "no validation from type hints": the signature below
    # describes the input, and as_uint8_images checks it. What arrives is {"images": array} from MLflow
    # (the signature names its input), or an array or a list of images when called directly.
    def predict(self, context, model_input: np.ndarray, params: dict[str, Any] | None = None) -> np.ndarray:
        """Images (see the module docstring) -> l2-normalized float32 embeddings (N, d), (N, members x d) for an ensemble."""
        if isinstance(model_input, dict) and set(model_input) == {INPUT_NAME}:
            model_input = model_input[INPUT_NAME]
        try:
            images = as_uint8_images(model_input, channels=1 if self.kind == "characters" else 3)
        except ValueError as error:
            raise ImageInputError(str(error)) from None
        out = []
        with torch.no_grad():
            for start in range(0, len(images), self.batch_size):
                chunk = images[start : start + self.batch_size]
                parts = [Embeddings(m(preprocess_batch(chunk, self.kind, size))) for m, size in self.members]
                out.append(concatenated(parts).queries)
        if not out:
            return np.zeros((0, self.width), np.float32)
        return torch.cat(out).numpy().astype(np.float32)


def member_key(index: int) -> str:
    """The artifact key of a model's bundle ``index``: ``bundle`` for the first (a single model's), then ``bundle1``, ..."""
    return f"bundle{index}" if index else "bundle"


def member_keys(artifacts: dict[str, str]) -> list[str]:
    """The artifact keys of a model's bundles, in order, while present."""
    keys = [member_key(0)]
    while member_key(len(keys)) in artifacts:
        keys.append(member_key(len(keys)))
    return keys


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


def log_embedding_model(
    bundle: dict[str, Any] | list[dict[str, Any]], example: np.ndarray, workdir: Path, name: str, registered_model_name: str | None = None
):
    """Log the model of ``bundle`` (a run's bundle without its training state: config, weights, kind, image size), or the
    ensemble of a list of bundles, as ``name`` under the active MLflow run, with signature, input example
    (``input_example``) and pinned requirements.

    Returns MLflow's ModelInfo (``model_id``, ``model_uri``, ``registered_model_version``).
    """
    bundles = bundle if isinstance(bundle, list) else [bundle]
    files = [f"{name}.pt"] + [f"{name}-bundle{i}.pt" for i in range(1, len(bundles))]
    artifacts = {member_key(i): str(save_bundle(b, workdir / file)) for i, (b, file) in enumerate(zip(bundles, files))}
    embedding_dim = sum(TrainConfig.from_dict(b["config"], source=name).embedding_dim for b in bundles)
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
                artifacts=artifacts,
                code_paths=code,
                registered_model_name=registered_model_name,
                signature=signature(embedding_dim),
                input_example=example,
                pip_requirements=pinned_requirements(),
            )
    finally:
        quiet.setLevel(level)


def version_description(
    config: TrainConfig,
    test: dict[str, float],
    origin: str,
    run_id: str,
    seeds: list[int] | None = None,
    tied: list[tuple[int, TrainConfig]] | None = None,
    member_tests: list[dict[str, float]] | None = None,
) -> str:
    """Markdown for a registered model version: where it came from (one seed, the ensemble of ``seeds``, or of a study's
    ``tied`` candidates: (Optuna trial, its config with its seed) each, the pick first), its test metrics, its config(s).

    A tie is described as one: each member named (the pick marked), its own test metrics beside the model's and the
    members' mean (``member_tests``, in ``tied``'s order), and its config with only the keys it trained with."""
    import yaml

    from study.records.trials import config_params

    keys = sorted(test)
    columns = [("value", test)]
    which = f"seed {config.seed}" if not seeds else f"seeds {', '.join(map(str, seeds))} as one model (their embeddings side by side)"
    configs = [("Config", config.to_dict())]
    if tied:
        named = ", ".join(f"Optuna #{trial} ({'the pick, ' if i == 0 else ''}seed {member.seed})" for i, (trial, member) in enumerate(tied))
        which = f"the study's tied candidates {named} as one model (their embeddings side by side)"
        configs = [
            (f"Config of Optuna #{trial}{' (the pick)' if i == 0 else ''}, seed {member.seed}", config_params(member.to_dict())[0])
            for i, (trial, member) in enumerate(tied)
        ]
        if member_tests:
            columns = [("this model", test)]
            for i, ((trial, _), own) in enumerate(zip(tied, member_tests, strict=True)):
                columns.append((f"#{trial} alone{' (the pick)' if i == 0 else ''}", own))
            mean = {k: sum(m[k] for m in member_tests) / len(member_tests) for k in keys if all(k in m for m in member_tests)}
            columns.append(("members' mean", mean))
    header = "| metric | " + " | ".join(title for title, _ in columns) + " |\n|" + " --- |" * (len(columns) + 1)
    rows = "\n".join(
        f"| {k.removeprefix('test_')} | " + " | ".join(f"{c[k]:.4f}" if k in c else "-" for _, c in columns) + " |" for k in keys
    )
    shown = "\n".join(f"{title}:\n\n```yaml\n{yaml.safe_dump(c, sort_keys=False)}```\n" for title, c in configs)
    losses = " and ".join(dict.fromkeys(c["loss"] for _, c in configs))  # a tie may hold both families
    return (
        f"Embedding model from {origin}; trained by study.final (run {run_id}), {which}, "
        f"{losses} loss on {config.dataset}.\n\n"
        f"Test metrics on the unseen test classes:\n\n{header}\n{rows}\n\n{shown}"
    )

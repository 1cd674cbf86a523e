"""The trained embedding model as an MLflow pyfunc model.

``predict`` takes a uint8 array of images, (N, H, W) or (N, H, W, C), of any
size, applies the training run's evaluation preprocessing and returns
l2-normalized float32 embeddings (N, d).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import mlflow
import numpy as np
import torch

import study
import trainables
from trainables.core.checkpoint import load_bundle, save_bundle
from trainables.core.config import TrainConfig
from trainables.core.data import preprocess_batch
from trainables.core.engine import Run, build_model

# Defining a PythonModel subclass makes MLflow warn that predict has no type hints; its input is a plain uint8
# array, validated in preprocess_batch. MLflow resets the warning filters around that check, so the warnings of
# this class definition are caught here (the global filters are left alone) and all but that notice passed on.
with warnings.catch_warnings(record=True) as _caught:

    class EmbeddingModel(mlflow.pyfunc.PythonModel):
        """Images -> embeddings, with the preprocessing of the run that trained it."""

        batch_size = 256

        def load_context(self, context) -> None:
            bundle = load_bundle(context.artifacts["bundle"])
            self.config = TrainConfig.from_dict(bundle["config"], source=context.artifacts["bundle"])
            self.kind, self.image_size = bundle["kind"], int(bundle["image_size"])
            config = self.config.replace(pretrained="none")  # the weights below replace any pretrained ones
            self.model = build_model(config, self.kind, self.image_size)
            self.model.load_state_dict(bundle["model"])
            self.model.eval()

        def predict(self, context, model_input, params=None):  # no type hints: MLflow would infer a list signature
            images = np.asarray(model_input)
            out = []
            with torch.no_grad():
                for start in range(0, len(images), self.batch_size):
                    batch = preprocess_batch(images[start : start + self.batch_size], self.kind, self.image_size)
                    out.append(torch.nn.functional.normalize(self.model(batch).float(), dim=1))
            if not out:
                return np.zeros((0, self.config.embedding_dim), np.float32)
            return torch.cat(out).numpy().astype(np.float32)


for _warning in _caught:
    if "Add type hints to the `predict` method" not in str(_warning.message):
        warnings.warn_explicit(_warning.message, _warning.category, _warning.filename, _warning.lineno)


def log_embedding_model(run: Run, workdir: Path, name: str = "model", registered_model_name: str | None = None):
    """Log ``run``'s model under the active MLflow run; returns MLflow's ModelInfo."""
    bundle = {k: v for k, v in run.bundle().items() if k not in ("optimizer", "rng", "sampler", "loss")}
    path = save_bundle(bundle, workdir / "embedding_model.pt")
    code = [str(Path(trainables.__file__).parent), str(Path(study.__file__).parent)]
    quiet = logging.getLogger("mlflow.pyfunc")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its notice about cloudpickle: the class is importable code shipped in code_paths
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return _log(name, path, code, registered_model_name)
    finally:
        quiet.setLevel(level)


def _log(name: str, path: Path, code: list[str], registered_model_name: str | None):
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=EmbeddingModel(),
        artifacts={"bundle": str(path)},
        code_paths=code,
        registered_model_name=registered_model_name,
        pip_requirements=["torch", "torchvision", "numpy", "pillow", "faiss-cpu", "scikit-learn", "pyyaml", "mlflow"],
    )

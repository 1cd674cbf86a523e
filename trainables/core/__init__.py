"""The training core: pure PyTorch (+ faiss, numpy). Never imports ray, optuna or mlflow."""

from .config import ConfigError, TrainConfig

__all__ = ["ConfigError", "TrainConfig"]

"""TrainConfig: the one validated, frozen training configuration.

One flat dict of JSON scalars with snake_case keys crosses every boundary of the
project (YAML space, Optuna, Tune, MLflow, checkpoint). It becomes a
``TrainConfig`` exactly once, in :meth:`TrainConfig.from_dict`, where every key
and value is checked. Errors are :class:`ConfigError` with one line that names
the key, the value and what is allowed; the range of every numeric key is in :data:`RANGES`, which the search spaces' bounds are
checked against too.

Defaults follow the papers where they speak (000_4178e6910e81cd2f: alpha 16,
heated to 4 with lr x 0.1, embedding 64; 004_44fc264e74e143df: s = 64) and are
otherwise chosen for the small CNN on 32 px characters that runs on a CPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

# The allowed names of what the registries build (losses.LOSSES, models.NORMALIZATIONS, models.BACKBONES,
# optimizers.OPTIMIZERS, data.DATASETS; tests/test_config.py checks each registry's keys against these). They are written
# here, not read from the registries: those modules need torch (data: numpy and PIL), a study's driver checks configs
# without them, and data reads this module.
LOSS_CHOICES = ("softmax", "ice")
NORMALIZATION_CHOICES = ("none", "l2", "bn")
OPTIMIZER_CHOICES = ("sgd", "adam", "adamw")
BACKBONE_CHOICES = ("small_cnn", "resnet18", "resnet50", "googlenet")
DATA_ROOT_ENV = "DML_DATA_ROOT"  # where the datasets are when --data-root is not given
DATASET_CHOICES = ("omniglot", "cub200", "cars196", "sop", "inshop", "folder", "synthetic")
SMALL_CNN_WIDTH = 64  # the channels of small_cnn's conv blocks unless backbone_width says otherwise
REDUCTION_CHOICES = ("fc", "fc_dropout", "pca")  # 001_df21db8a9bc1b516, sec. 3.1 and Fig. 3
HEATING_CHOICES = ("none", "two_stage", "linear", "cosine")
LR_SCHEDULE_CHOICES = ("constant", "step", "linear", "cosine")
VAL_SPLIT_CHOICES = ("classes", "alphabets")
PRECISION_CHOICES = ("fp32", "bf16", "fp16")  # engine.precision_plan: what each means on CUDA and on the CPU
MAX_AUGMENT = 4.0  # characters: rotations up to 40 degrees, shifts up to 32 % of the size
FLOAT32_MAX = 3.4028234663852886e38  # the loss and the optimizer compute in float32: a larger value becomes inf


# the names each categorical key allows, for TrainConfig's check and for the search spaces' conditions
CHOICES = {
    "loss": LOSS_CHOICES,
    "heating": HEATING_CHOICES,
    "lr_schedule": LR_SCHEDULE_CHOICES,
    "val_split": VAL_SPLIT_CHOICES,
    "precision": PRECISION_CHOICES,
    "normalization": NORMALIZATION_CHOICES,
    "optimizer": OPTIMIZER_CHOICES,
    "backbone": BACKBONE_CHOICES,
    "embedding_reduction": REDUCTION_CHOICES,
    "dataset": DATASET_CHOICES,
}


class ConfigError(ValueError):
    """A config key has a value that is not allowed; the message names the key."""


def held_out_classes(classes: int, val_fraction: float) -> int:
    """How many of ``classes`` training classes a validation fold of ``val_fraction`` holds out: round(fraction x N)."""
    return int(round(val_fraction * classes))


@dataclass(frozen=True)
class Range:
    """The values a numeric key accepts: finite numbers from ``low`` to ``high`` (an open end excluded), or ``special``."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # where the bound comes from, for the error message
    special: tuple[int, str] | None = None  # one more value allowed and its meaning (image_size's 0)

    def accepts(self, value: float, bound: bool = False) -> bool:
        """Whether ``value`` is in the range; ``bound``: as an end of a searched range, which ``special`` cannot be."""
        if self.special is not None and value == self.special[0] and not bound:
            return True
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below and math.isfinite(value)  # compared first: isfinite raises for an int beyond float's range

    def describe(self, kind: str, bound: bool = False) -> str:
        """What the error says is expected, e.g. ``an integer in [0, 2147483647] (faiss's k-means seed is a C int)``.

        ``bound``: of the ends of a searched range, which ``special`` cannot be.
        """
        interval = f"{'(' if self.low_open else '['}{_shown(self.low)}, {_shown(self.high)}{')' if self.high_open else ']'}"
        text = f"{'an integer' if kind == 'int' else 'a number'} in {interval}" + (f" ({self.why})" if self.why else "")
        if not self.special:
            return text
        value, meaning = self.special
        return f"{text}; {value} ({meaning}) only as a value of its own" if bound else f"{value} ({meaning}) or {text}"


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else f"{bound:g}"


def _up_to_float32(low: float, low_open: bool) -> Range:
    return Range(low, FLOAT32_MAX, low_open=low_open, why="float32's largest: the loss and the optimizer compute in float32")


# The range of every integer and float key of TrainConfig: the values its consumer accepts. TrainConfig.from_dict and
# the search spaces' bounds (study/search/spaces.py) read them here.
RANGES: dict[str, Range] = {
    "alpha": _up_to_float32(0, low_open=True),
    "heating_target": _up_to_float32(0, low_open=True),
    "heating_start": Range(0, 1, why="a fraction of the budget"),
    "heating_lr_factor": _up_to_float32(0, low_open=True),
    "ice_scale": _up_to_float32(0, low_open=True),
    "classes_per_batch": Range(2, 1024, why="a batch needs negatives; with samples_per_class <= 64, at most 65536 images a batch"),
    "samples_per_class": Range(1, 64, why="with classes_per_batch <= 1024, at most 65536 images a batch"),
    "mean_proxy_weight": _up_to_float32(0, low_open=False),
    "embedding_dim": Range(2, 8192),
    "backbone_width": Range(1, 4096, why="channels of a conv block"),
    "dropout": Range(0, 1, high_open=True, why="a probability"),
    "lr": _up_to_float32(0, low_open=True),
    "lr_decay_start": Range(0, 1, why="a fraction of the budget"),
    "weight_decay": _up_to_float32(0, low_open=False),
    "momentum": Range(0, 1, high_open=True),
    "new_layer_lr_mult": _up_to_float32(0, low_open=False),
    "epochs": Range(1, 100_000),
    "seed": Range(0, 2**31 - 1, why="faiss's k-means seed is a C int"),
    "image_size": Range(8, 1024, special=(0, "the dataset's default")),
    "augment": Range(0, MAX_AUGMENT, why="0: no augmentation, 1: the standard jitter"),
    "val_fraction": Range(0, 1, low_open=True, high_open=True, why="a fraction of the training classes"),
    "val_fold": Range(0, 10_000, why="a fold of the training classes"),
}
# study.final trains a study's pick to final_budget_factor x the trials' epochs (study/search/spaces.py); schedules are
# fractions of the budget, so a far longer budget is no longer the recipe the study scored
FINAL_BUDGET_FACTOR = Range(1, 100, why="the final model's budget / the trials'")


@dataclass(frozen=True)
class TrainConfig:
    # loss family
    loss: str = "softmax"
    # heated-up softmax (000_4178e6910e81cd2f, eq. 1): logits = alpha * <f_hat, w_hat>
    alpha: float = 16.0
    learn_alpha: bool = False
    heating: str = "two_stage"
    heating_target: float = 4.0
    heating_start: float = 0.75  # fraction of the budget (the epochs trained to) before heating starts
    heating_lr_factor: float = 0.1  # lr multiplier after the drop of lr_schedule=step
    # instance cross entropy (004_44fc264e74e143df, eqs. 11-12): similarity scale s
    ice_scale: float = 64.0
    # batches of C classes x k images, for every loss
    classes_per_batch: int = 32
    samples_per_class: int = 4
    # feature and weight normalization (000_4178e6910e81cd2f, sec. 3.3)
    normalization: str = "bn"
    weight_norm: bool = True
    # mean-proxy regularizer weight (002_ad8188f3a39a9075, eq. 3.10); 0 disables it
    mean_proxy_weight: float = 0.0
    # model
    embedding_dim: int = 64
    backbone: str = "small_cnn"
    # channels of each of small_cnn's four conv blocks (models.SmallCNN); the torchvision backbones have their own
    backbone_width: int = SMALL_CNN_WIDTH
    pretrained: str = "none"  # none | imagenet | path to a local weights file
    # embedding reduction (001_df21db8a9bc1b516, sec. 3.1, Fig. 3): fc (FCR1) | fc_dropout (FCR2,
    # dropout rate `dropout` after the FC layer) | pca (PCA of the pool features, fitted after training)
    embedding_reduction: str = "fc"
    dropout: float = 0.0  # the dropout of embedding_reduction=fc_dropout; 0 otherwise
    # optimization
    optimizer: str = "adam"
    lr: float = 1e-3
    # lr factor over the budget (schedule.py): constant | step | linear | cosine, decaying from lr_decay_start
    lr_schedule: str = "step"
    lr_decay_start: float = 0.75  # fraction of the budget before the lr decays (0: linear-to-zero from the start)
    weight_decay: float = 5e-4
    momentum: float = 0.9
    new_layer_lr_mult: float = 1.0
    epochs: int = 40
    seed: int = 0
    # the forward pass's arithmetic (engine.precision_plan): fp32 (none), bf16 (autocast), fp16 (autocast and a
    # gradient scaler, CUDA only). fp32 by default: the CPU results of every earlier study stay as they were
    precision: str = "fp32"
    # data
    dataset: str = "omniglot"
    image_size: int = 0  # 0: the dataset's default (32 for characters, 224 for photos)
    # strength of the training images' random augmentation (transforms.train_transform): 1 is the standard
    # jitter, 0 none, 2 twice the ranges; evaluation images are never augmented
    augment: float = 1.0
    val_fraction: float = 0.2
    # how a study holds validation classes out of the training classes (data.validation_split):
    # classes (a seeded random val_fraction of them) | alphabets (whole alphabets, about val_fraction)
    val_split: str = "classes"
    # which class-disjoint fold of the training classes is held out (data.validation_split): 0, the fold a study
    # scores its trials on; a confirmation re-run holds out another (study.search.race)
    val_fold: int = 0

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> TrainConfig:
        """Validate ``values`` (missing keys take defaults) and freeze them.

        ``source`` names where the values came from (a file, a flag) so that the
        error message points the user at it.
        """
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a mapping of config keys, got {type(values).__name__}")
        allowed = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ConfigError(f"{source}: unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}")
        coerced = {k: _coerce(source, k, v, allowed[k].type) for k, v in values.items()}
        config = cls(**coerced)
        config._check(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    # -- validation -------------------------------------------------------------
    def _check(self, source: str) -> None:
        def bad(key: str, allowed: str) -> ConfigError:
            return ConfigError(f"{source}: {key}={getattr(self, key)!r} is not allowed; expected {allowed}")

        for key, choices in CHOICES.items():
            if getattr(self, key) not in choices:
                raise bad(key, "one of " + ", ".join(choices))
        for key, allowed in RANGES.items():
            if not allowed.accepts(getattr(self, key)):
                raise bad(key, allowed.describe(KINDS[key]))
        if self.embedding_reduction == "fc_dropout" and self.dropout == 0:
            raise bad("dropout", "a probability in (0, 1) with embedding_reduction=fc_dropout (FCR2's dropout layer)")
        if self.embedding_reduction != "fc_dropout" and self.dropout > 0:
            raise ConfigError(
                f"{source}: dropout={self.dropout!r} applies only to the dropout layer of embedding_reduction=fc_dropout "
                f"(FCR2 of 001_df21db8a9bc1b516); expected embedding_reduction: fc_dropout, or dropout: 0 with "
                f"embedding_reduction={self.embedding_reduction}"
            )
        if self.embedding_reduction == "pca" and self.normalization == "bn":
            raise ConfigError(
                f"{source}: normalization='bn' with embedding_reduction=pca is not allowed: the PCA is applied before "
                "the normalization and bn's statistics are of the unreduced features; expected normalization l2 or none"
            )
        if self.loss == "ice" and self.samples_per_class < 2:
            raise bad("samples_per_class", "an integer >= 2 with loss=ice (every anchor needs a positive)")
        if self.backbone == "small_cnn" and self.image_size != 0 and self.image_size < 16:
            raise bad("image_size", "0 or at least 16 with backbone=small_cnn (it halves the size four times)")
        if self.backbone != "small_cnn" and self.backbone_width != SMALL_CNN_WIDTH:
            raise bad("backbone_width", f"{SMALL_CNN_WIDTH} (the default) with backbone={self.backbone}: only small_cnn has a width to set")
        if not self.pretrained:
            raise bad("pretrained", "none, imagenet or the path of a local weights file")
        if self.backbone == "small_cnn" and self.pretrained == "imagenet":
            raise bad("pretrained", "none or a local weights file with backbone=small_cnn (it has no ImageNet weights)")
        if self.loss == "softmax" and self.heating != "none" and self.heating_target > self.alpha:
            raise ConfigError(
                f"{source}: heating_target={self.heating_target!r} is above alpha={self.alpha!r}; "
                "heating lowers alpha, so expected heating_target <= alpha"
            )

    # -- derived values ---------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.classes_per_batch * self.samples_per_class


# The kind (int, float) of every numeric key, as from_dict coerces it
KINDS = {f.name: f.type for f in fields(TrainConfig) if f.type in ("int", "float")}


def range_problem(key: str, value: Any, bound: bool = False) -> str | None:
    """What numeric key ``key`` expects (``expected ...``) if ``value``, coerced as by from_dict, is outside its range; else None.

    ``bound``: ``value`` is an end of a searched range (see :meth:`Range.describe`). None for keys that are not numeric.
    """
    if key not in RANGES:
        return None
    allowed, kind = RANGES[key], KINDS[key]
    try:
        number = _coerce("", key, value, kind)
    except ConfigError:
        return f"expected {'an integer' if kind == 'int' else 'a number'}"
    return None if allowed.accepts(number, bound) else f"expected {allowed.describe(kind, bound)}"


# Keys that only one loss reads (losses.py, schedule.heats): the heated-up softmax's temperature, its
# heating and its class weights; ICE's scale. Every other key applies to both losses.
LOSS_KEYS = {
    "softmax": ("alpha", "learn_alpha", "heating", "heating_target", "heating_start", "weight_norm", "mean_proxy_weight"),
    "ice": ("ice_scale",),
}


def check_classes_per_batch(classes_per_batch: int, classes: int, dataset: str, source: str, which: str) -> None:
    """The one rule for a batch's classes: ``classes_per_batch`` of the ``classes`` its batches are drawn from
    (``which``: "fit" in a study, "training" in a final run); a ConfigError naming ``source`` otherwise."""
    if classes_per_batch > classes:
        raise ConfigError(
            f"{source}: classes_per_batch={classes_per_batch} is larger than the {classes} {which} classes of {dataset!r}; "
            f"expected at most {classes}"
        )


def applicable_keys(config: TrainConfig) -> tuple[str, ...]:
    """The keys whose values change how ``config`` trains, in ``TrainConfig`` order.

    Left out: the other loss's keys (:data:`LOSS_KEYS`); heating's target and
    start without heating; ``lr_decay_start`` with a constant lr;
    ``heating_lr_factor`` unless ``lr_schedule`` is step (the factor of its
    drop); ``momentum`` unless the optimizer is SGD; ``dropout`` unless
    ``embedding_reduction`` is fc_dropout. Changing a key left out
    leaves training as it is, so these keys and the defaults of the others
    retrain the same model.
    """
    unused = {key for loss, keys in LOSS_KEYS.items() if loss != config.loss for key in keys}
    if config.loss == "softmax" and config.heating == "none":
        unused |= {"heating_target", "heating_start"}
    if config.lr_schedule == "constant":
        unused.add("lr_decay_start")
    if config.lr_schedule != "step":
        unused.add("heating_lr_factor")
    if config.optimizer != "sgd":
        unused.add("momentum")
    if config.embedding_reduction != "fc_dropout":
        unused.add("dropout")
    if config.backbone != "small_cnn":
        unused.add("backbone_width")
    return tuple(key for key in TrainConfig.keys() if key not in unused)


def _coerce(source: str, key: str, value: Any, annotation: Any) -> Any:
    """Coerce a JSON scalar to the field's type, refusing lossy conversions."""
    kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{source}: {key}={value!r} is not allowed; expected true or false")
    if kind == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{source}: {key}={value!r} is not allowed; expected an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{source}: {key}={value!r} is not allowed; expected an integer")
    if kind == "float":
        if isinstance(value, bool):
            raise ConfigError(f"{source}: {key}={value!r} is not allowed; expected a number")
        if isinstance(value, (int, float)):
            # an int beyond float32's range stays an int (float() raises beyond 1.8e308): the key's range refuses it by name
            return value if abs(value) > FLOAT32_MAX else float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{source}: {key}={value!r} is not allowed; expected a number")
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ConfigError(f"{source}: {key}={value!r} is not allowed; expected a string")
    return value

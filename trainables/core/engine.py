"""Training and evaluation: ``train_one_epoch``, ``evaluate`` and ``fit``.

``fit(config, on_epoch)`` trains a :class:`TrainConfig` for ``epochs`` epochs
and calls ``on_epoch(epoch, metrics, state)`` after each (epoch counted from
1), where ``metrics`` is a flat dict of prefixed values and ``state.bundle()``
gives a checkpoint bundle to resume from. Two modes follow the project's
protocol: ``study`` trains on the fit classes and evaluates on the validation
classes (``val_*``); ``final`` trains on all training classes and evaluates on
the test classes (``test_*``).

The names of an epoch's metrics never repeat a config key, and their prefixes
group them: ``train_*`` (loss, accuracy and the loss's own statistics),
``lr_now`` and ``alpha_now`` (the values the schedule set; ``lr`` and ``alpha``
are the config's start values), ``val_*`` / ``test_*`` and ``time/*`` (seconds).
The epoch itself is the step they are recorded at.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from . import schedule
from .cache import attach_cache
from .checkpoint import rng_state, set_rng_state
from .config import PRECISION_CHOICES, ConfigError, TrainConfig, check_classes_per_batch
from .data import DatasetSplits, ImageSet, alphabets, dataset_label, image_size_for, load_dataset, validation_split
from .losses import build_loss
from .metrics import evaluate_embeddings, one_shot_error
from .models import EmbeddingNet
from .optimizers import build_optimizer
from .sampler import ClassBatchSampler
from .transforms import image_dataset, normalize_batch

log = logging.getLogger(__name__)
ONE_SHOT_WAYS = 20  # the test report's N-way one-shot error (Lake et al., 2015)
# image batches and conv weights in NHWC: small_cnn trains faster than in NCHW on a CPU (docs/findings.md, engineering decisions)
IMAGE_LAYOUT = torch.channels_last


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class PrecisionPlan:
    """How the forward pass computes: under autocast to ``dtype`` on ``device_type`` (None: in float32), and whether
    the loss is scaled (a ``torch.amp.GradScaler``) so that fp16's small gradients do not flush to zero."""

    device_type: str
    dtype: torch.dtype | None = None
    scaled: bool = False

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype) if self.dtype is not None else contextlib.nullcontext()

    def scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.scaled else None


FULL_PRECISION = PrecisionPlan("cpu")


def precision_plan(precision: str, device_type: str, source: str = "config") -> PrecisionPlan:
    """What config key ``precision`` means on ``device_type`` ("cuda" or "cpu"); ``source`` names the config in errors.

    fp32: no autocast (the default, and what the CPU always ran before the key existed). bf16: autocast to
    bfloat16, on CUDA and on the CPU alike (bf16 has float32's range: no scaler). fp16: autocast to float16 with a
    GradScaler, on CUDA only. fp16 on the CPU is a ConfigError rather than a quiet fall-back to fp32, which would
    record fp16 for an fp32 run; it is raised here, where the device is known, not in TrainConfig.from_dict: the
    driver validates a trial's config without knowing which node, and so which device, trains it.
    """
    if precision == "fp32":
        return PrecisionPlan(device_type)
    if precision == "bf16":
        return PrecisionPlan(device_type, torch.bfloat16)
    if precision == "fp16" and device_type == "cuda":
        return PrecisionPlan(device_type, torch.float16, scaled=True)
    if precision == "fp16":
        raise ConfigError(f"{source}: precision='fp16' is not allowed on the {device_type}; expected bf16 or fp32 there (fp16 needs CUDA)")
    raise ConfigError(f"{source}: precision={precision!r} is not allowed; expected one of {', '.join(PRECISION_CHOICES)}")


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None) -> None:
    """Backward and step on the scalar ``loss``; with ``scaler``, scaled (a step whose gradients overflow is skipped
    and the scale lowered, as ``GradScaler.step`` and ``update`` do)."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def trial_cpus() -> int:
    """The CPUs a run may use: torch's intra-op threads, which the trainable sets to the CPUs Ray assigned the trial
    (``trainables.dml``) and ``study.final`` to its seed's share of the machine."""
    return max(1, torch.get_num_threads())


def loader_workers(requested: int | None, images: ImageSet, device: torch.device, cpus: int) -> int:
    """The DataLoader worker processes of a run: ``requested`` when given, else the one rule.

    Photos on CUDA: ``cpus`` - 1, at least 1. The workers read, crop and resize while the GPU computes, and the
    training process keeps one CPU to launch its kernels. Everything else: 0, batches made in the training process
    between steps as before: on the CPU the model's compute uses the trial's every core (a worker would only take
    them from it; measured slower with one: docs/findings.md, engineering decisions), and characters are decoded in
    memory already.
    """
    if requested is not None:
        return requested
    return max(1, cpus - 1) if device.type == "cuda" and images.kind == "photos" else 0


def train_one_epoch(
    model: nn.Module,
    loss_fn: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader,
    device: torch.device,
    *,
    epoch: int = 0,
    before_step: Callable[[int], None] | None = None,
    plan: PrecisionPlan = FULL_PRECISION,
    scaler: torch.amp.GradScaler | None = None,
    kind: str = "photos",
) -> dict[str, float]:
    """One pass over ``loader``; returns train_loss, train_accuracy (+ train_mean_proxy_norm for softmax), time/data_s, time/compute_s.

    ``before_step(step)`` runs before each optimizer step (the per-step schedule). The model's forward pass runs
    under ``plan``'s autocast and the loss in float32; ``scaler`` (fp16) scales the backward pass. A uint8 batch (the
    decoded cache's) is normalized with ``kind``'s statistics on ``device``, after the copy.
    """
    model.train()
    loss_fn.train()
    total = count = 0.0
    sums: dict[str, float] = {}  # the loss's per-batch stats (batch means), weighted by batch size
    data_time = compute_time = 0.0
    tick = time.perf_counter()
    for step, (images, labels) in enumerate(loader):
        images = normalize_batch(images.to(device, non_blocking=True, memory_format=IMAGE_LAYOUT), kind)
        labels = labels.to(device, non_blocking=True)
        start = time.perf_counter()
        data_time += start - tick
        if before_step is not None:
            before_step(step)
        with plan.autocast():
            embeddings = model(images)
        loss = loss_fn(embeddings.float(), labels)
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"non-finite loss ({loss.item()}) at epoch {epoch + 1}, step {step + 1}")
        optimizer_step(loss, optimizer, scaler)
        n = len(labels)
        total += float(loss.detach()) * n
        count += n
        for key, value in loss_fn.stats.items():
            sums[key] = sums.get(key, 0.0) + value * n
        tick = time.perf_counter()
        compute_time += tick - start
    means = {f"train_{key}": value / max(count, 1) for key, value in sums.items()}
    return {"train_loss": total / max(count, 1), **means, "time/data_s": data_time, "time/compute_s": compute_time}


class EvalLoaders:
    """The evaluation DataLoaders of one run, one per image set, built at first use and kept.

    With workers, a kept loader's processes stay alive between evaluations (``persistent_workers``): a trial
    evaluates after every epoch, and starting ``num_workers`` processes each time cost a GPU trial much of its
    epoch (docs/performance.md, measurements behind the code). A set gets at most one worker per batch.
    """

    def __init__(self, image_size: int, device: torch.device, num_workers: int = 0, batch_size: int = 256):
        self.image_size, self.device, self.num_workers, self.batch_size = image_size, device, num_workers, batch_size
        self.loaders: dict[int, tuple[ImageSet, torch.utils.data.DataLoader]] = {}

    def __call__(self, images: ImageSet) -> torch.utils.data.DataLoader:
        if id(images) not in self.loaders:  # the set is kept beside its loader, so its id stays its own
            self.loaders[id(images)] = (images, self.build(images))
        return self.loaders[id(images)][1]

    def build(self, images: ImageSet) -> torch.utils.data.DataLoader:
        dataset, collate = image_dataset(images, self.image_size)
        workers = min(self.num_workers, math.ceil(len(images) / self.batch_size))
        return torch.utils.data.DataLoader(
            dataset, batch_size=self.batch_size, num_workers=workers, collate_fn=collate,
            pin_memory=self.device.type == "cuda", persistent_workers=workers > 0,
        )  # fmt: skip


@torch.no_grad()
def embed(
    model: nn.Module,
    images: ImageSet,
    image_size: int,
    device: torch.device,
    *,
    num_workers: int = 0,
    plan: PrecisionPlan = FULL_PRECISION,
    loaders: EvalLoaders | None = None,
) -> torch.Tensor:
    """Embeddings (N, D) float32 on the CPU, in the model's eval mode, without augmentation, under ``plan``'s autocast.

    ``loaders`` (a run's, kept between calls) reads ``images``; without it a loader of ``num_workers`` is built for
    this call alone."""
    model.eval()
    loader = (loaders or EvalLoaders(image_size, device, num_workers))(images)
    out = []
    for batch, _ in loader:
        batch = normalize_batch(batch.to(device, non_blocking=True, memory_format=IMAGE_LAYOUT), images.kind)
        with plan.autocast():
            out.append(model(batch).float().cpu())
    return torch.cat(out)


@dataclass(frozen=True)
class Embeddings:
    """An evaluation's embeddings, float32 on the CPU: ``queries`` (N, D) of the evaluated images, ``gallery`` (M, D)
    of the gallery where the dataset has one."""

    queries: torch.Tensor
    gallery: torch.Tensor | None = None


def evaluate(
    model: nn.Module,
    images: ImageSet,
    image_size: int,
    device: torch.device,
    *,
    prefix: str,
    ks: tuple[int, ...] = (1, 2, 4, 8),
    gallery: ImageSet | None = None,
    seed: int = 0,
    num_workers: int = 0,
    one_shot_ways: int = 0,
    plan: PrecisionPlan = FULL_PRECISION,
    loaders: EvalLoaders | None = None,
) -> tuple[dict[str, float], Embeddings]:
    """Retrieval and clustering metrics of ``model`` on ``images`` (query/gallery with ``gallery``), and the
    embeddings they were computed on (a caller that draws or records them needs no second pass over the images).

    Keys carry ``prefix``: ``{prefix}_recall_at_1``, ``{prefix}_nmi``, ``{prefix}_map_at_r``, ...
    With ``one_shot_ways`` (self-retrieval only) also ``{prefix}_one_shot_error_{ways}way``:
    400 seeded episodes, drawn within one alphabet where the classes have alphabets.
    """
    loaders = loaders or EvalLoaders(image_size, device, num_workers)
    queries = embed(model, images, image_size, device, plan=plan, loaders=loaders)
    found = None if gallery is None else embed(model, gallery, image_size, device, plan=plan, loaders=loaders)
    embeddings = Embeddings(queries, found)
    return score(embeddings, images, gallery, prefix=prefix, ks=ks, seed=seed, one_shot_ways=one_shot_ways), embeddings


def score(
    embeddings: Embeddings,
    images: ImageSet,
    gallery: ImageSet | None = None,
    *,
    prefix: str,
    ks: tuple[int, ...] = (1, 2, 4, 8),
    seed: int = 0,
    one_shot_ways: int = 0,
) -> dict[str, float]:
    """The metrics :func:`evaluate` gives, of embeddings already computed: ``embeddings.queries`` (N, D) of ``images``,
    ``embeddings.gallery`` (M, D) of ``gallery`` where the dataset has one."""
    queries, found = embeddings.queries, embeddings.gallery
    kwargs: dict[str, Any] = {} if gallery is None else {"gallery_embeddings": found, "gallery_labels": gallery.labels}
    metrics = evaluate_embeddings(queries, images.labels, ks, seed=seed, **kwargs)
    if one_shot_ways and gallery is None:
        try:
            error = one_shot_error(queries, images.labels, alphabets(images), ways=one_shot_ways, seed=seed)
            metrics[f"one_shot_error_{one_shot_ways}way"] = error
        except ValueError as too_few:  # fewer classes (per alphabet) than ways: the metric does not exist here
            log.info("%s_one_shot_error_%dway not computed: %s", prefix, one_shot_ways, too_few)
    return {f"{prefix}_{name}": value for name, value in metrics.items()}


def concatenated(members: list[Embeddings]) -> Embeddings:
    """The embeddings of an ensemble of models: each member's (N, d_i) l2-normalized, set side by side and scaled by
    1/sqrt(len(members)), (N, sum d_i) of unit length. Its cosine similarity is the mean of the members'."""

    def joined(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([torch.nn.functional.normalize(part.float(), dim=1) for part in parts], dim=1) / len(parts) ** 0.5

    gallery = None if members[0].gallery is None else joined([m.gallery for m in members])
    return Embeddings(joined([m.queries for m in members]), gallery)


@dataclass
class Run:
    """Everything one training run holds; ``bundle()`` is its checkpoint."""

    config: TrainConfig
    device: torch.device
    model: EmbeddingNet
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    sampler: ClassBatchSampler
    train_set: ImageSet
    eval_set: ImageSet
    gallery: ImageSet | None
    image_size: int
    prefix: str
    recall_ks: tuple[int, ...]
    classes: list[int]
    plan: PrecisionPlan = FULL_PRECISION  # config key precision on this device
    scaler: torch.amp.GradScaler | None = None  # precision fp16's
    epoch: int = 0  # epochs completed
    metrics: dict[str, float] = field(default_factory=dict)  # of the last epoch
    embeddings: Embeddings | None = None  # of the last evaluation (not in the bundle)

    def bundle(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "loss": self.loss_fn.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "num_classes": len(self.classes),
            "classes": list(self.classes),
            "kind": self.train_set.kind,
            "image_size": self.image_size,
            "in_channels": in_channels(self.train_set.kind),
            **({"scaler": self.scaler.state_dict()} if self.scaler is not None else {}),
        }

    def restore(self, bundle: dict[str, Any]) -> None:
        self.model.load_state_dict(bundle["model"])
        self.loss_fn.load_state_dict(bundle["loss"])
        self.optimizer.load_state_dict(bundle["optimizer"])
        self.sampler.load_state_dict(bundle["sampler"])
        set_rng_state(bundle["rng"])
        if self.scaler is not None and "scaler" in bundle:
            self.scaler.load_state_dict(bundle["scaler"])
        self.epoch = int(bundle["epoch"])


def in_channels(kind: str) -> int:
    return 1 if kind == "characters" else 3


def build_model(config: TrainConfig, kind: str, image_size: int) -> EmbeddingNet:
    return EmbeddingNet(
        config.backbone,
        config.embedding_dim,
        config.normalization,
        in_channels=in_channels(kind),
        image_size=image_size,
        pretrained=config.pretrained,
        dropout=config.dropout,
        reduction=config.embedding_reduction,
        backbone_width=config.backbone_width,
    )


def fit_reduction(run: Run, loaders: EvalLoaders) -> None:
    """With embedding_reduction=pca, fit the model's PCA on the pool features of ``run.train_set``.

    001_df21db8a9bc1b516, sec. 3.1 and Fig. 3a: the features of the training
    images (the fit classes in a study, all training classes in a final run;
    no augmentation) are reduced by PCA. Called before every evaluation, so
    the metrics and the checkpoint after the last epoch are of the PCA fitted
    at the end of training. Other reductions are trained layers: nothing to do.
    """
    if run.model.pca is None:
        return
    features = embed(run.model.backbone, run.train_set, run.image_size, run.device, plan=run.plan, loaders=loaders)
    run.model.pca.fit(features.to(run.device))


def build_run(
    config: TrainConfig,
    *,
    mode: str = "study",
    data_root: str | None = None,
    splits: DatasetSplits | None = None,
    device: torch.device | None = None,
    download: bool = False,
    source: str = "config",
    num_workers: int | None = None,
) -> Run:
    """Data, model, loss, optimizer and sampler of ``config`` (seeded); ``source`` names the config in errors.

    Photos are read through the node's decoded cache (``cache.attach_cache``, built with :func:`trial_cpus`
    processes, or ``num_workers`` if more, by the first run that needs it) unless it does not fit; then they stream from their files.
    """
    if mode not in ("study", "final"):
        raise ValueError(f"mode={mode!r}; expected 'study' or 'final'")
    device = device or default_device()
    plan = precision_plan(config.precision, device.type, source)
    seed_everything(config.seed)
    splits = splits or load_dataset(config.dataset, data_root, config.image_size, download=download)
    image_size = image_size_for(config.dataset, config.image_size)
    attach_cache(splits, image_size, data_root, workers=max(trial_cpus(), num_workers or 0))
    if mode == "study":
        where = dataset_label(config.dataset, data_root)
        fit_classes, val_classes = validation_split(splits.train, config.val_split, config.val_fraction, where, config.val_fold)
        train_set, eval_set, gallery, prefix = splits.train.with_classes(fit_classes), splits.train.with_classes(val_classes), None, "val"
    else:
        train_set, eval_set, gallery, prefix = splits.train, splits.test, splits.gallery, "test"
    classes = [int(c) for c in train_set.classes]
    check_classes_per_batch(config.classes_per_batch, len(classes), config.dataset, source, "fit" if mode == "study" else "training")
    model = build_model(config, train_set.kind, image_size).to(device, memory_format=IMAGE_LAYOUT)
    # the loss sees the train-mode features: the pool features with embedding_reduction=pca
    loss_fn = build_loss(replace(config, embedding_dim=model.train_dim), len(classes)).to(device)
    new_ids = {id(p) for layer in model.new_layers() for p in layer.parameters()}
    base = [p for p in model.parameters() if id(p) not in new_ids]
    new = [p for p in model.parameters() if id(p) in new_ids] + list(loss_fn.parameters())
    groups = schedule.param_groups(base, new, config)
    optimizer = build_optimizer(groups, config)
    sampler = ClassBatchSampler(train_set.labels, config.classes_per_batch, config.samples_per_class, seed=config.seed)
    return Run(
        config, device, model, loss_fn, optimizer, sampler, train_set, eval_set, gallery, image_size, prefix, splits.recall_ks, classes,
        plan, plan.scaler(),
    )  # fmt: skip


OnEpoch = Callable[[int, dict[str, float], Run], None]


def apply_schedule(run: Run, epoch: float) -> None:
    """Set alpha and the learning rates of ``run`` for (fractional) ``epoch`` of its budget (schedule.py)."""
    run.loss_fn.set_alpha(schedule.alpha_at(run.config, epoch))
    schedule.set_lr(run.optimizer, schedule.lr_factor_at(run.config, epoch))


def fit(
    config: TrainConfig,
    on_epoch: OnEpoch | None = None,
    *,
    mode: str = "study",
    data_root: str | None = None,
    splits: DatasetSplits | None = None,
    device: torch.device | None = None,
    resume: dict[str, Any] | None = None,
    eval_every: int = 1,
    num_workers: int | None = None,
    download: bool = False,
) -> Run:
    """Train ``config`` to its last epoch; returns the run (``run.metrics``: the last epoch's).

    ``resume`` is a bundle from ``Run.bundle()``: training continues after its
    epoch with the same model, optimizer, sampler and RNG states. Evaluation
    runs every ``eval_every`` epochs and always after the last. ``num_workers``: the DataLoaders' worker
    processes; None sizes them from the trial's CPUs (:func:`loader_workers`).
    """
    run = build_run(config, mode=mode, data_root=data_root, splits=splits, device=device, download=download, num_workers=num_workers)
    if resume is not None:
        run.restore(resume)
    num_workers = loader_workers(num_workers, run.train_set, run.device, trial_cpus())
    label_index = {c: i for i, c in enumerate(run.classes)}
    dataset, collate = image_dataset(run.train_set, run.image_size, config.augment, label_index)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=run.sampler,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=run.device.type == "cuda",
        persistent_workers=num_workers > 0,
    )
    eval_loaders = EvalLoaders(run.image_size, run.device, num_workers)
    while run.epoch < config.epochs:
        epoch = run.epoch
        started = time.perf_counter()
        run.sampler.set_epoch(epoch)
        steps = max(len(run.sampler), 1)

        def before_step(step: int, epoch: int = epoch, steps: int = steps) -> None:
            apply_schedule(run, epoch + step / steps)

        step_kwargs = {"epoch": epoch, "before_step": before_step, "plan": run.plan, "scaler": run.scaler, "kind": run.train_set.kind}
        metrics = train_one_epoch(run.model, run.loss_fn, run.optimizer, loader, run.device, **step_kwargs)
        metrics["lr_now"] = run.optimizer.param_groups[0]["lr"]  # of the epoch's last step
        metrics.update(run.loss_fn.schedule_metrics())
        metrics["time/train_s"] = time.perf_counter() - started
        run.epoch = epoch + 1
        if run.epoch % eval_every == 0 or run.epoch == config.epochs:
            tick = time.perf_counter()
            fit_reduction(run, eval_loaders)
            scores, run.embeddings = evaluate(
                run.model,
                run.eval_set,
                run.image_size,
                run.device,
                prefix=run.prefix,
                ks=run.recall_ks,
                gallery=run.gallery,
                seed=config.seed,
                loaders=eval_loaders,
                one_shot_ways=ONE_SHOT_WAYS if mode == "final" else 0,
                plan=run.plan,
            )
            metrics.update(scores)
            metrics["time/eval_s"] = time.perf_counter() - tick
        metrics["time/epoch_s"] = time.perf_counter() - started
        if not math.isfinite(metrics["train_loss"]):
            raise TrainingDiverged(f"non-finite train_loss at epoch {run.epoch}")
        log.info("epoch %d/%d %s", run.epoch, config.epochs, {k: round(v, 4) for k, v in metrics.items()})
        run.metrics = metrics
        if on_epoch is not None:
            on_epoch(run.epoch, metrics, run)
    return run

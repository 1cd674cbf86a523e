"""python -m study.final: retrain a fixed config on all training classes and test it.

Trains the config on the fit + validation classes (all of the dataset's
training classes) once per seed, evaluates on the unseen test classes, and
records everything in MLflow: params, per-epoch metrics, test metrics per seed
and their mean and spread, positive/negative pair similarity histograms, the
resolved config and the model as a pyfunc model (uint8 images in, l2-normalized
embeddings out).

Examples:
  python -m study.final --data-root ../shared/data              # HBN on Omniglot (embedded default)
  python -m study.final --config configs/omniglot_sm.yaml --seeds 3
  python -m study.final --space paper_ablation --seeds 3      # every variant of a grid space, 3 seeds each
  python -m study.final --study NAME --address auto --gpus-per-trial 1   # each seed a Ray task on a GPU worker

Where the seeds train (study/seeds.py): on a Ray cluster (--address) each seed is a Ray task holding
--cpus-per-trial CPUs and --gpus-per-trial GPUs, the seeds side by side; on this machine side by side on the
cores when it has several (each seed's process with its share of torch threads), else one after another.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch

from study import checks, console, inputs, locks, names, records, seeds, tracking
from study.inputs import UsageError
from study.interrupts import StopSignals, StudyInterrupted, exit_code, signal_name, uninterrupted
from study.parent import mark_stopped, study_parent
from study.plots import pair_similarities, retrieval_examples, retrieval_grid, similarity_histogram, tsne_map
from study.record import StudyRecord
from study.recorder import spool_path
from study.seeds import EpochReport, Placement, SeedJob, SeedOutput
from study.selection import tie_member
from trainables.core.checkpoint import CheckpointError
from trainables.core.config import ConfigError, TrainConfig, check_classes_per_batch
from trainables.core.data import (
    DATA_ROOT_ENV,
    DatasetError,
    DatasetSplits,
    check_retrieval_set,
    dataset_label,
    image_size_for,
    load_dataset,
)
from trainables.core.engine import ONE_SHOT_WAYS, Embeddings, Run, TrainingDiverged, build_model, concatenated, default_device, fit, score
from trainables.core.models import WeightsError

log = logging.getLogger(__name__)
DEFAULT_CONFIG = "omniglot_hbn.yaml"
INPUT_ERRORS = (UsageError, ConfigError, DatasetError, WeightsError, CheckpointError)
# what a study's final seeds train (--members): the race's tied candidates, decided on the validation classes
# (docs/results.md, "The race's tie as one model"), or the pick alone
MEMBERS = ("tied", "pick")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m study.final",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument(
        "--config",
        help=f"YAML file of config keys (TrainConfig in trainables/core/config.py); default: the embedded {DEFAULT_CONFIG}, "
        "heated-up softmax with BN features, alpha 16 -> 4, on Omniglot",
    )
    parser.add_argument(
        "--space",
        help="a grid or variants search space (file or shipped name): train every configuration of it with --seeds seeds, "
        "as children of one parent run named after the space (tag study_name), for a table with python -m study.report",
    )
    parser.add_argument(
        "--data-root",
        help=f"folder holding the datasets (default: ${DATA_ROOT_ENV}, else with --study the study's own); "
        "Omniglot is looked up in <root>/omniglot/",
    )
    parser.add_argument("--download", action="store_true", help="download Omniglot into the data root when it is missing (needs internet)")
    parser.add_argument(
        "--seeds", type=int, default=3, help="train this many seeds (config seed, +1, ...); report mean and spread (default 3)"
    )
    parser.add_argument("--epochs", type=int, help="override the config's epochs (e.g. 2 for a smoke run)")
    parser.add_argument(
        "--study",
        help="retrain the best config of this study (its parent run's best_config.yaml) on the study's data root; "
        "the seed runs become children of the study's parent run and the final model (the seeds as one model; "
        "with --seeds 1 the seed's) is registered as NAME-embedding",
    )
    parser.add_argument(
        "--members",
        choices=MEMBERS,
        help="with --study and --seeds > 1, what the seeds train: 'tied' (default), the candidates the study's race "
        "could not tell apart, best mean first (seed k trains the k-th, cycling; a clear pick trains alone), so the "
        "final model is the tie as one model; 'pick', the pick alone",
    )
    tracking.add_tracking_flags(
        parser.add_argument, f"MLflow experiment (default: final; with --study: {tracking.DEFAULT_EXPERIMENT}, as study.launch)", None
    )
    parser.add_argument("--run-name", help="name of the parent MLflow run (default: the config file's name)")
    parser.add_argument(
        "--register",
        metavar="NAME",
        help="register the final model (the seeds as one model; with --seeds 1 the seed's) in the MLflow registry under NAME "
        "(letters, digits, _ . -)",
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument(
        "--num-workers",
        type=int,
        help="data-loading worker processes (default: photos on a GPU get the seed's CPUs - 1, everything else none)",
    )
    add_placement_flags(parser.add_argument)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def add_placement_flags(a) -> None:
    """Where the seeds train: a Ray cluster and the resources of a seed's task there."""
    a(
        "--address",
        help="train each seed as a task of this running Ray cluster ('auto' on one of its nodes), the seeds side by side; "
        "default: this machine (side by side on its cores when it has several)",
    )
    a(
        "--cpus-per-trial",
        type=float,
        help="with --address: CPUs a seed's task holds, as many torch threads (default: the study's, else 1)",
    )
    a(
        "--gpus-per-trial",
        type=float,
        help="with --address: GPUs a seed's task holds; it trains on CUDA when > 0 (default: the study's, else 0)",
    )


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags' ranges and combinations (``parser.error``: one line, exit 2) and the name rule; fills --experiment."""
    if sum(bool(x) for x in (args.study, args.config, args.space)) > 1:
        parser.error("--study, --config and --space exclude each other: retrain a study's best config, a config file or a grid space")
    if args.experiment is None:
        args.experiment = tracking.DEFAULT_EXPERIMENT if args.study else "final"
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected an integer >= 1")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs {args.epochs}: expected an integer >= 1")
    if args.num_workers is not None and args.num_workers < 0:
        parser.error(f"--num-workers {args.num_workers}: expected an integer >= 0")
    if args.cpus_per_trial is not None and not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        parser.error(f"--cpus-per-trial {args.cpus_per_trial}: expected a finite number > 0")
    if args.gpus_per_trial is not None and not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        parser.error(f"--gpus-per-trial {args.gpus_per_trial}: expected a finite number >= 0")
    for flag, value in (("--cpus-per-trial", args.cpus_per_trial), ("--gpus-per-trial", args.gpus_per_trial)):
        if value is not None and args.address is None:
            parser.error(f"{flag} sizes a seed's task on a Ray cluster; give --address (on this machine the seeds share its cores)")
    if args.members is not None and not args.study:
        parser.error(f"--members {args.members}: chooses what a study's final seeds train; give --study")
    args.members = args.members or MEMBERS[0]
    if args.device and args.address is not None:
        parser.error("--device: with --address a seed trains on CUDA when it holds a GPU (--gpus-per-trial), else on CPU")
    names.check_names({"--study": args.study, "--experiment": args.experiment, "--register": args.register})


def load_config(path: str | None, epochs: int | None = None) -> tuple[TrainConfig, str]:
    """The config of ``path`` (or the embedded default) and a name for it."""
    if path is None:
        text = resources.files("configs").joinpath(DEFAULT_CONFIG).read_text()
        source, name = f"configs/{DEFAULT_CONFIG} (embedded)", Path(DEFAULT_CONFIG).stem
        values = inputs.parse_yaml(text, source, "a mapping of config keys")
    else:
        values, source, name = inputs.read_yaml(path, "a mapping of config keys"), path, Path(path).stem
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise UsageError(f"{source}: expected a mapping of config keys, got {type(values).__name__}")
    if epochs is not None:
        values = {**values, "epochs": epochs}
    return TrainConfig.from_dict(values, source=source), name


@dataclass(frozen=True)
class SeedResult:
    """One seed's child run: its test metrics, training time, logged model and registered version."""

    seed: int
    run_id: str
    test: dict[str, float]  # the test_* metrics
    time_s: float  # training and testing, seconds
    model_uri: str
    registered_uri: str | None  # models:/NAME/VERSION of the first seed's model when registered (one seed), else None
    trial: int | None = None  # the Optuna trial of the race's tie it trained (--members tied), else None


@dataclass(frozen=True)
class EnsembleResult:
    """The seeds of one configuration as one model (``pyfunc.EmbeddingModel`` over their bundles): its child run, its
    test metrics and its logged model."""

    run_id: str
    test: dict[str, float]  # the test_* metrics of the seeds' concatenated embeddings (engine.concatenated)
    model_uri: str
    registered_uri: str | None = None  # models:/NAME/VERSION when registered (the plan's register name), else None
    trials: tuple[int, ...] = ()  # a study's tied candidates, one per seed (--members tied); () for seeds of one configuration
    width: int = 0  # the members' embedding sizes together


@dataclass(frozen=True)
class ConfigurationResult:
    """One configuration trained over the plan's seeds, and the mean and spread of its test metrics."""

    name: str
    config: TrainConfig
    seeds: tuple[SeedResult, ...]
    summary: dict[str, float]  # <metric>_mean, <metric>_std (sample std, 0 for one seed), time_per_seed_s_mean, ensemble_<metric>
    ensemble: EnsembleResult | None = None  # with two seeds or more

    def record(self) -> dict[str, Any]:
        """What the parent run's results.json keeps of it: {"per_seed": [each seed's fields], "summary": ...}."""
        ensemble = None if self.ensemble is None else dataclasses.asdict(self.ensemble)
        return {"per_seed": [dataclasses.asdict(seed) for seed in self.seeds], "summary": self.summary, "ensemble": ensemble}


@dataclass(frozen=True)
class FinalResult:
    """What one study.final command trained: every configuration of its plan, in order, under one parent run."""

    name: str  # of the config file, the space or the study
    uri: str  # the tracking URI
    parent_run_id: str
    configurations: tuple[ConfigurationResult, ...]
    log: Path | None = None  # where library warnings and logs went
    experiment: str = ""
    experiment_id: str = ""  # the MLflow UI's page of the runs names it
    report: str | None = None  # the study (--study) or grid (--space) that study.report --study turns into a report

    @property
    def grid(self) -> bool:
        return len(self.configurations) > 1


def summarize(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Mean and (sample) standard deviation of every test metric across seeds."""
    out: dict[str, float] = {}
    for key in per_seed[0]:
        values = np.array([m[key] for m in per_seed], dtype=float)
        out[f"{key}_mean"] = float(values.mean())
        out[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return out


def train_seed(job: SeedJob, splits: DatasetSplits, on_epoch: Callable[[EpochReport], None]) -> SeedOutput:
    """Train one seed on all training classes, test it, draw its pictures: in the driver or in a Ray task (study.seeds).

    Touches no MLflow: the driver records the output (:class:`SeedRuns`). ``time_s`` is training and testing.
    """
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    config, started = job.config, time.perf_counter()

    def report(epoch: int, metrics: dict[str, float], run: Run) -> None:
        on_epoch(EpochReport(job.index, epoch, metrics))

    device = torch.device(job.device)
    run = fit(config, report, mode="final", splits=splits, device=device, eval_every=config.epochs, num_workers=job.num_workers)
    elapsed = time.perf_counter() - started
    test = {k: v for k, v in run.metrics.items() if k.startswith("test_")}
    embeddings = run.embeddings.queries.numpy()  # the final evaluation's: fit evaluates after the last epoch
    positive, negative = pair_similarities(embeddings, run.eval_set.labels, seed=config.seed)
    with tempfile.TemporaryDirectory() as tmp:
        histogram = similarity_histogram(
            positive,
            negative,
            Path(tmp) / f"similarity_histogram_seed{config.seed}.png",
            title=f"test pair similarities, seed {config.seed}",
        )
        pictures = {path.name: path.read_bytes() for path in (histogram, *embedding_pictures(run, embeddings, Path(tmp)))}
    similarity = {"test_positive_similarity_mean": float(positive.mean()), "test_negative_similarity_mean": float(negative.mean())}
    bundle = {k: v for k, v in run.bundle().items() if k not in TRAINING_STATE}
    bundle["model"] = {k: v.detach().cpu() for k, v in bundle["model"].items()}  # a GPU's weights, read by a driver without one
    return SeedOutput(job.index, test, similarity, elapsed, bundle, pictures, socket.gethostname(), run.embeddings)


TRAINING_STATE = ("optimizer", "rng", "sampler", "loss")  # what a run's bundle holds to continue training; the model needs none


def embedding_pictures(run: Run, embeddings: np.ndarray, workdir: Path) -> tuple[Path, Path]:
    """The retrieval grid (8 test queries of different classes, their top 8) and a t-SNE map of ``embeddings`` (the test set's).

    ``study.report`` shows both; neighbours come from the gallery where the dataset has one (its embeddings: the
    run's final evaluation's, as the queries').
    """
    seed, queries_set, gallery = run.config.seed, run.eval_set, run.gallery
    gallery_embeddings = None if run.embeddings.gallery is None else run.embeddings.gallery.numpy()
    queries, neighbours = retrieval_examples(embeddings, queries_set.labels, seed=seed, gallery_embeddings=gallery_embeddings)
    source = queries_set if gallery is None else gallery
    correct = np.asarray(source.labels)[neighbours] == np.asarray(queries_set.labels)[queries][:, None]
    grid = retrieval_grid(
        [queries_set.load(int(q)) for q in queries],
        [[source.load(int(j)) for j in row] for row in neighbours],
        correct,
        workdir / f"retrieval_grid_seed{seed}.png",
        title=f"test retrieval, seed {seed}: query, then its 8 nearest neighbours ({int((~correct).sum())} of {correct.size} wrong: red)",
    )
    return grid, tsne_map(embeddings, queries_set.labels, workdir / f"tsne_seed{seed}.png", seed=seed)


def record_model(output: SeedOutput, example: np.ndarray, workdir: Path, register: str | None, origin: str) -> tuple[str, str | None]:
    """Log the seed's model as ``embedding-seed<k>`` in the active MLflow run (its seed run), the test metrics linked to it,
    and a registered version's description.

    Returns the model's URI and the registered version's (models:/NAME/VERSION, or None).
    """
    from study.pyfunc import log_embedding_model

    config = TrainConfig.from_dict(output.bundle["config"], source="the seed's model")
    info = log_embedding_model(output.bundle, example, workdir, name=f"embedding-seed{config.seed}", registered_model_name=register)
    return info.model_uri, link_metrics(info, {**output.test, **output.similarity}, config, register, origin)


def link_metrics(
    info,
    test: dict[str, float],
    config: TrainConfig,
    register: str | None,
    origin: str,
    seeds: list[int] | None = None,
    tied: list[tuple[int, TrainConfig]] | None = None,
) -> str | None:
    """Log ``test`` (the finite values) in the active run, linked to the logged model of ``info``; describe its registered
    version (one seed's, the ensemble of ``seeds``, or of a study's ``tied`` candidates). Returns models:/NAME/VERSION, or
    None when not registered."""
    from study.pyfunc import version_description

    linked = {k: v for k, v in test.items() if math.isfinite(v)}
    mlflow.log_metrics(linked, step=config.epochs, model_id=info.model_id)
    version = info.registered_model_version
    if not register or version is None:
        return None
    description = version_description(config, linked, origin or "study.final", mlflow.active_run().info.run_id, seeds, tied)
    mlflow.MlflowClient().update_model_version(register, str(version), description=description)
    return f"models:/{register}/{version}"


def study_config(study: str, experiment: str, epochs: int | None, uri: str) -> tuple[TrainConfig, str, StudyRecord]:
    """The best config of ``study`` (its parent run's best_config.yaml), the parent run's id and the study's record.

    The record gives the study's data root (``data_root``, None for a study that did not record one) and its trials'
    resources, which a seed's task on a cluster holds by default.
    The epochs are ``epochs`` (--epochs), else the study's ``final_epochs`` param (its space's
    final_budget_factor x the trials' epochs), else the trials' own.
    """
    tracking.setup(uri, experiment)
    parent = study_parent(uri, experiment, study, "--study")
    if parent.info.status == "RUNNING":  # its pick is not made yet: best_config.yaml is written at the study's end
        raise UsageError(still_running(study, experiment, uri, parent.info.run_id))
    record = StudyRecord.from_params(parent.data.params, where=f"study {study!r}")
    values = study_file(parent.info.run_id, "best_config.yaml", uri, "the study's best config")
    if values is None:
        raise UsageError(
            f"--study {study}: the study has no best_config.yaml (no trial completed); "
            "expected a finished study with at least one complete trial"
        )
    config = TrainConfig.from_dict({**values, **final_epochs(epochs, record)}, source=f"best_config.yaml of study {study}")
    return config, parent.info.run_id, record


def final_epochs(epochs: int | None, record: StudyRecord) -> dict[str, int]:
    """The epochs key of a study's final configs: ``epochs`` (--epochs), else the study's ``final_epochs``; {} for neither
    (the trials' own)."""
    return {"epochs": epochs if epochs is not None else record.final_epochs} if epochs is not None or record.final_epochs else {}


def study_file(parent_id: str, name: str, uri: str, what: str) -> Any:
    """The YAML artifact ``name`` of a study's parent run, read; None when the run has none."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=parent_id, artifact_path=name, dst_path=tmp, tracking_uri=uri)
        except mlflow.exceptions.MlflowException:
            return None
        return inputs.read_yaml(path, what)


def tied_members(study: str, parent_id: str, record: StudyRecord, epochs: int | None, uri: str) -> tuple[Member, ...]:
    """The candidates the study's race could not tell apart (its tied_configs.yaml, the pick first), at the final
    epochs; () for a study without the file (one from before it, or one that did not race)."""
    entries = study_file(parent_id, "tied_configs.yaml", uri, "the study's tied candidates") or []
    source = f"tied_configs.yaml of study {study}"
    return tuple(
        Member(int(entry["trial"]), TrainConfig.from_dict({**entry["config"], **final_epochs(epochs, record)}, source=source))
        for entry in entries
    )


def still_running(study: str, experiment: str, uri: str, parent_id: str) -> str:
    """Why ``--study STUDY`` cannot retrain while its parent run is RUNNING, and what to run. A study whose records wait
    in its spool ended without writing MLflow (it was unreachable, or its disk full, at the end): study.sync writes them."""
    head = f"--study {study}: study {study} is still running (its MLflow parent run {parent_id} is RUNNING); "
    spool = Path(spool_path(study))
    if spool.is_file() and spool.stat().st_size > 0:
        return (
            head + f"its records wait in {spool}, not yet written to MLflow. If its driver has ended (MLflow could not be "
            f"written at its end), write them, then retrain its pick: {console.sync_command(study, experiment, uri)}; "
            f"if it still runs, follow it: {console.ui_command(uri)}"
        )
    return (
        head + f"retrain its pick once it has finished. Follow it: {console.ui_command(uri)}; if its driver was killed, "
        f"finish it: {console.python_command('study.launch')} --study-name {study} --resume"
    )


def space_configs(path: str, epochs: int | None) -> tuple[list[tuple[str, TrainConfig]], str]:
    """Every configuration of a grid or variants space, named, validated: ([(name, config)], space name)."""
    from study.spaces import VARIANT, load_space

    space = load_space(path)
    if not space.is_grid:
        raise UsageError(f"--space {path}: a searched space (params); expected a grid or variants space, whose configurations are fixed")
    names = list(space.grid_search_space())
    configs = []
    for combo in itertools.product(*space.grid_search_space().values()):
        point = dict(zip(names, combo))
        name = str(point[VARIANT]) if VARIANT in point else ",".join(f"{k}={v}" for k, v in point.items())
        overrides = {"epochs": epochs} if epochs is not None else None
        configs.append((name, TrainConfig.from_dict(space.to_config(point, overrides), source=f"{space.path} ({name})")))
    return configs, space.name


@dataclass(frozen=True)
class Member:
    """One candidate a study's race could not tell from its pick: its Optuna trial number and config (final epochs)."""

    trial: int
    config: TrainConfig


@dataclass(frozen=True)
class FinalPlan:
    """What one study.final command trains and where it records it, resolved before any MLflow run exists.

    Three modes make one: ``--config`` (one configuration under a new ``final``
    parent run), ``--space`` (every configuration of a grid under a new
    ``final_grid`` parent run, tagged ``study_name`` for study.report) and
    ``--study`` (the study's best config, attached to the study's parent run,
    whose records then get the ``final_`` prefix).
    """

    name: str  # of the config file, the space or the study
    configurations: tuple[tuple[str, TrainConfig], ...]  # (name, config), trained in this order
    seeds: int  # each configuration is trained with seeds config.seed, +1, ... (this many)
    experiment: str
    source: str  # where the configurations came from, for error messages
    run_name: str = ""  # of the parent run to create
    parent_run_id: str | None = None  # an existing parent run to attach to (--study); None: create one
    study: str | None = None
    space: str | None = None
    register: str | None = None  # registry name of the final model (the seeds' ensemble; one seed's with one seed)
    data_root: str | None = None  # the study's own (--study), used without --data-root and $DML_DATA_ROOT
    trial_resources: tuple[float, float] = (1.0, 0.0)  # CPUs and GPUs of the study's trials (--study), a seed's task's by default
    members: tuple[Member, ...] = ()  # --study --members tied: the race's tied candidates, the pick first; (): the pick alone

    @property
    def grid(self) -> bool:
        return self.space is not None

    @property
    def prefix(self) -> str:
        """Of the parent run's metrics and files: a study's parent run has its own."""
        return "final_" if self.parent_run_id else ""

    def seed_values(self) -> list[int]:
        """The seeds of the first configuration; every configuration counts from its own config seed."""
        return [self.configurations[0][1].seed + i for i in range(self.seeds)]

    def member(self, index: int) -> Member | None:
        """The tied candidate seed ``index`` trains (``selection.tie_member``); None without tied members."""
        return tie_member(self.members, index) if self.members else None

    def seed_config(self, config: TrainConfig, index: int) -> TrainConfig:
        """What seed ``index`` of ``config`` trains: ``config``, or with tied members its :meth:`member`'s config, with
        seed config.seed + index."""
        member = self.member(index)
        return (member.config if member else config).replace(seed=config.seed + index)

    def seed_trial(self, index: int) -> int | None:
        """The Optuna trial seed ``index`` trains with tied members, else None."""
        member = self.member(index)
        return member.trial if member else None

    def source_of(self, name: str) -> str:
        return f"{self.source} ({name})" if self.grid else self.source

    def seed_run_name(self, name: str, seed: int) -> str:
        return f"{name}-seed{seed}" if self.grid else f"final-{self.name}-seed{seed}"

    def ensemble_run_name(self, name: str) -> str:
        return f"{name}-ensemble" if self.grid else f"final-{self.name}-ensemble"


def make_plan(args: argparse.Namespace, uri: str) -> FinalPlan:
    """Resolve the command line into a plan; raises the input errors (nothing is created but, for --study, the experiment)."""
    if args.study:
        config, parent_id, record = study_config(args.study, args.experiment, args.epochs, uri)
        tied = tied_members(args.study, parent_id, record, args.epochs, uri) if args.members == "tied" and args.seeds > 1 else ()
        return FinalPlan(
            args.study,
            ((args.study, config),),
            args.seeds,
            args.experiment,
            source=f"best_config.yaml of study {args.study}",
            parent_run_id=parent_id,
            study=args.study,
            register=args.register or f"{args.study}-embedding",
            data_root=record.data_root,
            trial_resources=(record.cpus_per_trial, record.gpus_per_trial),
            members=tied if len(tied) > 1 else (),  # a clear pick (one candidate left) trains alone
        )
    if args.space:
        configurations, name = space_configs(args.space, args.epochs)
        run_name = args.run_name or name
        return FinalPlan(
            name, tuple(configurations), args.seeds, args.experiment, args.space, run_name, space=args.space, register=args.register
        )
    config, name = load_config(args.config, args.epochs)
    source, run_name = args.config or f"configs/{DEFAULT_CONFIG}", args.run_name or f"final-{name}"
    return FinalPlan(name, ((name, config),), args.seeds, args.experiment, source, run_name, register=args.register)


def placement_of(args: argparse.Namespace, plan: FinalPlan, device: torch.device) -> Placement:
    """Where the seeds train: tasks of the Ray cluster at --address holding the trials' resources, else as
    ``seeds.local_placement`` rules for this machine's cores."""
    if args.address is not None:
        cpus, gpus = plan.trial_resources
        cpus = cpus if args.cpus_per_trial is None else args.cpus_per_trial
        return seeds.cluster_placement(args.address, cpus, gpus if args.gpus_per_trial is None else args.gpus_per_trial)
    return seeds.local_placement(len(os.sched_getaffinity(0)), plan.seeds, device.type)


def resolve_device(flag: str | None) -> torch.device:
    if flag is None:
        return default_device()
    try:
        return torch.device(flag)
    except RuntimeError:
        raise UsageError(f"--device {flag}: not a device; expected cpu, cuda or cuda:N") from None


def load_data(plan: FinalPlan, data_root: str | None, download: bool) -> dict[tuple[str, int], DatasetSplits]:
    """Each dataset of the plan, loaded once, after checking that every configuration can be trained on it.

    The checks are the cheap ones: the batches fill from the dataset's training
    classes, the test classes give retrieval metrics a value (at least 2 images
    each), and a weights file given as ``pretrained`` fits the backbone.
    Returns {(dataset, image_size): splits}.
    """
    splits: dict[tuple[str, int], DatasetSplits] = {}
    weights_checked: set[tuple[str, str, str]] = set()
    for name, config in plan.configurations:
        key = (config.dataset, config.image_size)
        if key not in splits:
            splits[key] = load_dataset(config.dataset, data_root, config.image_size, download=download)
            check_retrieval_set(splits[key].test, splits[key].gallery, f"{dataset_label(config.dataset, data_root)}: the test classes")
        train = splits[key].train
        check_classes_per_batch(config.classes_per_batch, len(np.unique(train.labels)), config.dataset, plan.source_of(name), "training")
        if config.pretrained not in ("none", "imagenet") and (config.backbone, config.pretrained, train.kind) not in weights_checked:
            # a weights file is checked by loading it into the backbone, as training will
            build_model(config, train.kind, image_size_for(config.dataset, config.image_size))
            weights_checked.add((config.backbone, config.pretrained, train.kind))
    return splits


def open_parent(client: mlflow.MlflowClient, experiment_id: str, plan: FinalPlan, owner: dict[str, str]) -> str:
    """The parent run's id: the study's (--study), or a new run with the seeds and, for one configuration, its params;
    ``owner``: the tags naming this process (``locks.owner_tags``)."""
    if plan.parent_run_id is not None:
        return plan.parent_run_id
    tags = {**tracking.reproducibility_tags(), **owner, "kind": "final_grid" if plan.grid else "final"}
    if plan.grid:
        tags.update({"study_name": plan.run_name, "space": str(plan.space), "configurations": str(len(plan.configurations))})
    parent_id = client.create_run(experiment_id, run_name=plan.run_name, tags=tags).info.run_id
    first = plan.configurations[0][1]
    params = [mlflow.entities.Param("seeds", ",".join(map(str, plan.seed_values())))]
    if not plan.grid:
        params += [mlflow.entities.Param(k, str(v)) for k, v in first.to_dict().items() if k != "seed"]
    client.log_batch(parent_id, params=params)
    return parent_id


@dataclass(frozen=True)
class Target:
    """Where and how the seed runs train: the MLflow experiment and parent run, the placement, a scratch folder."""

    experiment_id: str
    parent_id: str
    placement: Placement
    device: torch.device  # in the driver and on this machine; a cluster's task trains on CUDA when it holds a GPU
    num_workers: int | None  # None: engine.loader_workers' rule
    workdir: Path
    data_root: str | None  # where a task on a cluster's node loads the dataset
    owner: dict[str, str]  # the tags naming this process on each run (locks.owner_tags)


class SeedRuns:
    """The driver's side of one configuration's seeds (a ``study.seeds.SeedRecorder``): a child run each, opened as its
    seed starts, its epochs logged and printed as they come, its output recorded (pictures, model, test metrics)."""

    def __init__(self, plan: FinalPlan, name: str, target: Target, register: str | None, example: np.ndarray, started: list[str]) -> None:
        self.plan, self.name, self.target, self.register, self.example, self.started = plan, name, target, register, example, started
        self.client = mlflow.MlflowClient()
        self.run_ids: dict[int, str] = {}
        self.jobs: dict[int, SeedJob] = {}
        self.results: dict[int, SeedResult] = {}
        self.members: dict[int, tuple[dict[str, Any], Embeddings]] = {}  # each seed's bundle and test embeddings, for the ensemble

    def origin(self) -> str:
        """Where the configuration came from, for a registered version's description."""
        return f"study {self.plan.study} (parent run {self.target.parent_id})" if self.plan.study else self.plan.source_of(self.name)

    def open_child(self, run_name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
        """A child run of the parent (a seed's or the ensemble's) with the common tags, ``tags`` and ``params``; its id,
        also appended to ``started``."""
        target = self.target
        tags = {**tracking.reproducibility_tags(), **target.owner, "mlflow.parentRunId": target.parent_id, **tags}
        if self.plan.study:
            tags["study_name"] = self.plan.study
        if self.plan.grid:
            tags["configuration"] = self.name
        run_id = self.client.create_run(target.experiment_id, run_name=run_name, tags=tags).info.run_id
        self.started.append(run_id)
        self.client.log_batch(run_id, params=[mlflow.entities.Param(k, str(v)) for k, v in params.items()])
        return run_id

    def start(self, job: SeedJob) -> None:
        config, trial = job.config, self.plan.seed_trial(job.index)
        tags = {"kind": "final_seed", "seed": str(config.seed)} | ({"optuna_trial": str(trial)} if trial is not None else {})
        self.run_ids[job.index] = self.open_child(self.plan.seed_run_name(self.name, config.seed), tags, config.to_dict())
        self.jobs[job.index] = job

    def epoch(self, report: EpochReport) -> None:
        metrics, now = report.metrics, int(time.time() * 1000)
        logged = [
            mlflow.entities.Metric(k, v, now, report.epoch) for k, v in metrics.items() if math.isfinite(v) and not k.startswith("test_")
        ]
        self.client.log_batch(self.run_ids[report.index], metrics=logged)
        shown = f"loss {metrics['train_loss']:.4f}  acc {metrics['train_accuracy']:.3f}"
        if "alpha_now" in metrics:
            shown += f"  alpha {metrics['alpha_now']:.2f}"
        if "test_recall_at_1" in metrics:
            shown += f"  test R@1 {metrics['test_recall_at_1']:.4f}"
        config = self.jobs[report.index].config
        print(
            f"  seed {config.seed}  epoch {report.epoch:3d}/{config.epochs}  {shown}  "
            f"lr {metrics['lr_now']:.2e}  ({metrics['time/epoch_s']:.1f} s)",
            flush=True,
        )

    def done(self, output: SeedOutput) -> None:
        """The seed's run gets its pictures, time, model (registered when it is the only seed) and linked test metrics, then
        ends; with more seeds its bundle and test embeddings are kept for :meth:`ensemble`."""
        run_id, workdir = self.run_ids[output.index], self.target.workdir
        origin = self.origin()
        with killed_on_signal(run_id):
            mlflow.set_tag("node", output.node)
            for file, data in output.pictures.items():
                (workdir / file).write_bytes(data)
                mlflow.log_artifact(str(workdir / file))
            mlflow.log_metric("time/total_s", output.time_s)
            register = self.register if output.index == 0 and self.plan.seeds == 1 else None  # else the ensemble is registered
            model_uri, registered_uri = record_model(output, self.example, workdir, register, origin)
        seed = self.jobs[output.index].config.seed
        trial = self.plan.seed_trial(output.index)
        self.results[output.index] = SeedResult(seed, run_id, output.test, output.time_s, model_uri, registered_uri, trial)
        if self.plan.seeds > 1 and output.embeddings is not None:
            self.members[output.index] = (output.bundle, output.embeddings)

    def ensemble(self, splits: DatasetSplits, config: TrainConfig) -> EnsembleResult:
        """The seeds as one model: a child run with the test metrics of their concatenated embeddings and the model."""
        from study.pyfunc import log_embedding_model

        members = [self.members[i] for i in sorted(self.members)]
        test = score(
            concatenated([embeddings for _, embeddings in members]), splits.test, splits.gallery,
            prefix="test", ks=splits.recall_ks, seed=config.seed, one_shot_ways=ONE_SHOT_WAYS,
        )  # fmt: skip
        configs = [self.jobs[i].config for i in sorted(self.members)]
        seed_values = [c.seed for c in configs]
        tags, params = {"kind": "final_ensemble", "seeds": " ".join(map(str, seed_values))}, {"ensemble_seeds": len(members)}
        tied = [(self.plan.seed_trial(i), c) for i, c in zip(sorted(self.members), configs, strict=True)] if self.plan.members else None
        if tied:
            tags["trials"] = params["ensemble_trials"] = " ".join(str(trial) for trial, _ in tied)
        run_id = self.open_child(self.plan.ensemble_run_name(self.name), tags, {**config.to_dict(), **params})
        with killed_on_signal(run_id):
            bundles, register, workdir = [bundle for bundle, _ in members], self.register, self.target.workdir
            info = log_embedding_model(bundles, self.example, workdir, name="embedding-ensemble", registered_model_name=register)
            registered = link_metrics(info, test, config, register, self.origin(), seed_values, tied)
        width = sum(c.embedding_dim for c in configs)
        return EnsembleResult(run_id, test, info.model_uri, registered, tuple(trial for trial, _ in tied or ()), width)


@contextlib.contextmanager
def killed_on_signal(run_id: str) -> Iterator[None]:
    """The existing run ``run_id`` made active; it ends FINISHED, FAILED on an error, and KILLED (with the signal as
    ``failure_reason``) when a signal stops the work inside, where MLflow's own context would end it FAILED."""
    with mlflow.start_run(run_id=run_id):
        try:
            yield
        except KeyboardInterrupt as error:
            mlflow.set_tag("failure_reason", f"stopped by {signal_name(error)}")
            mlflow.end_run(status="KILLED")
            raise


def train_configuration(
    plan: FinalPlan, name: str, config: TrainConfig, splits: DatasetSplits, target: Target, register: str | None, started: list[str]
) -> ConfigurationResult:
    """Train ``config`` over the plan's seeds where the target's placement says, one child run each; the run ids are
    appended to ``started``."""
    from study.pyfunc import input_example

    placement = target.placement
    device = ("cuda" if placement.gpus > 0 else "cpu") if placement.address else str(target.device)
    jobs = [
        SeedJob(i, plan.seed_config(config, i), device, target.num_workers, placement.threads, target.data_root) for i in range(plan.seeds)
    ]
    runs = SeedRuns(plan, name, target, register, input_example(splits.test), started)
    seeds.train_seeds(jobs, placement, splits, runs, train_seed)
    results = [runs.results[i] for i in range(plan.seeds)]
    summary = summarize([r.test for r in results]) | {"time_per_seed_s_mean": float(np.mean([r.time_s for r in results]))}
    ensemble = runs.ensemble(splits, config) if len(runs.members) > 1 else None
    if ensemble is not None:
        summary |= {f"ensemble_{key}": value for key, value in ensemble.test.items()}
    return ConfigurationResult(name, config, tuple(results), summary, ensemble)


def record_outcomes(client: mlflow.MlflowClient, parent_id: str, plan: FinalPlan, outcomes: list[ConfigurationResult]) -> None:
    """The parent run's results so far: results.json, and for one configuration the summary as metrics."""
    if plan.grid:
        client.log_dict(parent_id, {o.name: o.record() for o in outcomes}, "results.json")
        return
    (outcome,) = outcomes
    for key, value in outcome.summary.items():
        client.log_metric(parent_id, plan.prefix + key, value)
    client.log_dict(parent_id, outcome.record(), f"{plan.prefix}results.json")


def train_plan(
    client: mlflow.MlflowClient, plan: FinalPlan, splits: dict[tuple[str, int], DatasetSplits], target: Target, started: list[str]
) -> tuple[ConfigurationResult, ...]:
    """Every configuration of the plan, in order; the parent run's files are rewritten after each."""
    with uninterrupted():
        if plan.grid:
            client.log_dict(target.parent_id, {n: c.to_dict() for n, c in plan.configurations}, "configurations.yaml")
        else:
            config_file = inputs.write_yaml(target.workdir / f"{plan.prefix}config.yaml", plan.configurations[0][1].to_dict())
            client.log_artifact(target.parent_id, str(config_file))
    outcomes: list[ConfigurationResult] = []
    for index, (name, config) in enumerate(plan.configurations):
        if plan.grid:
            print(f"\n[{index + 1}/{len(plan.configurations)}] {name}", flush=True)
        data = splits[(config.dataset, config.image_size)]
        outcomes.append(train_configuration(plan, name, config, data, target, plan.register if index == 0 else None, started))
        with uninterrupted():
            record_outcomes(client, target.parent_id, plan, outcomes)
    return tuple(outcomes)


class StoppedWhenDone(StudyInterrupted):
    """A signal that waited for the last write of a final whose runs had all ended FINISHED."""


def run_final(args: argparse.Namespace) -> FinalResult:
    """Plan, check the input, then train under a parent run; a failure leaves no run RUNNING. A signal stops the
    training at once, but waits for the end of an MLflow write of the driver (``interrupts.uninterrupted``)."""
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    checks.check_address(args.address)  # before Ray: ray.init retries a dead address for minutes
    with locks.store_setup_lock(uri):  # --study reads the store: one driver at a time creates or migrates a new one
        plan = make_plan(args, uri)
    device = resolve_device(args.device)
    data_root = tracking.resolve_data_root(args.data_root) or plan.data_root
    splits = load_data(plan, data_root, args.download)  # every input error surfaces before a run is created
    with locks.store_setup_lock(uri):
        experiment_id = tracking.setup(uri, plan.experiment)
    client = mlflow.MlflowClient(uri)
    placement = placement_of(args, plan, device)
    first = plan.configurations[0][1]
    what = f"{len(plan.configurations)} configurations of {plan.name}" if plan.grid else f"{plan.name}: {first.loss}"
    shown = "" if placement.address else f", device {device}"
    print(f"final training of {what} on {first.dataset}, {first.epochs} epochs, seeds {plan.seed_values()}{shown}")
    print(f"the seeds train {placement.describe()}", flush=True)
    if plan.members:
        tie = ", ".join(f"Optuna #{plan.seed_trial(i)} (seed {seed})" for i, seed in enumerate(plan.seed_values()))
        print(f"the study's race could not tell its candidates apart: the seeds train {tie}, as one model (--members pick: the pick alone)")
    close_abandoned(client, experiment_id)
    # on a cluster, checks that a node holds one seed's task before any run exists
    with seeds.session(placement), locks.process_lock(tracking.runs_dir() / "locks", "final") as lock:
        owner = locks.owner_tags(lock)
        parent_id: str | None = None  # set once the parent run exists: a signal that waited for its writes marks it
        started: list[str] = []
        try:
            with uninterrupted():
                parent_id = open_parent(client, experiment_id, plan, owner)
            with tempfile.TemporaryDirectory() as tmp:
                target = Target(experiment_id, parent_id, placement, device, args.num_workers, Path(tmp), data_root, owner)
                outcomes = train_plan(client, plan, splits, target, started)
        except BaseException as error:
            mark_stopped(client, started, parent_id if plan.parent_run_id is None else None, error, in_study=False)
            raise
    try:
        with uninterrupted():
            if plan.parent_run_id is None:
                client.set_terminated(parent_id, status="FINISHED")
            elif plan.study and not plan.grid:  # the study's description ends with what its pick measured on the test classes
                note_study_retrained(client, parent_id, outcomes[0])
    except StudyInterrupted as error:  # it waited for the last write: nothing is left to mark
        raise StoppedWhenDone(error.signum) from None
    report = plan.study or (plan.run_name if plan.grid else None)
    return FinalResult(plan.name, uri, parent_id, outcomes, experiment=plan.experiment, experiment_id=experiment_id, report=report)


def close_abandoned(client: mlflow.MlflowClient, experiment_id: str) -> None:
    """Runs an earlier ``study.final`` on this host left RUNNING when it was killed (SIGKILL, the machine stopped: no
    handler ran) end KILLED, with its holder line as the reason: their owner lock (``locks.abandoned``) is no longer
    held. Runs of a live ``study.final``, or of another host, are left alone. Says how many it closed."""
    running = tracking.all_pages(
        client.search_runs,
        experiment_ids=[experiment_id],
        filter_string=tracking.run_filter({"attributes.status": "RUNNING", "tags.owner_host": socket.gethostname()}),
    )
    by_lock: dict[str, list] = {}  # a study.final's runs (its parent and seeds) share its lock: each lock read once
    for run in running:
        by_lock.setdefault(run.data.tags.get("owner_lock", ""), []).append(run)
    closed = []
    for lock, runs in by_lock.items():
        holder = locks.abandoned(lock)
        if holder is None:
            continue
        reason = f"orphaned: the study.final that trained it ({holder}) ended without closing it (killed, or its machine stopped)"
        tracking.fail_orphans(client, [run.info.run_id for run in runs], reason, status="KILLED")
        closed += [run.info.run_name for run in runs]
        Path(lock).unlink(missing_ok=True)  # its runs are closed
    if closed:
        print(f"marked KILLED {len(closed)} run(s) an earlier study.final left RUNNING when it was killed: {', '.join(sorted(closed))}")


def note_study_retrained(client, study_parent_id: str, outcome: ConfigurationResult) -> None:
    """The study's parent run description (``records.with_final``): the retrained pick's test metrics and its model."""
    note = client.get_run(study_parent_id).data.tags.get(records.NOTE_TAG, "")
    trials = outcome.ensemble.trials if outcome.ensemble is not None else ()
    text = records.with_final(note, outcome.summary, len(outcome.seeds), outcome.config.epochs, served_model(outcome), trials)
    client.set_tag(study_parent_id, records.NOTE_TAG, text)


# One 8 x 8 image, (N, H, W) = (1, 8, 8): a dark cross on white, drawn as Omniglot draws strokes; small enough to type.
CURL_IMAGE = [[0 if (1 <= r <= 6 and c in (3, 4)) or (1 <= c <= 6 and r in (3, 4)) else 255 for c in range(8)] for r in range(8)]


def serve_commands(uri: str, model_uri: str, port: int = 5001) -> list[str]:
    """Shell lines that serve ``model_uri`` over REST with this environment's mlflow, and ask it for one embedding.

    The environment's bin folder leads PATH because ``mlflow models serve``
    starts ``uvicorn`` from PATH: with only the full path to mlflow, an
    environment that is not activated fails with "uvicorn: not found".
    """
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a link out of its bin folder
    if tracking.is_local_sqlite(uri):  # the command must work from any folder
        uri = f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    tool = shlex.quote(str(bin_dir / "mlflow")) if (bin_dir / "mlflow").is_file() else "mlflow"
    serve = (
        f'PATH={shlex.quote(str(bin_dir))}:"$PATH" MLFLOW_TRACKING_URI={shlex.quote(uri)} '
        f"{tool} models serve -m {shlex.quote(model_uri)} --env-manager local -p {port}"
    )
    payload = json.dumps({"inputs": [CURL_IMAGE]}, separators=(",", ":"))
    curl = f"curl -s http://127.0.0.1:{port}/invocations -H 'Content-Type: application/json' -d '{payload}'"
    return [serve, curl]


def served_model(outcome: ConfigurationResult) -> str:
    """The model the closing lines serve: the seeds' ensemble (its registered version if any), else the first seed's."""
    chosen = outcome.ensemble or outcome.seeds[0]
    return chosen.registered_uri or chosen.model_uri


def print_serving(result: FinalResult) -> None:
    """How to serve the first configuration's model (:func:`served_model`) and query it."""
    model_uri = served_model(result.configurations[0])
    serve, curl = serve_commands(inputs.redacted(result.uri), model_uri)
    print(f"\nserve {model_uri} over REST (Ctrl-C stops it):\n  {serve}")
    print(f"then embed images (JSON lists of 0..255, (N, H, W) or (N, H, W, C); here one 8 x 8 image):\n  {curl}")


def print_grid_summary(result: FinalResult) -> None:
    keys = ("test_nmi", "test_recall_at_1", "test_recall_at_2", "test_recall_at_4", "test_recall_at_8", "test_map_at_r")
    print(f"\n{result.name}: test metrics over {len(result.configurations[0].seeds)} seed(s), mean +- std")
    print(f"  {'configuration':<28}" + "".join(f"{k.removeprefix('test_'):>18}" for k in keys))
    for c in result.configurations:
        cells = "".join(f"{c.summary[k + '_mean']:>10.4f} +-{c.summary[k + '_std']:.3f}" for k in keys)
        print(f"  {c.name:<28}{cells}")
    print(f"\nparent run: {result.parent_run_id}")
    print_next(result)


def report_command(result: FinalResult) -> str:
    """``python -m study.report --study NAME`` for the study or grid this command trained (with a remote store's URI)."""
    command = f"{console.python_command('study.report')} --study {result.report}"
    return command if tracking.is_local_sqlite(result.uri) else f"{command} --tracking-uri {shlex.quote(inputs.redacted(result.uri))}"


def print_next(result: FinalResult) -> None:
    """The MLflow UI command with the address of the experiment's runs table, the report command (a study's or a grid's),
    the serve commands and where library warnings went."""
    print(f"\nopen the MLflow UI:  {console.ui_command(inputs.redacted(result.uri), result.experiment_id or None)}")
    if result.report:
        print(f"write the report (tables, curves, retrieval grids, t-SNE maps):  {report_command(result)}")
    print_serving(result)
    if result.log:
        print(f"\nwarnings and library logs: {result.log}")


def print_summary(result: FinalResult) -> None:
    if result.grid:
        print_grid_summary(result)
        return
    (only,) = result.configurations
    summary = only.summary
    keys = [k.removesuffix("_mean") for k in summary if k.endswith("_mean") and k.startswith("test_")]
    print(f"\n{result.name}: test metrics over {len(only.seeds)} seed(s) (mean +- std)")
    for key in keys:
        print(f"  {key:<24} {summary[key + '_mean']:.4f} +- {summary[key + '_std']:.4f}")
    print(f"  {'time per seed':<24} {summary['time_per_seed_s_mean']:.0f} s")
    print(f"\nparent run: {result.parent_run_id}")
    for seed in only.seeds:
        print(f"  model: {seed.model_uri}  (run {seed.run_id})")
        if seed.registered_uri:
            print(
                f"  registered as: {seed.registered_uri}: the first seed's model, seed {seed.seed} (the config's own); "
                "picking the seed by its test score would tune on the test classes"
            )
    if only.ensemble:
        print_ensemble(only)
    print_next(result)


def print_ensemble(outcome: ConfigurationResult) -> None:
    """The seeds (or a study's tied candidates) as one model: its test metrics beside the members' mean, and its model."""
    ensemble, n = outcome.ensemble, len(outcome.seeds)
    what = f"the {n} seeds" if not ensemble.trials else f"the study's tied candidates ({', '.join(f'#{t}' for t in ensemble.trials)})"
    wide = f"{ensemble.width} wide" if ensemble.trials else f"{n} x {outcome.config.embedding_dim} wide"
    print(f"\n{what} as one model (their embeddings side by side, {wide}; {n} x the cost to embed):")
    for key, value in ensemble.test.items():
        print(f"  {key:<24} {value:.4f}  ({'members' if ensemble.trials else 'seeds'}' mean {outcome.summary[key + '_mean']:.4f})")
    print(f"  model: {ensemble.model_uri}  (run {ensemble.run_id})")
    if ensemble.registered_uri:
        print(f"  registered as: {ensemble.registered_uri}: {what} as one model")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
        tracking.check_store(tracking.resolve_tracking_uri(args.tracking_uri), "study.final")  # before its log file
        with StopSignals().installed(), console.library_output_to(console.log_path("study.final")) as log:
            inputs.redact_logs()
            result = dataclasses.replace(run_final(args), log=log)  # SIGTERM and SIGHUP raise as SIGINT does: the runs end KILLED
    except INPUT_ERRORS as error:
        return inputs.print_error(error)
    except StoppedWhenDone as error:
        print(f"study.final stopped by {error.name} as it ended: its runs had ended FINISHED, every result recorded", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as error:
        print(
            f"study.final stopped by {signal_name(error)}: its runs are marked KILLED (nothing to resume; run the command again)",
            file=sys.stderr,
        )
        return exit_code(error)
    except TrainingDiverged as error:
        print(f"error: training diverged: {error}", file=sys.stderr)
        return 1
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

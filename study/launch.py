"""python -m study.launch: a hyperparameter study with Optuna TPE + ASHA on Ray, recorded in MLflow.

Every trial trains the training core on the fit classes and is scored on the
validation classes (never on the test classes). Optuna's TPE (seeded)
proposes configs from a YAML search space; ASHA stops weak trials at rungs
measured in epochs, and those trials reach Optuna as PRUNED. The driver writes
one MLflow parent run per study and one child run per trial; at the end the
parent gets best_config.yaml, a CSV of all trials and plots. Then
`python -m study.final --study NAME` retrains the best config and tests it.

Examples:
  python -m study.launch                                   # default space, Omniglot, local Ray/MLflow/Optuna
  python -m study.launch --space smoke --num-samples 4     # a quick check of a set-up (generated data)
  python -m study.launch --space search_spaces/ice.yaml --num-samples 40 --epochs 20 --address auto
  python -m study.launch --study-name NAME --resume        # continue an interrupted study
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import optuna

from study import checks, console, interrupts, locks, records, tracking
from study.interrupts import StopSignals, env_set
from study.journal import journal_file
from study.outcome import is_finite_number
from study.schedulers import SCHEDULERS, describe
from study.selection import Selection, confirmed_trial, rerun_candidates, select, selection_record
from study.spaces import Space, SpaceError, load_space, parse_space, resolve_pretrained
from study.tracking import UsageError
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import DATA_ROOT_ENV, DatasetError, check_retrieval_set, dataset_label, load_dataset, validation_split

log = logging.getLogger(__name__)

METRICS = {"val_recall_at_1": "max", "val_map_at_r": "max", "val_nmi": "max", "val_r_precision": "max"}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
INPUT_ERRORS = (UsageError, ConfigError, DatasetError, SpaceError)
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a study file could not be written: one line and the resume command


# ----------------------------------------------------------------------------- the command line
def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.launch", description=doc[1], epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_search_flags(parser.add_argument_group("what to search").add_argument)
    add_cluster_flags(parser.add_argument_group("where trials run").add_argument)
    add_record_flags(parser.add_argument_group("where the study is recorded").add_argument)
    return parser


def add_search_flags(a: Callable[..., argparse.Action]) -> None:
    """The space, its data, the budget and how trials are sampled, stopped and confirmed."""
    a(
        "--space",
        help="search space: a YAML file, or the name of a shipped one in search_spaces/ "
        "(default, heated_softmax, ice, paper_ablation, smoke, and the repro_* grids of docs/results.md); "
        "default: default (with --resume: the study's own)",
    )
    a("--dataset", help="override the space's dataset (omniglot, cub200, cars196, sop, inshop, folder, synthetic)")
    a("--data-root", help=f"folder holding the datasets (default: ${DATA_ROOT_ENV}); every node of a cluster needs it at this path")
    a("--num-samples", type=int, help="number of trials (default: 16; a grid space runs each grid point once)")
    a("--epochs", type=int, help="epochs per trial, the ASHA max_t (default: the space's epochs)")
    a(
        "--scheduler",
        choices=SCHEDULERS,
        help="early stopping: budget (default; successive halving where every rung judges a schedule scaled to its budget, "
        "heating and lr decay included), asha (stock ASHA, judging mid-schedule: the baseline) or fifo (none)",
    )
    a("--grace-period", type=int, help="the first rung, in epochs (default: a quarter of the epochs)")
    a("--reduction-factor", type=float, help="keep the top 1/factor at each rung (default 4)")
    a("--metric", default="val_recall_at_1", help=f"validation metric to maximize: {', '.join(METRICS)} (default val_recall_at_1)")
    a(
        "--sampler",
        choices=("tpe", "random"),
        default="tpe",
        help="how a searched space is sampled: tpe (default; ASHA-stopped trials told as PRUNED) or random (a baseline); "
        "grid spaces always use the grid",
    )
    a("--seed", type=int, default=0, help="seed of the sampler (trials keep their config's seed)")
    a("--confirm-top", type=int, default=3, help="before naming the best, re-run this many top complete trials (default 3)")
    a(
        "--confirm-seeds",
        type=int,
        default=1,
        help="extra seeds each of them is re-run with at the full budget; the best mean wins (default 1; 0: name the single best score)",
    )


def add_cluster_flags(a: Callable[..., argparse.Action]) -> None:
    """The Ray cluster, the resources of a trial, and what happens when a trial fails."""
    a("--address", help="join a running Ray cluster (e.g. 'auto' on a node of a `ray up` cluster); default: a local Ray")
    a(
        "--max-concurrent",
        type=int,
        help="trials running at once (default: as many as the cluster's CPUs and GPUs hold at --cpus-per-trial / --gpus-per-trial)",
    )
    a("--cpus-per-trial", type=float, default=1.0, help="CPUs reserved per trial (default 1); torch uses that many threads")
    a("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial; fractions pack several trials on one GPU (default 0)")
    a("--max-failures", type=int, default=1, help="retries of a failed trial from its last checkpoint (default 1)")
    a(
        "--reuse-actors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a new trial in the worker process of a finished one, without a new process and fresh imports (default: on)",
    )


def add_record_flags(a: Callable[..., argparse.Action]) -> None:
    """The stores (Ray checkpoints, MLflow, Optuna) and the study's name."""
    a("--storage-path", help="where Ray keeps trial checkpoints; on a cluster a shared path or s3:// URI (default: ./runs/ray)")
    a("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else a local sqlite store under ./runs)")
    a("--optuna-storage", help="Optuna storage: journal:PATH or a database URL (default: journal:./runs/optuna/journal.log)")
    a("--experiment", default="dml-studies", help="MLflow experiment name (default dml-studies)")
    a("--study-name", help="name of the study (letters, digits, _ . -); default: <space>-<date>-<time>")
    a(
        "--resume",
        action="store_true",
        help="continue the interrupted study --study-name: finished trials are kept, interrupted ones continue from their checkpoints",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, each flag checked on its own (what needs the space or the dataset is checked in ``study_settings``)."""
    parser = build_parser()
    args = parser.parse_args(argv)

    def bad(flag: str, value: Any, expected: str) -> None:
        parser.error(f"{flag} {value}: expected {expected}")

    if args.num_samples is not None and args.num_samples < 1:
        bad("--num-samples", args.num_samples, "an integer >= 1")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        bad("--max-concurrent", args.max_concurrent, "an integer >= 1")
    if not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        bad("--cpus-per-trial", args.cpus_per_trial, "a finite number > 0")
    if not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        bad("--gpus-per-trial", args.gpus_per_trial, "a finite number >= 0")
    if args.epochs is not None and args.epochs < 1:
        bad("--epochs", args.epochs, "an integer >= 1")
    if args.confirm_top < 1:
        bad("--confirm-top", args.confirm_top, "an integer >= 1")
    if args.confirm_seeds < 0:
        bad("--confirm-seeds", args.confirm_seeds, "an integer >= 0")
    if args.grace_period is not None and args.grace_period < 1:
        bad("--grace-period", args.grace_period, "an integer >= 1")
    if args.reduction_factor is not None and not (math.isfinite(args.reduction_factor) and args.reduction_factor > 1):
        bad("--reduction-factor", args.reduction_factor, "a finite number > 1")
    if args.metric not in METRICS:
        bad("--metric", args.metric, f"one of {', '.join(METRICS)}")
    if args.max_failures < 0:
        bad("--max-failures", args.max_failures, "an integer >= 0")
    if args.study_name is not None and (not NAME_PATTERN.match(args.study_name) or ".." in args.study_name):
        bad("--study-name", repr(args.study_name), "letters, digits, '_', '.', '-' (no path separators or '..'), at most 100")
    if args.resume and not args.study_name:
        parser.error("--resume needs --study-name NAME (the study to continue)")
    args.given = given_flags(parser, argv)
    return args


def given_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> frozenset[str]:
    """The flags the command line sets itself, defaults aside (``--resume`` takes the others from the study)."""
    unset = object()
    probe = argparse.Namespace(**{dest: unset for dest in vars(parser.parse_args([]))})
    return frozenset(dest for dest, value in vars(parser.parse_args(argv, probe)).items() if value is not unset)


# flags that define a study: the parent-run param that records each, and its type; --resume continues with the recorded value
RECORDED_FLAGS = {
    "space": ("space", str),
    "dataset": ("fixed.dataset", str),
    "epochs": ("epochs", int),
    "num_samples": ("num_samples", int),
    "scheduler": ("scheduler", str),
    "grace_period": ("grace_period", int),
    "reduction_factor": ("reduction_factor", float),
    "sampler": ("sampler", str),
    "seed": ("seed", int),
    "metric": ("metric", str),
    "confirm_top": ("confirm_top", int),
    "confirm_seeds": ("confirm_seeds", int),
    "max_concurrent": ("max_concurrent", int),
    "cpus_per_trial": ("cpus_per_trial", float),
    "gpus_per_trial": ("gpus_per_trial", float),
}
UNRECORDED_FLAGS = ("max_failures", "reuse_actors")  # kept in the study's Tune state, which --resume restores as it was


def recorded_value(flag: str, text: str) -> Any:
    kind = RECORDED_FLAGS[flag][1]
    return int(float(text)) if kind is int else kind(text)


def resumed_args(args: argparse.Namespace, resumed: dict[str, str]) -> argparse.Namespace:
    """With --resume: each study-defining flag takes the study's recorded value; a flag given with another value is refused."""
    for flag in sorted(args.given & set(UNRECORDED_FLAGS)):
        raise UsageError(f"--{flag.replace('_', '-')}: not changeable on --resume (the study keeps its own); drop it")
    values = {}
    for flag, (key, _) in RECORDED_FLAGS.items():
        if key not in resumed or (flag == "sampler" and resumed[key] == "grid"):
            continue  # a study recorded before this setting existed, or a grid space (no sampler applies)
        values[flag] = recorded_value(flag, resumed[key])
        given = getattr(args, flag)
        if flag in args.given and given != values[flag] and not (flag == "space" and load_space(given).path == values[flag]):
            raise UsageError(
                f"--{flag.replace('_', '-')} {given}: study {args.study_name} runs with {resumed[key]}; "
                "--resume continues a study with its own settings (drop the flag, or start a new study)"
            )
    return argparse.Namespace(**{**vars(args), **values})


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class StudySettings:
    """Everything a study runs with, resolved once from the command line (with --resume, from the study's parent run too)."""

    name: str
    space: Space  # with --dataset and --epochs applied
    max_epochs: int  # every trial's full budget
    num_samples: int
    metric: str
    mode: str
    sampler: str
    seed: int
    scheduler: str  # budget, asha or fifo (study.schedulers)
    grace_period: int
    reduction_factor: float
    max_concurrent: int | None  # None: as many as the cluster holds (``slots``)
    cpus_per_trial: float
    gpus_per_trial: float
    max_failures: int
    reuse_actors: bool  # trials run in the worker processes of finished ones (docs/benchmarks.md, study utilization)
    confirm_top: int  # the top complete trials re-run with extra seeds before the best is named
    confirm_seeds: int
    data_root: str | None  # absolute: Tune runs each trial in its own working directory
    fit_classes: int
    address: str | None
    storage_path: str
    optuna_storage: str
    tracking_uri: str
    experiment: str
    resume: bool

    @functools.cached_property
    def early_stopping(self):
        """The Ray Tune scheduler and the budgets every trial trains through (study.schedulers), built once."""
        from study.schedulers import make_early_stopping

        return make_early_stopping(self.scheduler, self.max_epochs, self.grace_period, self.reduction_factor, self.stratify_by)

    @functools.cached_property
    def slots(self) -> int:
        """Trials at once: --max-concurrent, else as many as the Ray cluster's CPUs and GPUs hold (before Ray starts: this machine's)."""
        if self.max_concurrent is not None:
            return self.max_concurrent  # as given: an autoscaling cluster may grow to it
        import ray

        from study.utilization import concurrent_slots

        resources = ray.cluster_resources() if ray.is_initialized() else {"CPU": float(os.cpu_count() or 1)}  # a local Ray's
        return concurrent_slots(10**6, resources.get("CPU", 1.0), self.cpus_per_trial, resources.get("GPU"), self.gpus_per_trial)

    @property
    def rerun_seeds(self) -> int:
        """The extra seeds of each top trial's confirmation re-runs (study.selection): none on a grid."""
        return 0 if self.space.is_grid else self.confirm_seeds

    @property
    def reruns(self) -> int:
        """The confirmation re-runs the study's Tuner trains at most, after its ``num_samples`` trials."""
        return self.confirm_top * self.rerun_seeds

    @property
    def stratify_by(self) -> str | None:
        """The key whose values are compared apart by the budget scheduler: the loss family, when the space searches it."""
        searched = {p.name for p in self.space.params} | set(self.space.grid)
        return "loss" if "loss" in searched else None

    @property
    def experiment_dir(self) -> str:
        """The Tune experiment's folder (or URI) under --storage-path."""
        return os.path.join(self.storage_path, self.name)

    def parent_params(self) -> dict[str, Any]:
        """What the study's MLflow parent run records; --resume reads ``space`` and ``epochs`` back."""
        return {
            "space": self.space.path,
            "scheduler": self.scheduler,
            "budgets": " ".join(str(b) for b in self.early_stopping.budgets),
            "stratify_by": self.stratify_by or "none",
            "grace_period": self.grace_period,
            "reduction_factor": self.reduction_factor,
            "max_concurrent": self.slots,
            "reuse_actors": self.reuse_actors,
            "cpus_per_trial": self.cpus_per_trial,
            "gpus_per_trial": self.gpus_per_trial,
            "seed": self.seed,
            "sampler": "grid" if self.space.is_grid else self.sampler,
            "metric": self.metric,
            "mode": self.mode,
            "num_samples": self.num_samples,
            "epochs": self.max_epochs,
            "final_epochs": self.space.final_epochs(self.max_epochs),  # what study.final --study trains the pick to
            "optuna_storage": self.optuna_storage,
            "storage_path": self.storage_path,
            "fit_classes": self.fit_classes,
            "confirm_top": self.confirm_top,
            "confirm_seeds": self.confirm_seeds,
            **({"data_root": self.data_root} if self.data_root else {}),
            **{f"fixed.{k}": v for k, v in self.space.fixed.items()},
        }


# flags that StudySettings takes as they are
PLAIN_FLAGS = (
    "metric",
    "sampler",
    "seed",
    "max_concurrent",
    "cpus_per_trial",
    "gpus_per_trial",
    "max_failures",
    "reuse_actors",
    "confirm_top",
    "confirm_seeds",
    "address",
    "experiment",
    "resume",
)


def study_settings(args: argparse.Namespace) -> StudySettings:
    """Resolve and check the command line once: MLflow reachable, the space, the dataset, the storage paths."""
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    tracking.check_tracking_uri(uri)
    tracking.check_reachable(uri)
    tracking.experiment_artifacts(uri, args.experiment)
    checks.check_address(args.address)  # before Ray: ray.init retries a dead address for minutes
    optuna_storage = checks.check_optuna_storage(args.optuna_storage or f"journal:{tracking.runs_dir() / 'optuna' / 'journal.log'}")
    resumed = records.resumed_params(uri, args.experiment, args.study_name) if args.resume else {}
    if resumed:
        args = resumed_args(args, resumed)
    space = prepare_space(args, resumed)
    max_epochs = base_config(space).epochs
    scheduler, grace_period, reduction_factor = early_stopping_flags(args, resumed, max_epochs)
    data_root = tracking.resolve_data_root(args.data_root)
    fit_classes = check_dataset(space, data_root)
    name = args.study_name or f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = tracking.runs_dir()
    storage_path = check_storage(args.storage_path or str(runs / "ray"))
    if args.resume and "://" not in storage_path and not Path(storage_path, name).is_dir():
        raise UsageError(f"--resume: no study {name!r} under {storage_path}; expected the --study-name of an interrupted study")
    return StudySettings(
        name=name,
        space=space,
        max_epochs=max_epochs,
        num_samples=args.num_samples or (space.grid_size() if space.is_grid else 16),
        mode=METRICS[args.metric],
        data_root=data_root,
        fit_classes=fit_classes,
        storage_path=storage_path,
        optuna_storage=optuna_storage,
        tracking_uri=uri,
        scheduler=scheduler,
        grace_period=grace_period,
        reduction_factor=reduction_factor,
        **{flag: getattr(args, flag) for flag in PLAIN_FLAGS},
    )


def early_stopping_flags(args: argparse.Namespace, resumed: dict[str, str], max_epochs: int) -> tuple[str, int, float]:
    """--scheduler, --grace-period, --reduction-factor: the flag, else the resumed study's, else the default."""
    scheduler = args.scheduler or resumed.get("scheduler") or ("asha" if resumed else "budget")  # studies before budgets ran ASHA
    grace = args.grace_period or int(resumed.get("grace_period", 0)) or max(1, max_epochs // 4)
    factor = args.reduction_factor or float(resumed.get("reduction_factor", 0)) or 4.0
    if grace > max_epochs:
        raise UsageError(f"--grace-period {grace}: larger than the {max_epochs} epochs per trial; expected <= {max_epochs}")
    return scheduler, grace, factor


def prepare_space(args: argparse.Namespace, resumed: dict[str, str] | None = None) -> Space:
    """The space of --space with --dataset / --epochs applied, validated as a whole.

    ``resumed``, the parent run's params of a resumed study, gives the space and epochs the command line leaves out.
    """
    resumed = resumed or {}
    space = load_space(args.space or resumed.get("space") or "default")
    epochs = args.epochs if args.epochs is not None else (int(resumed["epochs"]) if "epochs" in resumed else None)
    overrides = {k: v for k, v in (("dataset", args.dataset), ("epochs", epochs)) if v is not None}
    if overrides:
        searched = {p.name for p in space.params} | set(space.grid) | {k for v in space.variants.values() for k in v}
        clash = sorted(searched & set(overrides))
        if clash:
            raise SpaceError(f"{space.path}: {clash[0]} is set by the space's params, grid or variants; drop --{clash[0]}")
        data = tracking.read_yaml(space.path, "a search space")
        data["fixed"] = {**(data.get("fixed") or {}), **overrides}
        space = parse_space(data, space.path)
    return resolve_pretrained(space, Path.cwd())  # trials run in folders of their own


# ----------------------------------------------------------------------------- checks
def base_config(space: Space) -> TrainConfig:
    """The config of the space's fixed values (first variant for a variants space): dataset, epochs, ..."""
    first = {"variant": next(iter(space.variants))} if space.variants else {}
    return TrainConfig.from_dict(space.to_config(first), source=space.path)


def max_classes_per_batch(space: Space) -> int:
    """The largest classes_per_batch any trial of ``space`` can get."""
    default = int(space.fixed.get("classes_per_batch", TrainConfig().classes_per_batch))
    values = [int(v.get("classes_per_batch", default)) for v in space.variants.values()]
    values += [int(v) for v in space.grid.get("classes_per_batch", [])]
    searched = [p for p in space.params if p.name == "classes_per_batch"]
    for p in searched:
        if p.choices:
            values.append(max(int(c) for c in p.choices))
        elif isinstance(p.high, dict) or isinstance(p.low, dict):
            values.append(10**9)  # bounded by another parameter: checked trial by trial by the sampler's draws
        else:
            step = p.step or 1
            values.append(int(p.low + ((p.high - p.low) // step) * step))
        if p.when:
            values.append(default)  # inactive in some trials: the default applies there
    if not values:
        values.append(default)
    return max(values)


def check_dataset(space: Space, data_root: str | None) -> int:
    """Load the dataset once on the driver: the space must be able to fill its batches. Returns #fit classes."""
    config = base_config(space)
    splits = load_dataset(config.dataset, data_root, config.image_size)
    where = dataset_label(config.dataset, data_root)
    fit_classes, val_classes = validation_split(splits.train, config.val_split, config.val_fraction, where)
    check_retrieval_set(splits.train.with_classes(val_classes), None, f"{where}: the validation classes")
    largest = max_classes_per_batch(space)
    if largest > len(fit_classes):
        raise SpaceError(
            f"{space.path}: classes_per_batch reaches {largest}, but {config.dataset!r} has {len(fit_classes)} fit classes "
            f"(val_split {config.val_split}, val_fraction {config.val_fraction}); expected classes_per_batch <= {len(fit_classes)}"
        )
    return len(fit_classes)


def check_storage(path: str) -> str:
    """A local storage path must be a writable folder; URIs (s3://, gs://) are left to Ray."""
    if "://" in path:
        return path
    return str(tracking.check_writable(path, "--storage-path", probe_bytes=1024 * 1024))  # a full disk fails here, not mid-study


# ----------------------------------------------------------------------------- the study
# Ray Tune adds CSV, JSON and TensorBoard loggers to every fit() unless this is "1": a study passes the CSV and JSON
# loggers itself and leaves TensorBoard out. MLflow holds every metric, and tensorboardX imports torch into the driver
# just as the trials' workers start (about 1 s of CPU they wait for on a small machine) and writes each result again.
AUTO_LOGGERS_FLAG = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
# a local Ray listens on the loopback only (Ray reads this when it is imported), runs trials at normal priority (Ray's
# default niceness of 15 starves them beside any other work on the machine), and starts no idle workers ahead of need:
# by default it prestarts one per CPU as the driver connects, each importing Ray (about 0.7 CPU-s) beside the driver's
# own start-up, and Tune's trial actors never use them (each starts a worker of its own). These are Ray's system settings
# (RAY_ + the setting's name): Ray ignores a name it no longer knows, so tests/test_local_ray.py checks each one's effect
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_worker_niceness": "0", "RAY_prestart_worker_first_driver": "0"}


def local_ray_env(address: str | None) -> None:
    """Without --address, the environment of the local Ray (LOCAL_RAY_ENV; a user's own settings win). Before ``import ray``."""
    if address is None:
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray for the length of the study; without --address always a fresh local Ray, never one that happens to run here.

    The local Ray binds to 127.0.0.1 only when this is the first import of Ray in the process (as in ``main``).
    """
    local_ray_env(address)
    import ray

    ray.init(
        address=address or "local",
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
        runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}} if address is None else None,
    )
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()


def open_optuna(settings: StudySettings, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The study's Optuna study: created, or with --resume loaded."""
    names = set(optuna.get_all_study_names(storage))
    if settings.resume:
        if settings.name not in names:
            raise UsageError(f"--resume: no Optuna study {settings.name!r} in {settings.optuna_storage}; expected an existing study name")
        return optuna.load_study(study_name=settings.name, storage=storage)
    if settings.name in names:
        raise UsageError(
            f"--study-name {settings.name}: a study of that name exists in {settings.optuna_storage}; "
            "pass --resume to continue it or choose another name"
        )
    return optuna.create_study(study_name=settings.name, storage=storage, direction="maximize" if settings.mode == "max" else "minimize")


def open_study(settings: StudySettings, client, experiment_id: str, parent_id: str | None) -> tuple[optuna.Study, str]:
    """The Optuna study and the MLflow parent run, created together (with --resume: found); returns the parent's run id."""
    from study.search import open_storage

    checks.check_cluster_resources(settings.cpus_per_trial, settings.gpus_per_trial)  # else trials would wait forever
    journal = journal_file(settings.optuna_storage)
    if journal is not None:  # its folder, checked at launch, may have been removed since (a long-queued --resume)
        Path(journal).parent.mkdir(parents=True, exist_ok=True)
    storage = open_storage(settings.optuna_storage)
    study = open_optuna(settings, storage)
    if parent_id is not None:
        records.reopen(client, experiment_id, parent_id)
        return study, parent_id
    try:
        return study, records.create_parent_run(client, experiment_id, settings.name, settings.space.path, settings.parent_params())
    except BaseException:
        optuna.delete_study(study_name=settings.name, storage=storage)  # no half-created study
        raise


def trainable(settings: StudySettings):
    """The trainable with its runtime settings and resources: the scheduler's ladder of budgets (one schedule for a re-run)."""
    from ray import tune

    from study.selection import train_trial

    return tune.with_resources(
        tune.with_parameters(train_trial, data_root=settings.data_root, budgets=list(settings.early_stopping.budgets)),
        {"cpu": settings.cpus_per_trial, "gpu": settings.gpus_per_trial},
    )


def new_tuner(settings: StudySettings, recorder: records.TrialRecorder):
    """A Tuner of the study: the Optuna searcher and then the confirmation re-runs (at most --max-concurrent trials at
    once), the scheduler, MLflow and progress callbacks."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.search import ConcurrencyLimiter

    from study.callbacks import MlflowTrials, Progress
    from study.search import ConfirmingSearcher

    s = settings
    searcher = ConfirmingSearcher(
        s.space, s.optuna_storage, s.name, trials=s.num_samples, top=s.confirm_top, seeds=s.rerun_seeds,
        metric=s.metric, mode=s.mode, max_epochs=s.max_epochs, seed=s.seed, sampler=s.sampler,
    )  # fmt: skip
    scheduler = s.early_stopping.scheduler
    return tune.Tuner(
        trainable(s),
        tune_config=tune.TuneConfig(
            metric=s.metric,
            mode=s.mode,
            num_samples=s.num_samples + s.reruns,
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=s.slots),
            scheduler=scheduler,
            reuse_actors=s.reuse_actors,
        ),
        run_config=tune.RunConfig(
            name=s.name,
            storage_path=s.storage_path,
            verbose=0,
            callbacks=[
                MlflowTrials(recorder, s.metric, s.max_epochs),
                Progress(s.metric, s.mode, s.max_epochs, s.num_samples, s.reruns),
                CSVLoggerCallback(),
                JsonLoggerCallback(),
            ],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            failure_config=tune.FailureConfig(max_failures=s.max_failures),
        ),
    )


def restored_tuner(settings: StudySettings, study: optuna.Study, recorder: records.TrialRecorder):
    """The interrupted study's Tuner, after the records it kept are written and its orphaned Optuna trials are FAIL."""
    from ray import tune

    recorder.flush(force=True)  # records an interrupted study kept while MLflow was away
    records.reconcile_before_resume(study, settings.experiment_dir)
    return tune.Tuner.restore(settings.experiment_dir, trainable(settings), resume_unfinished=True, resume_errored=False)


def selection_of(settings: StudySettings, study: optuna.Study, results) -> Selection | None:
    """The top complete trials ranked by their mean over their own score and their re-runs' (study.selection);
    None when nothing was re-run (a grid, --confirm-seeds 0, fewer than two complete trials). ``results``: the
    Tuner's ResultGrid, re-runs included."""
    s = settings
    complete = {t.number: t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))}
    numbers = rerun_candidates(complete, s.confirm_top, s.mode, s.rerun_seeds)
    if not numbers:
        return None
    reruns = {n: {} for n in numbers}  # Optuna trial -> {seed: score}
    for result in results:
        n, value = confirmed_trial(result.config), (result.metrics or {}).get(s.metric)
        if n in reruns and result.error is None and is_finite_number(value):
            reruns[n][int(result.config["seed"])] = float(value)
    selection = select({n: [complete[n], *(v for _, v in sorted(reruns[n].items()))] for n in numbers}, s.mode)
    study.set_user_attr("selection", selection_record(selection))  # the Optuna storage keeps it for study.sync
    return selection


class NothingToRun(Exception):
    """--resume of a study that has finished."""


def print_header(s: StudySettings) -> None:
    import ray

    ray_address = ray.get_runtime_context().gcs_address
    reruns = f", then the top {s.confirm_top} re-run with {s.confirm_seeds} more seed(s) each" if s.reruns else ""
    print(
        f"study {s.name}: {s.num_samples} trials of up to {s.max_epochs} epochs{reruns}, space {s.space.path}, "
        f"{s.metric} ({s.mode}), {s.slots} at once, {describe(s.early_stopping)}; Ray at {ray_address}",
        flush=True,
    )


def run_study(settings: StudySettings) -> dict[str, Any]:
    """Run the study to its end; returns what ``records.print_summary`` prints.

    Whatever stops it early leaves its MLflow runs marked stopped (``records.stopped_on_failure``) and no Ray running;
    a signal stops it as ``study.interrupts`` says, resumable. A second driver of the same study fails at once (``study.locks``).
    """
    s = settings
    experiment_id = tracking.setup(s.tracking_uri, s.experiment)
    client = mlflow.MlflowClient(s.tracking_uri)
    with locks.study_lock(locks.lock_folder(s.optuna_storage, tracking.runs_dir()), s.name):
        parent_id = records.existing_parent(client, experiment_id, s.name, resume=s.resume, experiment=s.experiment)
        if s.resume and client.get_run(parent_id).info.status == "FINISHED":
            raise NothingToRun(s.name)
        ray_started = time.time()
        with ray_session(s.address), StopSignals().installed() as stops:
            with stops.deferred():  # no half-created study
                study, parent_id = open_study(s, client, experiment_id, parent_id)
                records.describe_optuna_study(study, parent_id, s.space.path, s.metric)
            started = time.time()
            usage = {"slots": s.slots, "startup_s": started - ray_started, "since": started}  # Ray's start-up apart
            with records.stopped_on_failure(client, experiment_id, parent_id):
                recorder = records.TrialRecorder(s.tracking_uri, experiment_id, parent_id, s.name, records.spool_path(s.name))
                tuner = restored_tuner(s, study, recorder) if s.resume else new_tuner(s, recorder)
                print_header(s)
                try:
                    with stops.graceful(), env_set(AUTO_LOGGERS_FLAG, "1"):
                        results = tuner.fit()
                finally:  # Tune does not reach its callbacks' on_experiment_end on every way out of fit()
                    records.stop_writers()
                selection = selection_of(s, study, results)
                with stops.deferred():
                    summary = records.finish_study(study, recorder, s.metric, s.mode, time.time() - started, selection, usage)
    named = {"study_name": s.name, "uri": s.tracking_uri, "parent_run_id": parent_id, "experiment": s.experiment}
    return {**named, "final_epochs": s.space.final_epochs(s.max_epochs), **summary}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tracking.configure_mlflow()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    args = parse_args(argv)
    settings = None
    try:
        with locks.store_setup_lock(tracking.resolve_tracking_uri(args.tracking_uri)):  # one driver migrates a new store
            settings = study_settings(args)
            tracking.setup(settings.tracking_uri, settings.experiment)
        local_ray_env(settings.address)
        import ray  # noqa: F401  (its import installs the console handler that library_output_to replaces)

        with console.library_output_to(console.log_path(settings.name)):
            outcome = run_study(settings)
    except INPUT_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except NothingToRun:
        print(f"study {settings.name} has finished: nothing left to run, nothing written. {next_steps(settings)}")
        return 0
    except KeyboardInterrupt as error:
        print(interrupted_message(error, settings), file=sys.stderr)
        return interrupts.exit_code(error)
    except OSError as error:
        if error.errno not in DISK_ERRORS:
            raise
        print(f"error: {error.filename or 'a study file'}: {os.strerror(error.errno)}; {resume_hint(settings)}", file=sys.stderr)
        return 1
    records.print_summary(outcome, settings.metric)
    return 0


def next_steps(settings: StudySettings) -> str:
    report, final = console.python_command("study.report"), console.python_command("study.final")
    return f"Its report: {report} --study {settings.name}; its best config retrained: {final} --study {settings.name}"


def resume_hint(settings: StudySettings | None) -> str:
    if settings is None:
        return "nothing was started"
    return f"its state is saved: continue it with  {console.python_command('study.launch')} --study-name {settings.name} --resume"


def interrupted_message(error: KeyboardInterrupt, settings: StudySettings | None) -> str:
    """What the driver says when a signal stops it."""
    what = f"study {settings.name}" if settings is not None else "study.launch"
    return f"{what} stopped by {interrupts.signal_name(error)}; {resume_hint(settings)}"


if __name__ == "__main__":
    sys.exit(main())

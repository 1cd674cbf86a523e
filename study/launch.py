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
import dataclasses
import errno
import functools
import logging
import math
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import optuna

from study import checks, console, heap, inputs, interrupts, locks, names, parent, records, tracking, tunestate
from study.inputs import REDACTED, UsageError, redacted
from study.interrupts import StopSignals, env_set
from study.journal import journal_file, open_storage
from study.record import METRICS, SAMPLERS, StudyRecord
from study.record import flag_names as record_flag_names
from study.recorder import TrialRecorder, spool_path
from study.schedulers import SCHEDULERS, describe, ladder
from study.selection import Selection, race_rules, race_selection, races, rerun_candidates, selection_record
from study.spaces import Space, SpaceError, load_space, parse_space, resolve_pretrained
from study.tracking import DEFAULT_EXPERIMENT
from study.trial import FOLD_KEY, confirmed_trial, is_finite_number, race_table
from trainables.core.config import ConfigError, TrainConfig, check_classes_per_batch
from trainables.core.data import (
    DATA_ROOT_ENV,
    DatasetError,
    ImageSet,
    alphabets,
    check_retrieval_set,
    dataset_label,
    load_dataset,
    validation_folds,
    validation_split,
)

log = logging.getLogger(__name__)

INPUT_ERRORS = (UsageError, ConfigError, DatasetError, SpaceError)
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a study file could not be written: one line and the resume command


# ----------------------------------------------------------------------------- the command line
def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.launch", description=doc[1], epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_search_flags(parser.add_argument_group("what to search").add_argument)
    add_race_flags(parser.add_argument_group("how the best is named").add_argument)
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
        choices=SAMPLERS,
        default="tpe",
        help="how a searched space is sampled: tpe (default; ASHA-stopped trials told as PRUNED) or random (a baseline); "
        "grid spaces always use the grid",
    )
    a("--seed", type=int, default=0, help="seed of the sampler (trials keep their config's seed)")
    a("--confirm-top", type=int, default=3, help="before naming the best, race this many top complete trials (default 3)")
    a(
        "--confirm-budget",
        type=float,
        default=0.6,
        metavar="FRACTION",
        help="the race's budget, a share of the epochs the search trained: the top trials re-train on other validation folds "
        "in rounds, the clearly beaten are dropped, until one leads beyond noise or the budget or folds run out "
        "(study.selection; default 0.6: in the default study, two rounds of 3 and the race's first test; 0: name the "
        "single best score)",
    )


def add_race_flags(a: Callable[..., argparse.Action]) -> None:
    """Which folds the race of the top trials holds out (study.selection)."""
    a(
        "--race-folds",
        choices=RACE_FOLDS,
        default="trial",
        help="the validation folds the race re-trains the top trials on: trial (default: the trials' own split, config key "
        "val_split) or alphabets (whole held-out alphabets, as the test of a characters dataset measures, whatever the "
        "trials' split; needs alphabet/character class names)",
    )


def add_cluster_flags(a: Callable[..., argparse.Action]) -> None:
    """The Ray cluster, the resources of a trial, and what happens when a trial fails."""
    a("--address", help="join a running Ray cluster (e.g. 'auto' on a node of a `ray up` cluster); default: a local Ray")
    a(
        "--max-concurrent",
        type=int,
        help="trials running at once (default: as many as the cluster's CPUs and GPUs hold at --cpus-per-trial / --gpus-per-trial); "
        "1, with --cpus-per-trial set to the cores, repeats a seeded study on the same machine (README: What a sampler seed fixes)",
    )
    a("--cpus-per-trial", type=float, default=1.0, help="CPUs reserved per trial (default 1); torch uses that many threads")
    a("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial; fractions pack several trials on one GPU (default 0)")
    a("--max-failures", type=int, default=1, help="retries of a failed trial from its last checkpoint (default 1)")
    a(
        "--checkpoint-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a trial checkpoints an epoch at most every SECONDS (default 60; 0: every epoch): a stopped, killed or moved "
        "trial retrains at most that much, and Tune's snapshots of the whole study stay rare (docs/scale.md)",
    )
    a(
        "--rehearse",
        nargs="?",
        type=float,
        const=1.0,
        metavar="SECONDS",
        help="rehearse the study: the same driver, searcher, scheduler, re-runs and records, on a surrogate trainable that "
        "trains nothing (trainables.surrogate: seeded learning curves shaped like real ones) and sleeps SECONDS per epoch "
        "(default 1); no dataset needed. Checks a space, its rungs, its budget and the volume of records before a cluster run",
    )
    a(
        "--ray-cpus",
        type=float,
        help="logical CPUs of the local Ray (default: this machine's); with --rehearse, the size of the cluster rehearsed",
    )
    a("--ray-gpus", type=float, help="logical GPUs of the local Ray (default: this machine's); with --rehearse, GPUs to rehearse")
    a(
        "--reuse-actors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a new trial in the worker process of a finished one, without a new process and fresh imports (default: on)",
    )


def add_record_flags(a: Callable[..., argparse.Action]) -> None:
    """The stores (Ray checkpoints, MLflow, Optuna) and the study's name."""
    a("--storage-path", help="where Ray keeps trial checkpoints; on a cluster a shared path or s3:// URI (default: ./runs/ray)")
    tracking.add_tracking_flags(a, f"MLflow experiment name (default {DEFAULT_EXPERIMENT})")
    a("--optuna-storage", help="Optuna storage: journal:PATH or a database URL (default: journal:./runs/optuna/journal.log)")
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
    if not 0 <= args.confirm_budget <= 100:
        bad("--confirm-budget", args.confirm_budget, "a share of the search's epochs from 0 to 100 (e.g. 0.6)")
    if args.grace_period is not None and args.grace_period < 1:
        bad("--grace-period", args.grace_period, "an integer >= 1")
    if args.reduction_factor is not None and not (math.isfinite(args.reduction_factor) and args.reduction_factor > 1):
        bad("--reduction-factor", args.reduction_factor, "a finite number > 1")
    if args.metric not in METRICS:
        bad("--metric", args.metric, f"one of {', '.join(METRICS)}")
    if args.rehearse is not None and not (math.isfinite(args.rehearse) and args.rehearse >= 0):
        bad("--rehearse", args.rehearse, "seconds per epoch, a finite number >= 0")
    for flag, value in (("--ray-cpus", args.ray_cpus), ("--ray-gpus", args.ray_gpus)):
        if value is not None and not (math.isfinite(value) and value >= (1 if flag == "--ray-cpus" else 0)):
            bad(flag, value, "a finite number >= 1" if flag == "--ray-cpus" else "a finite number >= 0")
        if value is not None and args.address is not None:
            parser.error(f"{flag} sizes the local Ray; drop it with --address (a running cluster has its own resources)")
    if args.max_failures < 0:
        bad("--max-failures", args.max_failures, "an integer >= 0")
    if not (math.isfinite(args.checkpoint_every) and args.checkpoint_every >= 0):
        bad("--checkpoint-every", args.checkpoint_every, "seconds, a finite number >= 0")
    if args.resume and not args.study_name:
        parser.error("--resume needs --study-name NAME (the study to continue)")
    args.given = given_flags(parser, argv)
    try:
        names.check_names({"--study-name": args.study_name, "--experiment": args.experiment})
    except UsageError as error:  # one line and exit 2, as every bad flag (parser.error would add the usage line)
        raise SystemExit(inputs.print_error(error)) from None
    return args


def given_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> frozenset[str]:
    """The flags the command line sets itself, defaults aside (``--resume`` takes the others from the study)."""
    unset = object()
    probe = argparse.Namespace(**{dest: unset for dest in vars(parser.parse_args([]))})
    return frozenset(dest for dest, value in vars(parser.parse_args(argv, probe)).items() if value is not unset)


UNRECORDED_FLAGS = ("max_failures", "reuse_actors")  # kept in the study's Tune state, which --resume restores as it was


def resumed_args(args: argparse.Namespace, record: StudyRecord) -> argparse.Namespace:
    """With --resume: each study-defining flag takes the study's recorded value; a flag given with another value is refused."""
    for flag in sorted(args.given & set(UNRECORDED_FLAGS)):
        raise UsageError(f"--{flag.replace('_', '-')}: not changeable on --resume (the study keeps its own); drop it")
    values = record.flags()
    for flag, value in values.items():
        given = getattr(args, flag)
        if REDACTED in str(value):  # recorded without its password: the command line gives the store again
            if flag not in args.given:
                raise UsageError(
                    f"--{flag.replace('_', '-')}: study {args.study_name} recorded {value} without its password; give it again"
                )
            values[flag] = given
            value = redacted(value)
            given = redacted(given)
        if flag in args.given and same_setting(flag, given) != value:
            raise UsageError(
                f"--{flag.replace('_', '-')} {given}: study {args.study_name} runs with {value}; "
                "--resume continues a study with its own settings (drop the flag, or start a new study)"
            )
    return argparse.Namespace(**{**vars(args), **values})


def same_setting(flag: str, given: Any) -> Any:
    """A flag's value as the study records it: a shipped space's name as its file, a local store's path absolute."""
    if flag == "space":
        return load_space(given).path
    if flag == "storage_path" and "://" not in given:
        return str(Path(given).expanduser().resolve())
    if flag == "optuna_storage" and journal_file(given) is not None:
        return f"journal:{Path(journal_file(given)).expanduser().resolve()}"
    return given


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class StudySettings:
    """Everything a study runs with, resolved once from the command line (with --resume, from the study's record too).

    ``record`` is what the parent run records (study.record); its ``max_concurrent`` is None until the cluster's
    size is known (``with_slots``), when --max-concurrent is not given.
    """

    name: str
    space: Space  # with --dataset and --epochs applied
    record: StudyRecord
    max_failures: int
    address: str | None
    tracking_uri: str
    experiment: str
    resume: bool
    local_resources: tuple[float | None, float | None] = (None, None)  # --ray-cpus, --ray-gpus: the local Ray's size
    checkpoint_every_s: float = 0.0  # --checkpoint-every: a runtime setting, not the study's (--resume may change it)

    @functools.cached_property
    def early_stopping(self):
        """The Ray Tune scheduler and the budgets every trial trains through (study.schedulers), built once."""
        from study.schedulers import make_early_stopping

        r = self.record
        return make_early_stopping(r.scheduler, r.epochs, r.grace_period, r.reduction_factor, r.stratify_by)

    @property
    def slots(self) -> int:
        """Trials at once: --max-concurrent, or what the cluster holds (``with_slots``)."""
        if self.record.max_concurrent is None:
            raise RuntimeError("the study's slots are known once Ray runs: StudySettings.with_slots")
        return self.record.max_concurrent

    def with_slots(self, resources: dict[str, float]) -> StudySettings:
        """These settings with --max-concurrent resolved: as given (an autoscaling cluster may grow to it), else as many
        trials as ``resources`` (a running Ray cluster's) hold at --cpus-per-trial and --gpus-per-trial."""
        from study.utilization import concurrent_slots

        r = self.record
        if r.max_concurrent is not None:
            return self
        slots = concurrent_slots(10**6, resources.get("CPU", 1.0), r.cpus_per_trial, resources.get("GPU"), r.gpus_per_trial)
        return dataclasses.replace(self, record=dataclasses.replace(r, max_concurrent=slots))

    @property
    def max_epochs(self) -> int:
        return self.record.epochs

    @property
    def confirm_budget(self) -> float:
        """The race's budget as a share of the search's epochs (study.selection): none on a grid."""
        return 0.0 if self.space.is_grid else self.record.confirm_budget

    @property
    def race_plan(self) -> tuple[int, int, float]:
        """The race's candidates, folds and budget (study.selection.planned_runs): what the progress line's time left counts."""
        return self.record.confirm_top, self.record.val_folds, self.confirm_budget

    @property
    def reruns(self) -> int:
        """The race's re-runs the study's Tuner trains at most, after its ``num_samples`` trials: each candidate on
        every other fold."""
        return self.record.confirm_top * (self.record.val_folds - 1) if races(self.confirm_budget, self.record.val_folds) else 0

    @property
    def experiment_dir(self) -> str:
        """The Tune experiment's folder (or URI) under --storage-path."""
        return os.path.join(self.record.storage_path, self.name)


def stratify_by(space: Space) -> str | None:
    """The key whose values are compared apart by the budget scheduler: the loss family, when the space searches it."""
    searched = {p.name for p in space.params} | set(space.grid)
    return "loss" if "loss" in searched else None


def study_settings(args: argparse.Namespace) -> StudySettings:
    """Resolve and check the command line once: MLflow reachable, the space, the dataset, the storage paths."""
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    tracking.check_store(uri, "study.launch")
    tracking.experiment_artifacts(uri, args.experiment)
    checks.check_address(args.address)  # before Ray: ray.init retries a dead address for minutes
    if args.resume:
        args = resumed_args(args, parent.resumed_record(uri, args.experiment, args.study_name))
    optuna_storage = checks.check_optuna_storage(args.optuna_storage or f"journal:{tracking.runs_dir() / 'optuna' / 'journal.log'}")
    space = prepare_space(args)
    max_epochs = base_config(space).epochs
    scheduler, grace_period, reduction_factor = early_stopping_flags(args, max_epochs)
    data_root = tracking.resolve_data_root(args.data_root)
    rehearsal_folds = (0, int(1 / base_config(space).val_fraction))  # a rehearsal reads no data
    fit_classes, val_folds = check_dataset(space, data_root, race_split(args.race_folds)) if args.rehearse is None else rehearsal_folds
    name = args.study_name or f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage_path = check_storage(args.storage_path or str(tracking.runs_dir() / "ray"))
    if note := shared_storage_note(args.address, storage_path):
        print(note, file=sys.stderr)
    if args.resume and "://" not in storage_path and not Path(storage_path, name).is_dir():
        raise UsageError(f"--resume: no study {name!r} under {storage_path}; expected the --study-name of an interrupted study")
    flags = {flag: getattr(args, flag) for flag in record_flag_names() if flag != "dataset"}  # as given, then resolved:
    flags.update(
        space=space.path,
        epochs=max_epochs,
        num_samples=args.num_samples or (space.grid_size() if space.is_grid else 16),
        sampler="grid" if space.is_grid else args.sampler,
        scheduler=scheduler,
        grace_period=grace_period,
        reduction_factor=reduction_factor,
        optuna_storage=optuna_storage,
        storage_path=storage_path,
    )
    record = StudyRecord(
        **flags,
        mode=METRICS[args.metric],
        budgets=ladder(scheduler, max_epochs, grace_period, reduction_factor)[0],
        stratify_by=stratify_by(space),
        reuse_actors=args.reuse_actors,
        final_epochs=space.final_epochs(max_epochs),
        fit_classes=fit_classes,
        val_folds=val_folds,
        data_root=data_root,
        fixed={k: str(v) for k, v in space.fixed.items()},
    )
    local = (args.ray_cpus, args.ray_gpus)
    return StudySettings(
        name, space, record, args.max_failures, args.address, uri, args.experiment, args.resume, local, args.checkpoint_every
    )


def early_stopping_flags(args: argparse.Namespace, max_epochs: int) -> tuple[str, int, float]:
    """--scheduler, --grace-period, --reduction-factor: the flag (with --resume: the study's), else the default."""
    scheduler = args.scheduler or "budget"
    grace = args.grace_period or max(1, max_epochs // 4)
    factor = args.reduction_factor or 4.0
    if grace > max_epochs:
        raise UsageError(f"--grace-period {grace}: larger than the {max_epochs} epochs per trial; expected <= {max_epochs}")
    return scheduler, grace, factor


def prepare_space(args: argparse.Namespace) -> Space:
    """The space of --space with --dataset / --epochs applied, validated as a whole (with --resume: the study's)."""
    space = load_space(args.space or "default")
    overrides = {k: v for k, v in (("dataset", args.dataset), ("epochs", args.epochs)) if v is not None}
    if overrides:
        searched = {p.name for p in space.params} | set(space.grid) | {k for v in space.variants.values() for k in v}
        clash = sorted(searched & set(overrides))
        if clash:
            raise SpaceError(f"{space.path}: {clash[0]} is set by the space's params, grid or variants; drop --{clash[0]}")
        data = inputs.read_yaml(space.path, "a search space")
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


RACE_FOLDS = ("trial", "alphabets")  # --race-folds


def race_split(race_folds: str) -> str | None:
    """The ``val_split`` of the race's re-runs for --race-folds: None, the trials' own."""
    return None if race_folds == "trial" else race_folds


def check_dataset(space: Space, data_root: str | None, race: str | None = None) -> tuple[int, int]:
    """Load the dataset once on the driver: the space must be able to fill its batches. Returns the number of fit
    classes and of the race's validation folds (``check_race_folds``; ``race``: the race's split, None for the
    trials' own)."""
    config = base_config(space)
    splits = load_dataset(config.dataset, data_root, config.image_size)
    where = dataset_label(config.dataset, data_root)
    checks.check_photos(splits, config.dataset, config.image_size, data_root)  # every photo decodes, into the node's cache
    fit_classes, val_classes = validation_split(splits.train, config.val_split, config.val_fraction, where)
    check_retrieval_set(splits.train.with_classes(val_classes), None, f"{where}: the validation classes")
    described = f"{space.path} (val_split {config.val_split}, val_fraction {config.val_fraction})"
    check_fit_classes(space, len(fit_classes), described)
    return len(fit_classes), check_race_folds(space, splits.train, where, race)


def check_fit_classes(space: Space, fit_classes: int, described: str) -> None:
    """The space's largest batch fits in ``fit_classes`` classes; else a SpaceError naming ``described``."""
    try:
        check_classes_per_batch(max_classes_per_batch(space), fit_classes, base_config(space).dataset, described, "fit")
    except ConfigError as error:
        raise SpaceError(str(error)) from None


def check_race_folds(space: Space, train: ImageSet, where: str, race: str | None) -> int:
    """The validation folds the race can hold out (``data.validation_folds``): of the trials' split when ``race`` is
    None, else of ``race`` (alphabets), whose every fold must leave the space's batches enough fit classes."""
    config = base_config(space)
    if race is None:
        return validation_folds(train, config.val_split, config.val_fraction)
    alphabet_of = alphabets(train)
    if alphabet_of is None or len(set(alphabet_of.values())) < 3:
        raise UsageError(f"--race-folds {race}: {where} has not 3 alphabets of 'alphabet/character' classes; expected --race-folds trial")
    folds = validation_folds(train, race, config.val_fraction)
    fewest = min(len(validation_split(train, race, config.val_fraction, where, f)[0]) for f in range(folds))
    check_fit_classes(space, fewest, f"{space.path} (--race-folds {race}, val_fraction {config.val_fraction})")
    return folds


def shared_storage_note(address: str | None, storage_path: str) -> str | None:
    """On a cluster (``--address``) with checkpoints in a folder of this host: the note that every node must reach it.

    Ray Tune writes a trial's checkpoints from the node that trains it; with several hosts a local folder must be the
    same shared mount on each (NFS), else Ray fails the trials of other nodes at their first checkpoint."""
    if address is None or "://" in storage_path:
        return None
    return (
        f"note: --storage-path {storage_path} is a folder of this host; on a cluster of several hosts every node must "
        "reach it at that path (a shared mount), or give an s3:// URI (README, Running on a cluster)"
    )


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
# own start-up, and a study leaves most of them idle (a two-trial study started 6 worker processes with them, 4
# without: tests/test_reliability.py's diverging study). These are Ray's system settings
# (RAY_ + the setting's name): Ray ignores a name it no longer knows, so tests/test_local_ray.py checks each one's effect.
# Its workers also inherit PYTHONWARNINGS=ignore from this environment: given as a job's runtime_env instead, it costs
# each worker about 0.9 CPU-s more to start (Ray's runtime-env agent sets up every worker; docs/benchmarks.md section 7)
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_worker_niceness": "0",
    "RAY_prestart_worker_first_driver": "0",
    "PYTHONWARNINGS": "ignore",
}


def local_ray_env(address: str | None) -> None:
    """Without --address, the environment of the local Ray (LOCAL_RAY_ENV; a user's own settings win). Before ``import ray``."""
    if address is None:
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)


@contextlib.contextmanager
def ray_session(address: str | None, local_resources: tuple[float | None, float | None] = (None, None)) -> Iterator[None]:
    """Ray for the length of the study; without --address always a fresh local Ray, never one that happens to run here,
    of ``local_resources`` (CPUs, GPUs; None: this machine's).

    The local Ray binds to 127.0.0.1 only when this is the first import of Ray in the process (as in ``main``).
    """
    local_ray_env(address)
    import ray

    console.keep_in_log_file("ray")  # a first import of Ray inside the command's log block put its console handler back
    cpus, gpus = local_resources
    try:
        ray.init(
            address=address or "local",
            num_cpus=cpus,
            num_gpus=gpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            ignore_reinit_error=True,
        )
    except ConnectionError as error:  # a cluster that listens (checks.check_address) but refuses this driver
        if address is None:
            raise
        raise checks.ray_connect_failure(address, error) from None
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()


def cluster_resources() -> dict[str, float]:
    """The running Ray cluster's resources (a local Ray's: this machine's)."""
    import ray

    return ray.cluster_resources()


def open_optuna(settings: StudySettings, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The study's Optuna study: created, or with --resume loaded."""
    name, url = settings.name, settings.record.optuna_storage
    names = set(optuna.get_all_study_names(storage))
    if settings.resume:
        if name not in names:
            raise UsageError(f"--resume: no Optuna study {name!r} in {url}; expected an existing study name")
        return optuna.load_study(study_name=name, storage=storage)
    if name in names:
        raise UsageError(f"--study-name {name}: a study of that name exists in {url}; pass --resume to continue it or choose another name")
    return optuna.create_study(study_name=name, storage=storage, direction="maximize" if settings.record.mode == "max" else "minimize")


def open_study(settings: StudySettings, client, experiment_id: str, parent_id: str | None) -> tuple[optuna.Study, str]:
    """The Optuna study and the MLflow parent run, created together (with --resume: found); returns the parent's run id."""
    checks.check_cluster_resources(settings.record.cpus_per_trial, settings.record.gpus_per_trial)  # else trials would wait forever
    journal = journal_file(settings.record.optuna_storage)
    if journal is not None:  # its folder, checked at launch, may have been removed since (a long-queued --resume)
        Path(journal).parent.mkdir(parents=True, exist_ok=True)
    storage = open_storage(settings.record.optuna_storage)
    study = open_optuna(settings, storage)
    if parent_id is not None:
        parent.reopen(client, experiment_id, parent_id)
        return study, parent_id
    try:
        return study, parent.create_parent_run(client, experiment_id, settings.name, settings.space.path, settings.record.to_params())
    except BaseException:
        optuna.delete_study(study_name=settings.name, storage=storage)  # no half-created study
        raise


def trainable(settings: StudySettings):
    """The trainable with its runtime settings and resources: the scheduler's ladder of budgets (one schedule for a re-run)."""
    from ray import tune

    from study.trial import train_trial

    return tune.with_resources(
        tune.with_parameters(
            train_trial,
            data_root=settings.record.data_root,
            budgets=list(settings.early_stopping.budgets),
            rehearse_epoch_s=settings.record.rehearse,
            checkpoint_every_s=settings.checkpoint_every_s,
        ),
        {"cpu": settings.record.cpus_per_trial, "gpu": settings.record.gpus_per_trial},
    )


def new_tuner(settings: StudySettings, recorder: TrialRecorder):
    """A Tuner of the study: the Optuna searcher and then the race's re-runs (at most --max-concurrent trials at
    once), the scheduler, MLflow and progress callbacks."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.search import ConcurrencyLimiter

    from study.callbacks import KeepState, MlflowTrials, Progress, ReleaseMemory
    from study.search import RacingSearcher

    s = settings
    searcher = RacingSearcher(
        s.space, s.record.optuna_storage, s.name, trials=s.record.num_samples, top=s.record.confirm_top, budget=s.confirm_budget,
        folds=s.record.val_folds, split=race_split(s.record.race_folds),
        metric=s.record.metric, mode=s.record.mode, max_epochs=s.max_epochs, seed=s.record.seed, sampler=s.record.sampler,
    )  # fmt: skip
    scheduler = s.early_stopping.scheduler
    return tune.Tuner(
        trainable(s),
        tune_config=tune.TuneConfig(
            metric=s.record.metric,
            mode=s.record.mode,
            num_samples=s.record.num_samples + s.reruns,
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=s.slots),
            scheduler=scheduler,
            reuse_actors=s.record.reuse_actors,
        ),
        run_config=tune.RunConfig(
            name=s.name,
            storage_path=s.record.storage_path,
            verbose=0,
            callbacks=[
                MlflowTrials(recorder, s.record.metric, s.max_epochs),
                Progress(s.record.metric, s.record.mode, s.max_epochs, s.record.num_samples, s.race_plan, s.early_stopping.rungs),
                *([KeepState(s.experiment_dir)] if "://" not in s.experiment_dir else []),
                ReleaseMemory(),
                CSVLoggerCallback(),
                JsonLoggerCallback(),
            ],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            failure_config=tune.FailureConfig(max_failures=s.max_failures),
        ),
    )


def restored_tuner(settings: StudySettings, study: optuna.Study, recorder: TrialRecorder):
    """The interrupted study's Tuner, after the records it kept are written (its restored searcher tells the Optuna
    trials that no restored Tune trial continues FAIL: ``OptunaSearcher.restore_state``)."""
    recorder.flush(force=True)  # records an interrupted study kept while MLflow was away
    local = "://" not in settings.experiment_dir
    if local and (torn := tunestate.recover(settings.experiment_dir)):
        print(f"Tune's state of study {settings.name} was torn ({', '.join(torn)}, a full disk?): resuming from its last good copy")
    if local and (back := tunestate.put_back_checkpoints(settings.experiment_dir)):
        print(f"{len(back)} checkpoint(s) of study {settings.name} Tune deleted after its last snapshot: put back from its links")
    if local and not tunestate.whole(settings.experiment_dir):
        return fresh_tuner(settings, study, recorder)
    return restore_tuner(settings)


def restore_tuner(settings: StudySettings):
    """Tune's restore of the study's experiment; a state that pickled what this version lacks is a one-line UsageError."""
    from ray import tune

    try:
        return tune.Tuner.restore(settings.experiment_dir, trainable(settings), resume_unfinished=True, resume_errored=False)
    except (AttributeError, ImportError, pickle.UnpicklingError) as error:
        if isinstance(error, AttributeError) and "Can't get attribute" not in str(error):
            raise
        raise UsageError(saved_by_another_version(settings, error)) from error


def saved_by_another_version(settings: StudySettings, error: Exception) -> str:
    """The one line for a Tune state that pickled a class this version no longer has (a study started before an
    upgrade that renamed its searcher, say): nothing of it can be continued as it was."""
    why = tracking.first_error_line(str(error)) or type(error).__name__
    return (
        f"--resume: Tune's state of study {settings.name} under {settings.experiment_dir} was saved by another version of "
        f"this project ({why}); expected the version that started it: resume it with that version, or start the study "
        "again under a new --study-name (its records so far stay in MLflow and Optuna)"
    )


def fresh_tuner(settings: StudySettings, study: optuna.Study, recorder: TrialRecorder):
    """--resume of a study whose Tune state holds no whole snapshot: stopped before Tune's first one, or that one torn
    by a full disk with no good copy. Tune saves its first snapshot before any trial reports, so a study none of whose
    trials has reported starts its trials in a new Tuner; one whose trials reported cannot be continued."""
    if any(t.intermediate_values or t.state.is_finished() for t in study.get_trials(deepcopy=False)):
        raise UsageError(
            f"--resume: Tune's state of study {settings.name} under {settings.experiment_dir} is missing or torn, with no "
            "good copy, and its trials have reported; expected a study Tune saved whole: start it again under a new --study-name"
        )
    aside = tunestate.set_aside(settings.experiment_dir)
    kept = f" (its torn files kept as *.torn: {', '.join(aside)})" if aside else ""
    print(f"Tune saved no whole state of study {settings.name} before it stopped{kept}; no trial had reported: they start now")
    return new_tuner(settings, recorder)


def selection_of(settings: StudySettings, study: optuna.Study, results) -> Selection | None:
    """The race of the top complete trials over validation folds (study.selection), replayed on every score: the
    trials' own and their re-runs'; None when nothing raced (a grid, --confirm-budget 0, fewer than two complete
    trials). ``results``: the Tuner's ResultGrid, re-runs included."""
    s = settings
    trials = study.get_trials(deepcopy=False)
    complete = {t.number: t.value for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    numbers = rerun_candidates(complete, s.record.confirm_top, s.record.mode)
    if not races(s.confirm_budget, s.record.val_folds) or not numbers:
        return None
    scores = {}  # (Optuna trial, fold) -> score; NaN for a re-run that failed
    for result in results:
        n, value = confirmed_trial(result.config), (result.metrics or {}).get(s.record.metric)
        if n is not None and FOLD_KEY in result.config:
            scores[n, int(result.config[FOLD_KEY])] = float(value) if result.error is None and is_finite_number(value) else math.nan
    rules = race_rules(s.record.mode, s.record.val_folds, s.confirm_budget, trials, s.max_epochs)
    selection = race_selection(race_table(complete, numbers, scores), rules)
    study.set_user_attr("selection", selection_record(selection))  # the Optuna storage keeps it for study.sync
    return selection


class NothingToRun(Exception):
    """--resume of a study that has finished."""


def print_header(s: StudySettings) -> None:
    import ray

    ray_address = ray.get_runtime_context().gcs_address
    reruns = (
        f", then a race of the top {s.record.confirm_top} over up to {s.record.val_folds - 1} more validation folds "
        f"{'of whole alphabets ' if s.record.race_folds == 'alphabets' else ''}"
        f"(budget {s.confirm_budget:g} x the search's epochs)"
        if s.reruns
        else ""
    )
    rehearsal = f"rehearsal ({s.record.rehearse:g} s per surrogate epoch, no training) of " if s.record.rehearse is not None else ""
    print(
        f"{rehearsal}study {s.name}: {s.record.num_samples} trials of up to {s.max_epochs} epochs{reruns}, space {s.space.path}, "
        f"{s.record.metric} ({s.record.mode}), {s.slots} at once, {describe(s.early_stopping)}; Ray at {ray_address}",
        flush=True,
    )


def run_study(settings: StudySettings) -> records.StudySummary:
    """Run the study to its end; returns what ``console.print_study_summary`` prints.

    Whatever stops it early leaves its MLflow runs marked stopped (``parent.stopped_on_failure``) and no Ray running;
    a signal stops it as ``study.interrupts`` says, resumable. A second driver of the same study fails at once (``study.locks``).
    """
    s = settings
    experiment_id = tracking.setup(s.tracking_uri, s.experiment)
    client = mlflow.MlflowClient(s.tracking_uri)
    with locks.study_lock(locks.lock_folder(s.record.optuna_storage, tracking.runs_dir()), s.name):
        parent_id = parent.existing_parent(client, experiment_id, s.name, resume=s.resume, experiment=s.experiment)
        if s.resume and client.get_run(parent_id).info.status == "FINISHED":
            raise NothingToRun(s.name)
        ray_started = time.time()
        with ray_session(s.address, s.local_resources), StopSignals().installed() as stops:
            s = s.with_slots(cluster_resources())
            with stops.deferred():  # no half-created study
                study, parent_id = open_study(s, client, experiment_id, parent_id)
                records.describe_optuna_study(study, parent_id, s.space.path, s.record.metric)
            started = time.time()
            usage = {"slots": s.slots, "startup_s": started - ray_started, "since": started}  # Ray's start-up apart
            with parent.stopped_on_failure(client, experiment_id, parent_id):
                recorder = TrialRecorder(
                    s.tracking_uri, experiment_id, parent_id, s.name, spool_path(s.name), optuna_storage=s.record.optuna_storage
                )
                tuner = restored_tuner(s, study, recorder) if s.resume else new_tuner(s, recorder)
                print_header(s)
                recorder.start_writer()  # the driver's one writer of the trial records (the callbacks' copies append)
                try:
                    with stops.graceful(), env_set(AUTO_LOGGERS_FLAG, "1"):
                        results = tuner.fit()
                finally:  # no record lands after the study marks its runs
                    recorder.close_writer()
                selection = selection_of(s, study, results)
                # Tune's result grid, which the Tuner keeps too, holds a frame of every trial's results (about 470 MB of
                # a 5,000-trial driver, docs/scale.md); the end of the study reads none of it
                del results, tuner
                heap.release_freed()
                with stops.deferred():
                    wall_s = time.time() - started
                    named = {"experiment": s.experiment, "final_epochs": s.record.final_epochs}
                    return records.finish_study(study, recorder, s.record.metric, s.record.mode, wall_s, selection, usage, **named)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tracking.configure_mlflow()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = None
    try:
        args = parse_args(argv)
        with locks.store_setup_lock(tracking.resolve_tracking_uri(args.tracking_uri)):  # one driver migrates a new store
            settings = study_settings(args)
            tracking.setup(settings.tracking_uri, settings.experiment)
        local_ray_env(settings.address)
        import ray  # noqa: F401  (its import installs the console handler that library_output_to replaces)

        with console.library_output_to(console.log_path(settings.name)):
            inputs.redact_logs()
            outcome = run_study(settings)
    except INPUT_ERRORS as error:
        return inputs.print_error(error)
    except NothingToRun:
        print(f"study {settings.name} has finished: nothing left to run, nothing written. {next_steps(settings)}")
        return 0
    except KeyboardInterrupt as error:
        print(inputs.redacted(interrupted_message(error, settings)), file=sys.stderr)
        return interrupts.exit_code(error)
    except Exception as error:  # a full or read-only disk, also inside the TuneError Ray Tune makes of it: one line
        disk = inputs.disk_error(error, DISK_ERRORS)
        if disk is None:
            raise
        folders = [str(tracking.runs_dir())] + ([settings.record.storage_path] if settings is not None else [])
        inputs.print_error(f"{inputs.disk_error_line(disk, folders)}; {resume_hint(settings)}")
        return 1
    console.print_study_summary(dataclasses.replace(outcome, uri=inputs.redacted(outcome.uri)), settings.record.metric)
    if settings.record.rehearse is not None:
        print("this was a rehearsal: every curve is the surrogate's (trainables/surrogate.py); its pick is not a model to retrain")
    if outcome.metrics["n_complete"]:
        return 0
    # no trial completed: the study failed (its parent run FAILED), and why is said here, each reason once
    reasons = tracking.fail_study(outcome.uri, outcome.parent_run_id) if outcome.mlflow_synced else []
    m = outcome.metrics
    failed = f"{m['n_failed']} failed" + (f", {m['n_pruned']} stopped early" if m["n_pruned"] else "")
    lines = [f"  {count} trial{'s' * (count > 1)}: {reason}" for reason, count in reasons]
    inputs.print_error("\n".join([f"study {settings.name}: no trial completed ({failed})" + ("; the reasons:" if lines else ""), *lines]))
    return 1


def next_steps(settings: StudySettings) -> str:
    report, final = console.python_command("study.report"), console.python_command("study.final")
    return f"Its report: {report} --study {settings.name}; its best config retrained: {final} --study {settings.name}"


def resume_hint(settings: StudySettings | None) -> str:
    if settings is None:
        return "nothing was started"
    where = f" --experiment {settings.experiment}" if settings.experiment != DEFAULT_EXPERIMENT else ""
    if settings.tracking_uri != tracking.resolve_tracking_uri(None):  # MLflow is found where the study recorded its stores
        where += f" --tracking-uri {settings.tracking_uri}"
    command = f"{console.python_command('study.launch')} --study-name {settings.name} --resume{where}"
    if "://" not in settings.experiment_dir and not tunestate.resumable(settings.experiment_dir):  # checked, not promised
        return (
            f"its Tune state under {settings.experiment_dir} is missing or could not be saved whole (a full disk?), and no "
            "good copy of it exists: the trials kept so far are in MLflow and the Optuna storage; free space and start the "
            "study again under a new --study-name"
        )
    return f"its state is saved: continue it with  {command}"


def interrupted_message(error: KeyboardInterrupt, settings: StudySettings | None) -> str:
    """What the driver says when a signal stops it."""
    what = f"study {settings.name}" if settings is not None else "study.launch"
    return f"{what} stopped by {interrupts.signal_name(error)}; {resume_hint(settings)}"


if __name__ == "__main__":
    sys.exit(main())

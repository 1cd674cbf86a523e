"""StudySettings: everything a study runs with, resolved once from the command line (with --resume, from the
study's record), and the checks of the dataset, the folds and the storage before Ray starts."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study import checks, inputs
from study.inputs import REDACTED, UsageError, redacted
from study.records import parent, tracking
from study.records.study_record import METRICS, StudyRecord
from study.records.study_record import flag_names as record_flag_names
from study.search.journal import journal_file
from study.search.race import races
from study.search.schedulers import ladder
from study.search.spaces import (
    Space,
    SpaceError,
    load_space,
    parse_space,
    resolve_pretrained,
)
from trainables.core.config import ConfigError, TrainConfig, check_classes_per_batch
from trainables.core.data import (
    ImageSet,
    alphabets,
    check_retrieval_set,
    dataset_label,
    image_size_for,
    load_dataset,
    validation_folds,
    validation_split,
)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class StudySettings:
    """Everything a study runs with, resolved once from the command line (with --resume, from the study's record too).

    ``record`` is what the parent run records (study.records.study_record); its ``max_concurrent`` is None until the cluster's
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
        """The Ray Tune scheduler and the budgets every trial trains through (study.search.schedulers), built once."""
        from study.search.schedulers import make_early_stopping

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
        from study.records.utilization import concurrent_slots

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
        """The race's budget as a share of the search's epochs (study.search.race): none on a grid."""
        return 0.0 if self.space.is_grid else self.record.confirm_budget

    @property
    def race_plan(self) -> tuple[int, int, float]:
        """The race's candidates, folds and budget (study.search.race.planned_runs): what the progress line's time left counts."""
        return self.record.confirm_top, self.record.val_folds, self.confirm_budget

    @property
    def strata(self) -> int:
        """The strata the scheduler halves trials in (:func:`strata`; 1 where it compares them all together)."""
        return strata(self.space) if self.early_stopping.stratify_by else 1

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


def strata(space: Space) -> int:
    """The values of the key the budget scheduler compares trials apart by (:func:`stratify_by`) that ``space`` takes:
    the strata successive halving runs in; 1 when it compares them all together."""
    key = stratify_by(space)
    if key is None:
        return 1
    choices = next((p.choices for p in space.params if p.name == key), ())
    return max(len(set(choices) | set(space.grid.get(key, []))), 1)


def study_settings(args: argparse.Namespace) -> StudySettings:
    """Resolve and check the command line once: MLflow reachable, the space, the dataset, the storage paths."""
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    tracking.check_store(uri, "study.launch")
    tracking.experiment_artifacts(uri, args.experiment)
    checks.check_address(args.address)  # before Ray: ray.init retries a dead address for minutes
    if args.resume:
        args = resumed_args(args, parent.resumed_record(uri, args.experiment, args.study_name))
    optuna_storage = checks.check_optuna_storage(args.optuna_storage or f"journal:{tracking.runs_dir() / 'optuna' / 'journal.log'}")
    optuna_storage = inputs.without_password(optuna_storage)  # Tune pickles the searcher and the recorder: never the password
    space = prepare_space(args)
    if args.rehearse is None and args.address is None:  # the local Ray's GPUs are this machine's (a cluster's: tuner)
        check_gpu_packing(space, args.gpus_per_trial or 0.0, checks.local_gpus())
    max_epochs = base_config(space).epochs
    scheduler, grace_period, reduction_factor = early_stopping_flags(args, max_epochs)
    data_root = tracking.absolute_data_root(args.data_root)
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
    return largest(space, "classes_per_batch")


def largest(space: Space, key: str) -> int:
    """The largest value of integer config key ``key`` any trial of ``space`` can get."""
    default = int(space.fixed.get(key, getattr(TrainConfig(), key)))
    values = [int(v.get(key, default)) for v in space.variants.values()]
    values += [int(v) for v in space.grid.get(key, [])]
    searched = [p for p in space.params if p.name == key]
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


def check_gpu_packing(space: Space, gpus_per_trial: float, gpus: list[checks.Gpu]) -> None:
    """The trials --gpus-per-trial packs on a GPU fit the smallest of ``gpus`` (checks.packing_problem: the space's
    backbone, precision and crop, its largest C and k); else a UsageError with the numbers. Nothing to check without
    a GPU, or for a space whose backbone, precision or crop are searched."""
    searched = {p.name for p in space.params} | set(space.grid) | {k for v in space.variants.values() for k in v}
    if not gpus or not gpus_per_trial or searched & {"backbone", "precision", "image_size"}:
        return
    config = base_config(space)
    size = image_size_for(config.dataset, config.image_size)
    c, k = largest(space, "classes_per_batch"), largest(space, "samples_per_class")
    shape = checks.TrialShape(config.backbone, config.precision, c, k, size)
    problem = checks.packing_problem(space.path, shape, gpus_per_trial, min(gpus, key=lambda gpu: gpu.gib))
    if problem:
        raise UsageError(problem)


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

"""What study.final trains (FinalPlan): a config file, every variant of a grid space, or a study's pick or race's tie
at the study's final epochs, read from the study's records."""

from __future__ import annotations

import argparse
import itertools
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import mlflow

from configs import DEFAULT_CONFIG
from study import console, inputs
from study.inputs import UsageError
from study.records.parent import study_parent
from study.records.study_record import StudyRecord
from study.records.trials import spool_path
from study.search.race import tie_member
from trainables.core.config import TrainConfig


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


def study_config(study: str, experiment: str, epochs: int | None, uri: str) -> tuple[TrainConfig, str, StudyRecord]:
    """The best config of ``study`` (its parent run's best_config.yaml), the parent run's id and the study's record.

    The record gives the study's data root (``data_root``, None for a study that did not record one) and its trials'
    resources, which a seed's task on a cluster holds by default.
    The epochs are ``epochs`` (--epochs), else the study's ``final_epochs`` param (its space's
    final_budget_factor x the trials' epochs), else the trials' own.
    """
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
    entries = study_file(parent_id, "tied_configs.yaml", uri, "the study's tied candidates")
    if entries is None:
        return ()
    source = f"tied_configs.yaml of study {study}"
    return tuple(
        Member(trial, TrainConfig.from_dict({**config, **final_epochs(epochs, record)}, source=source))
        for trial, config in tied_entries(entries, source)
    )


def tied_entries(entries: Any, source: str) -> list[tuple[int, dict[str, Any]]]:
    """(trial, config) of each entry of a tied_configs.yaml as the study writes it: a non-empty list of
    ``{trial: N, config: {...}}``; anything else (a hand edit) is a UsageError naming ``source`` and the entry."""
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{source}: expected a non-empty list of {{trial: N, config: {{...}}}}, the race's tie; got {entries!r:.80}")
    read = []
    for index, entry in enumerate(entries):
        where = f"{source}: entries[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"trial", "config"}:
            raise UsageError(f"{where}: expected a mapping with keys trial and config; got {entry!r:.80}")
        trial, config = entry["trial"], entry["config"]
        if isinstance(trial, bool) or not isinstance(trial, int) or trial < 0:
            raise UsageError(f"{where}.trial: expected a trial number (an integer >= 0); got {trial!r:.40}")
        if not isinstance(config, dict):
            raise UsageError(f"{where}.config: expected a mapping of config keys to values; got {config!r:.80}")
        read.append((trial, config))
    return read


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
    from study.search.spaces import VARIANT, load_space

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
    data_root: str | None = None  # the study's own (--study): used without --data-root, before $DML_DATA_ROOT
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
        """A seed's run: what tells the runs apart first, as MLflow's runs table shows a name's first 20-odd characters."""
        return f"{name}-seed{seed}" if self.grid else f"final-seed{seed}-{self.name}"

    def ensemble_run_name(self, name: str) -> str:
        return f"{name}-ensemble" if self.grid else f"final-ensemble-{self.name}"


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

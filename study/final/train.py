"""study.final's training and recording: the parent and seed runs, the seeds trained where the placement says,
their models logged and registered, the seeds as one model, and runs ended KILLED on a signal or FAILED on an error."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch

from study import checks, inputs
from study.final import placement as placing
from study.final.placement import EpochReport, Placement, SeedJob, SeedOutput
from study.final.plan import FinalPlan, make_plan
from study.final.results import ConfigurationResult, EnsembleResult, FinalResult, SeedResult, summarize
from study.final.seed import test_pictures, train_seed
from study.final.serving import served_model
from study.final.writer import FinalWriter, close_abandoned, spool_of, stop_runs
from study.inputs import UsageError
from study.interrupts import StudyInterrupted, signal_name, uninterrupted
from study.records import ending, locks, tracking
from study.records.trials import config_params
from trainables.core.config import TrainConfig, check_classes_per_batch
from trainables.core.data import (
    DatasetSplits,
    check_retrieval_set,
    dataset_label,
    image_size_for,
    load_dataset,
)
from trainables.core.engine import ONE_SHOT_WAYS, Embeddings, build_model, concatenated, default_device, score


def record_model(
    output: SeedOutput, example: np.ndarray, workdir: Path, register: str | None, origin: str, writer: FinalWriter
) -> tuple[str, str | None]:
    """Log the seed's model as ``embedding-seed<k>`` in the active MLflow run (its seed run), the test metrics linked to it,
    and a registered version's description.

    Returns the model's URI and the registered version's (models:/NAME/VERSION, or None).
    """
    config = TrainConfig.from_dict(output.bundle["config"], source="the seed's model")
    info = log_model(writer, output.bundle, example, workdir, f"embedding-seed{config.seed}", register)
    return info.model_uri, link_metrics(info, {**output.test, **output.similarity}, config, register, origin, writer)


@dataclass(frozen=True)
class LoggedModel:
    """What the commands use of a logged model (MLflow's ModelInfo, or the version an earlier attempt registered)."""

    model_uri: str
    model_id: str
    registered_model_version: int | None


def log_model(writer: FinalWriter, bundle, example: np.ndarray, workdir: Path, name: str, register: str | None) -> LoggedModel:
    """``pyfunc.log_embedding_model`` in the active run, waiting for the server while it is away. An attempt cut by an
    outage may have registered its version already: a later attempt logs the model again and takes that version
    (the registry gets one version per run)."""
    from study.final.pyfunc import log_embedding_model

    run_id = mlflow.active_run().info.run_id

    def attempt(n: int) -> LoggedModel:
        earlier = registered_versions(register, run_id) if register and n > 0 else []
        info = log_embedding_model(bundle, example, workdir, name=name, registered_model_name=None if earlier else register)
        version = int(earlier[0].version) if earlier else info.registered_model_version
        return LoggedModel(info.model_uri, info.model_id, version)

    return writer.patiently(attempt, f"the model {name}")


def registered_versions(register: str, run_id: str) -> list:
    """The versions of registered model ``register`` made from run ``run_id``."""
    client = mlflow.MlflowClient()
    return [v for v in client.search_model_versions(f"name = '{register}'") if v.run_id == run_id]


def link_metrics(
    info: LoggedModel,
    test: dict[str, float],
    config: TrainConfig,
    register: str | None,
    origin: str,
    writer: FinalWriter,
    seeds: list[int] | None = None,
    tied: list[tuple[int, TrainConfig]] | None = None,
    member_tests: list[dict[str, float]] | None = None,
) -> str | None:
    """Log ``test`` (the finite values) in the active run, linked to the logged model of ``info``; describe its registered
    version (one seed's, the ensemble of ``seeds``, or of a study's ``tied`` candidates). Returns models:/NAME/VERSION, or
    None when not registered."""
    from study.final.pyfunc import version_description

    linked = {k: v for k, v in test.items() if math.isfinite(v)}
    stamp = int(time.time() * 1000)  # one time for every try: a metric written twice is one point
    run_id = mlflow.active_run().info.run_id
    writer.patiently(lambda _: mlflow.log_metrics(linked, step=config.epochs, model_id=info.model_id, timestamp=stamp), "the test metrics")
    version = info.registered_model_version
    if not register or version is None:
        return None
    description = version_description(config, linked, origin or "study.final", run_id, seeds, tied, member_tests)
    writer.patiently(
        lambda _: mlflow.MlflowClient().update_model_version(register, str(version), description=description), "the model's description"
    )
    return f"models:/{register}/{version}"


def placement_of(args: argparse.Namespace, plan: FinalPlan, device: torch.device) -> Placement:
    """Where the seeds train: tasks of the Ray cluster at --address holding the trials' resources, else as
    ``placing.local_placement`` rules for this machine's cores."""
    if args.address is not None:
        cpus, gpus = plan.trial_resources
        cpus = cpus if args.cpus_per_trial is None else args.cpus_per_trial
        return placing.cluster_placement(args.address, cpus, gpus if args.gpus_per_trial is None else args.gpus_per_trial)
    return placing.local_placement(len(os.sched_getaffinity(0)), plan.seeds, device.type)


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
    trained: dict[str, Any] = {}
    if not plan.grid:  # one configuration: the keys it trains with are the parent's params, as on a trial's run
        trained, named = config_params(plan.configurations[0][1].to_dict())
        tags.update(named)
    parent_id = client.create_run(experiment_id, run_name=plan.run_name, tags=tags).info.run_id
    params = [mlflow.entities.Param("seeds", ",".join(map(str, plan.seed_values())))]
    params += [mlflow.entities.Param(k, str(v)) for k, v in trained.items() if k != "seed"]
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
    writer: FinalWriter  # the child runs' writes: queued, applied by a thread, kept while MLflow is away
    opened: list[str] = field(default_factory=list)  # the child runs opened so far (names): a failure marks those still RUNNING


class SeedRuns:
    """The driver's side of one configuration's seeds (a ``study.final.placement.SeedRecorder``): a child run each, opened as its
    seed starts, its epochs logged and printed as they come, its output recorded (pictures, model, test metrics)."""

    def __init__(self, plan: FinalPlan, name: str, target: Target, register: str | None, example: np.ndarray) -> None:
        self.plan, self.name, self.target, self.register, self.example = plan, name, target, register, example
        self.run_ids: dict[int, str] = {}
        self.jobs: dict[int, SeedJob] = {}
        self.results: dict[int, SeedResult] = {}
        self.members: dict[int, tuple[dict[str, Any], Embeddings]] = {}  # each seed's bundle and test embeddings, for the ensemble

    def origin(self) -> str:
        """Where the configuration came from, for a registered version's description."""
        return f"study {self.plan.study} (parent run {self.target.parent_id})" if self.plan.study else self.plan.source_of(self.name)

    def open_child(self, run_name: str, tags: dict[str, str], params: dict[str, Any]) -> None:
        """Queue a child run of the parent (a seed's or the ensemble's) with the common tags, ``tags`` and ``params``;
        its name is kept in the target's ``opened``."""
        target = self.target
        tags = {**tracking.reproducibility_tags(), **target.owner, "mlflow.parentRunId": target.parent_id, **tags}
        if self.plan.study:
            tags["study_name"] = self.plan.study
        if self.plan.grid:
            tags["configuration"] = self.name
        target.opened.append(run_name)
        target.writer.create_run(target.experiment_id, run_name, tags, params)

    def start(self, job: SeedJob) -> None:
        config, trial = job.config, self.plan.seed_trial(job.index)
        tags = {"kind": "final_seed", "seed": str(config.seed)} | ({"optuna_trial": str(trial)} if trial is not None else {})
        params, named = config_params(config.to_dict())
        self.run_ids[job.index] = self.plan.seed_run_name(self.name, config.seed)  # its name until MLflow has it
        self.open_child(self.run_ids[job.index], {**tags, **named}, params)
        self.jobs[job.index] = job

    def epoch(self, report: EpochReport) -> None:
        metrics = report.metrics
        logged = {k: v for k, v in metrics.items() if math.isfinite(v) and not k.startswith("test_")}
        self.target.writer.log_epoch(self.run_ids[report.index], report.epoch, logged)
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
        writer, workdir = self.target.writer, self.target.workdir
        run_id, origin = writer.run_id(self.run_ids[output.index]), self.origin()
        with killed_on_signal(run_id, writer):
            writer.patiently(lambda _: mlflow.set_tag("node", output.node), "the seed's records")
            for file, data in output.pictures.items():
                (workdir / file).write_bytes(data)
                writer.patiently(lambda _, file=file: mlflow.log_artifact(str(workdir / file)), "the seed's pictures")
            stamp = int(time.time() * 1000)
            writer.patiently(lambda _: mlflow.log_metric("time/total_s", output.time_s, timestamp=stamp), "the seed's records")
            register = self.register if output.index == 0 and self.plan.seeds == 1 else None  # else the ensemble is registered
            model_uri, registered_uri = record_model(output, self.example, workdir, register, origin, writer)
        seed = self.jobs[output.index].config.seed
        trial = self.plan.seed_trial(output.index)
        self.results[output.index] = SeedResult(seed, run_id, output.test, output.time_s, model_uri, registered_uri, trial)
        if self.plan.seeds > 1 and output.embeddings is not None:
            self.members[output.index] = (output.bundle, output.embeddings)

    def ensemble(self, splits: DatasetSplits, config: TrainConfig) -> EnsembleResult:
        """The seeds as one model: a child run with the test metrics of their concatenated embeddings and the model."""
        members = [self.members[i] for i in sorted(self.members)]
        joined = concatenated([embeddings for _, embeddings in members])
        test = score(
            joined, splits.test, splits.gallery, prefix="test", ks=splits.recall_ks, seed=config.seed, one_shot_ways=ONE_SHOT_WAYS,
        )  # fmt: skip
        configs = [self.jobs[i].config for i in sorted(self.members)]
        seed_values = [c.seed for c in configs]
        tags, params = {"kind": "final_ensemble", "seeds": " ".join(map(str, seed_values))}, {"ensemble_seeds": len(members)}
        tied = [(self.plan.seed_trial(i), c) for i, c in zip(sorted(self.members), configs, strict=True)] if self.plan.members else None
        if tied:  # several configs in one model: no one config's keys as its params; each member's run holds its own
            tags["trials"] = params["ensemble_trials"] = " ".join(str(trial) for trial, _ in tied)
            tags["members"] = "each member's config is its final_seed run's params (tag optuna_trial), and tied_configs.yaml"
        else:
            trained, named = config_params(config.to_dict())
            params, tags = {**trained, **params}, {**tags, **named}
        name, writer = self.plan.ensemble_run_name(self.name), self.target.writer
        self.open_child(name, tags, params)
        run_id = writer.run_id(name)
        with killed_on_signal(run_id, writer):
            bundles, register, workdir = [bundle for bundle, _ in members], self.register, self.target.workdir
            info = log_model(writer, bundles, self.example, workdir, "embedding-ensemble", register)
            member_tests = [self.results[i].test for i in sorted(self.members)] if tied else None
            registered = link_metrics(info, test, config, register, self.origin(), writer, seed_values, tied, member_tests)
            # the registered model's own retrieval grid and t-SNE map, which the report shows (not seed 0's)
            gallery = None if joined.gallery is None else joined.gallery.numpy()
            what = "the final model, the seeds as one"
            for path in test_pictures(splits.test, splits.gallery, joined.queries.numpy(), gallery, config.seed, what, "ensemble", workdir):
                writer.patiently(lambda _, path=path: mlflow.log_artifact(str(path)), "the final model's pictures")
        width = sum(c.embedding_dim for c in configs)
        return EnsembleResult(run_id, test, info.model_uri, registered, tuple(trial for trial, _ in tied or ()), width)


@contextlib.contextmanager
def killed_on_signal(run_id: str, writer: FinalWriter) -> Iterator[None]:
    """The existing run ``run_id`` made active; it ends FINISHED (waiting for the server while it is away), FAILED on
    an error, and KILLED (with the signal as ``failure_reason``) when a signal stops the work inside, where MLflow's own
    context would end it FAILED. With the server away at the error or signal, the run is left RUNNING for the next
    study.final (``close_abandoned``)."""
    writer.patiently(lambda _: mlflow.start_run(run_id=run_id), "the run's records")
    try:
        yield
    except KeyboardInterrupt as error:
        writer.leave_run("KILLED", f"stopped by {signal_name(error)}")
        raise
    except BaseException:
        writer.leave_run("FAILED")
        raise
    if not writer.leave_run("FINISHED"):  # the server was away: the end is written once it answers
        writer.patiently(lambda _: mlflow.MlflowClient().set_terminated(run_id, status="FINISHED"), "the run's end")


def train_configuration(
    plan: FinalPlan, name: str, config: TrainConfig, splits: DatasetSplits, target: Target, register: str | None
) -> ConfigurationResult:
    """Train ``config`` over the plan's seeds where the target's placement says, one child run each; the run ids are
    kept in the target's ``opened``."""
    from study.final.pyfunc import input_example

    placement = target.placement
    device = ("cuda" if placement.gpus > 0 else "cpu") if placement.address else str(target.device)
    jobs = [
        SeedJob(i, plan.seed_config(config, i), device, target.num_workers, placement.threads, target.data_root) for i in range(plan.seeds)
    ]
    runs = SeedRuns(plan, name, target, register, input_example(splits.test))
    placing.train_seeds(jobs, placement, splits, runs, train_seed)
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
    client: mlflow.MlflowClient, plan: FinalPlan, splits: dict[tuple[str, int], DatasetSplits], target: Target
) -> tuple[ConfigurationResult, ...]:
    """Every configuration of the plan, in order; the parent run's files are rewritten after each."""
    with uninterrupted():
        if plan.grid:
            configurations = {n: c.to_dict() for n, c in plan.configurations}
            target.writer.patiently(
                lambda _: client.log_dict(target.parent_id, configurations, "configurations.yaml"), "the configurations"
            )
        else:
            config_file = inputs.write_yaml(target.workdir / f"{plan.prefix}config.yaml", plan.configurations[0][1].to_dict())
            target.writer.patiently(lambda _: client.log_artifact(target.parent_id, str(config_file)), "the config")
    outcomes: list[ConfigurationResult] = []
    for index, (name, config) in enumerate(plan.configurations):
        if plan.grid:
            print(f"\n[{index + 1}/{len(plan.configurations)}] {name}", flush=True)
        data = splits[(config.dataset, config.image_size)]
        outcomes.append(train_configuration(plan, name, config, data, target, plan.register if index == 0 else None))
        with uninterrupted():
            target.writer.patiently(lambda _: record_outcomes(client, target.parent_id, plan, outcomes), "the parent run's results")
    return tuple(outcomes)


class StoppedWhenDone(StudyInterrupted):
    """A signal that waited for the last write of a final whose runs had all ended FINISHED."""


class StoppedUnmarked(StudyInterrupted):
    """A signal that stopped a final while its MLflow server did not answer: its runs are left RUNNING and what it had
    not written waits in ``spool``, for the next study.final on this machine (``writer.close_abandoned``)."""

    def __init__(self, signum: int, spool: str) -> None:
        super().__init__(signum)
        self.spool = spool


def run_final(args: argparse.Namespace) -> FinalResult:
    """Plan, check the input, then train under a parent run; a failure leaves no run RUNNING. A signal stops the
    training at once, but waits for the end of an MLflow write of the driver (``interrupts.uninterrupted``)."""
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    checks.check_address(args.address)  # before Ray: ray.init retries a dead address for minutes
    with locks.store_setup_lock(uri):  # --study reads the store: one driver at a time creates or migrates a new one
        plan = make_plan(args, uri)
    if plan.study is None:
        return train_final(args, uri, plan)
    with locks.final_lock(tracking.runs_dir() / "locks", plan.study):  # one final of a study at a time
        return train_final(args, uri, plan)


def train_final(args: argparse.Namespace, uri: str, plan: FinalPlan) -> FinalResult:
    """``run_final`` once the plan is made: the data checked, then the training under a parent run."""
    device = resolve_device(args.device)
    # --data-root, else the study's own root, else $DML_DATA_ROOT: an exported default must not send a study's
    # final to another copy of its data than the one the study searched on
    data_root = (tracking.absolute_data_root(args.data_root) if args.data_root else plan.data_root) or tracking.absolute_data_root(None)
    splits = load_data(plan, data_root, args.download)  # every input error surfaces before a run is created
    with locks.store_setup_lock(uri):
        experiment_id = tracking.setup(uri, plan.experiment)  # once per command, after every input check
    client = mlflow.MlflowClient(uri)
    placement = placement_of(args, plan, device)
    first = plan.configurations[0][1]
    if plan.grid:
        what = f"{len(plan.configurations)} configurations of {plan.name}"
    elif plan.members:  # the race's tie: several configs, one model
        what = f"{plan.name}: the race's tie as one model, " + ", ".join(f"#{m.trial} {m.config.loss}" for m in plan.members)
    else:
        what = f"{plan.name}: {first.loss}"
    shown = "" if placement.address else f", device {device}"
    print(f"final training of {what} on {first.dataset}, {first.epochs} epochs, seeds {plan.seed_values()}{shown}")
    print(f"the seeds train {placement.describe()}", flush=True)
    if plan.members:
        tie = ", ".join(f"Optuna #{plan.seed_trial(i)} (seed {seed})" for i, seed in enumerate(plan.seed_values()))
        print(f"the study's race could not tell its candidates apart: the seeds train {tie}, as one model (--members pick: the pick alone)")
    close_abandoned(client, experiment_id)
    # on a cluster, checks that a node holds one seed's task before any run exists
    with placing.session(placement), locks.process_lock(tracking.runs_dir() / "locks", "final") as lock:
        owner = locks.owner_tags(lock)
        writer = FinalWriter(uri, spool_of(lock), str(lock))
        parent_id: str | None = None  # set once the parent run exists: a signal that waited for its writes marks it
        target: Target | None = None  # set with the parent run: a failure marks the child runs it opened
        try:
            with uninterrupted():
                parent_id = open_parent(client, experiment_id, plan, owner)
            writer.start()
            with tempfile.TemporaryDirectory() as tmp:
                target = Target(experiment_id, parent_id, placement, device, args.num_workers, Path(tmp), data_root, owner, writer)
                outcomes = train_plan(client, plan, splits, target)
            writer.close()
        except BaseException as error:
            if not stop_runs(client, writer, target.opened if target else [], None if plan.parent_run_id else parent_id, error):
                locks.keep(lock)  # for the next study.final, which ends the runs
                if isinstance(error, KeyboardInterrupt):
                    raise StoppedUnmarked(signal.Signals[signal_name(error)], writer.queue.path) from error
            raise
        try:
            with uninterrupted():
                if plan.parent_run_id is None:
                    writer.patiently(lambda _: client.set_terminated(parent_id, status="FINISHED"), "the parent run's end")
                elif plan.study and not plan.grid:  # the study's description ends with what its pick measured on the test classes
                    writer.patiently(lambda _: note_study_retrained(client, parent_id, outcomes[0]), "the study's description")
        except StudyInterrupted as error:  # it waited for the last write: nothing is left to mark
            raise StoppedWhenDone(error.signum) from None
        except KeyboardInterrupt as error:  # stopped while the server was away: the next study.final ends the parent
            locks.keep(lock)  # for the next study.final, which ends the runs
            raise StoppedUnmarked(signal.Signals[signal_name(error)], writer.queue.path) from error
    report = plan.study or (plan.run_name if plan.grid else None)
    named = {"experiment": plan.experiment, "experiment_id": experiment_id, "report": report, "study": plan.study}
    return FinalResult(plan.name, uri, parent_id, outcomes, **named)


def note_study_retrained(client, study_parent_id: str, outcome: ConfigurationResult) -> None:
    """The study's parent run description (``ending.with_final``): the retrained pick's test metrics and its model."""
    note = client.get_run(study_parent_id).data.tags.get(ending.NOTE_TAG, "")
    trials = outcome.ensemble.trials if outcome.ensemble is not None else ()
    text = ending.with_final(note, outcome.summary, len(outcome.seeds), outcome.config.epochs, served_model(outcome), trials)
    client.set_tag(study_parent_id, ending.NOTE_TAG, text)

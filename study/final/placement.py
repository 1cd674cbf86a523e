"""Where study.final's seeds train: one after another in the driver, or side by side as Ray tasks.

On a Ray cluster (``--address``) every seed is a Ray task holding the trial's resources (``--cpus-per-trial``,
``--gpus-per-trial``), placed by Ray on any node that has them; the seeds run in parallel as far as the cluster
holds them. On this machine they run as tasks of a local Ray when ``local_placement`` says that pays, else in
the driver, one after another. Either way the driver alone writes to MLflow: a task streams each epoch's metrics
and then the seed's output (``SeedOutput``: test metrics, the model's weights, its pictures) back to it.

A task whose worker or node is lost is run again from its first epoch (``SEED_RETRIES``): a Ray generator task
delivers each of its items once, so the epochs the lost attempt had already reported are not reported again.
An error of the training itself (a diverged loss, an unreadable image) is not retried: it would fail again.

Ray is imported only when a session starts (``study.launch.ray_session``: a local Ray binds to the loopback);
torch only inside a task (``study.final`` does the training), so this module is as light as the driver.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from study.final.results import EpochReport, SeedJob, SeedOutput
from study.interrupts import StopSignals, uninterrupted

if TYPE_CHECKING:
    pass

SEED_RETRIES = 3  # attempts after the first of a seed whose worker or node died (Ray's max_retries)
# Fault injection for tests: the first seed task to end its second epoch (its first one reported) while this file is
# missing creates it, and its worker dies (os._exit) as a worker does whose node is lost; Ray then runs the seed again.
FAULT_ENV = "DML_FINAL_LOSE_A_SEED_ONCE"
# The placement rule (docs/performance.md, measurements behind the code): the seeds of a configuration train side by
# side, one process per seed sharing the cores, when this machine has at least this many cores.
PARALLEL_MIN_CORES = 2


@dataclass(frozen=True)
class Placement:
    """Where a final training's seeds train, resolved before any MLflow run exists."""

    parallel: bool  # as Ray tasks side by side; False: one after another in the driver
    address: str | None = None  # the Ray cluster's; None: this machine (a local Ray when parallel)
    cpus: float = 1.0  # Ray resources of one seed's task
    gpus: float = 0.0
    threads: int | None = None  # torch threads of a seed's task; None: torch's default (in the driver)
    local_cpus: float | None = None  # logical CPUs of the local Ray (None: on a cluster)

    def describe(self) -> str:
        if not self.parallel:
            return "one after another in this process"
        where = f"Ray at {self.address}" if self.address else "a local Ray"
        gpus = f", {self.gpus:g} GPU" if self.gpus else ""
        return f"side by side as tasks of {where} ({self.cpus:g} CPU{gpus} and {self.threads} torch thread(s) each)"


def local_placement(cores: int, seeds: int, device_type: str) -> Placement:
    """The rule for a final training on this machine (no ``--address``), from what was measured (docs/performance.md,
    measurements behind the code).

    With ``cores >= PARALLEL_MIN_CORES``, CPU training and more than one seed, all the seeds of a configuration
    train at once, each in its own process with ``cores // seeds`` torch threads (at least 1); a local Ray gets as
    many logical CPUs as there are seeds (each task asks for one). On 2 cores that beat one seed after another with
    one thread, one after another with torch's threads, and 2 at once then 1. The local Ray's start is a fixed cost,
    so on a budget of a few epochs one after another can still win.
    A GPU, a single seed or a single core: one after another in the driver, as before.
    """
    if device_type != "cpu" or seeds < 2 or cores < PARALLEL_MIN_CORES:
        return Placement(parallel=False)
    return Placement(parallel=True, threads=max(1, cores // seeds), local_cpus=float(max(cores, seeds)))


def cluster_placement(address: str, cpus: float, gpus: float) -> Placement:
    """Seeds as tasks of the Ray cluster at ``address``, each holding ``cpus`` CPUs (as many torch threads) and ``gpus`` GPUs."""
    return Placement(parallel=True, address=address, cpus=cpus, gpus=gpus, threads=max(1, int(cpus)))


Train = Callable[[SeedJob, Any, Callable[[EpochReport], None]], SeedOutput]


class SeedRecorder(Protocol):
    """What the driver does with a configuration's seeds as they go: open a seed's run, log an epoch, record the output."""

    def start(self, job: SeedJob) -> None: ...

    def epoch(self, report: EpochReport) -> None: ...

    def done(self, output: SeedOutput) -> None: ...


class Uninterrupted:
    """``recorder`` whose calls a signal never cuts in half (``interrupts.uninterrupted``): each of its MLflow writes
    ends, then the signal stops the seeds. The training between the calls stops at once."""

    def __init__(self, recorder: SeedRecorder) -> None:
        self.recorder = recorder

    def start(self, job: SeedJob) -> None:
        with uninterrupted():
            self.recorder.start(job)

    def epoch(self, report: EpochReport) -> None:
        with uninterrupted():
            self.recorder.epoch(report)

    def done(self, output: SeedOutput) -> None:
        with uninterrupted():
            self.recorder.done(output)


@contextlib.contextmanager
def session(placement: Placement) -> Iterator[None]:
    """The Ray session the placement needs (none in the driver): the cluster's, or a local Ray of ``local_cpus`` CPUs.

    On a cluster, checks first that some node can hold one seed's task (else it would wait forever). The driver's
    signal handlers are installed again over the ones ``ray.init`` puts in (which abort the process on SIGTERM), as
    study.launch does, so that a signal still ends the seeds' runs KILLED.
    """
    if not placement.parallel:
        yield
        return
    from study import checks
    from study.ray_session import ray_session

    with ray_session(placement.address, (placement.local_cpus, None)), StopSignals().installed():
        checks.check_cluster_resources(placement.cpus, placement.gpus)
        yield


def train_seeds(jobs: Sequence[SeedJob], placement: Placement, splits: Any, recorder: SeedRecorder, train: Train) -> None:
    """Train every job where ``placement`` says, calling ``recorder`` in the driver as each seed starts, ends an epoch, ends.

    ``splits`` (the driver's loaded dataset) goes to the tasks of a local Ray through its object store; a task on a
    cluster loads the dataset on its own node from ``job.data_root``, as a study's trials do. In the driver, the jobs
    run one after another through ``train``; a failure or a signal stops at once and propagates, except that a signal
    during one of ``recorder``'s calls lets the call end first (``Uninterrupted``).
    """
    recorder = Uninterrupted(recorder)
    if not placement.parallel:
        for job in jobs:
            recorder.start(job)
            recorder.done(train(job, splits, recorder.epoch))
        return
    import ray

    task = ray.remote(seed_stream).options(num_cpus=placement.cpus, num_gpus=placement.gpus, max_retries=SEED_RETRIES)
    shared = ray.put(splits) if placement.address is None else None
    streams = {}
    for job in jobs:
        recorder.start(job)
        streams[task.remote(job, shared)] = job
    pending = list(streams)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)  # a timeout, so that a signal is taken at once
            for stream in ready:
                try:
                    item = ray.get(next(stream))
                except StopIteration:
                    continue
                except ray.exceptions.RayTaskError as error:  # the training's own error, as the driver would have raised it
                    raise error.cause from None
                if isinstance(item, SeedOutput):
                    recorder.done(item)
                else:
                    recorder.epoch(item)
                pending.append(stream)
    finally:
        for stream in pending:
            ray.cancel(stream, force=True)


def seed_stream(job: SeedJob, splits: Any) -> Iterator[EpochReport | SeedOutput]:
    """One seed's Ray task: its epochs as they end, then its output (a generator: Ray streams each item to the driver).

    The training runs in a thread of the task, its epoch callback feeding this generator.
    """
    from study.final.seed import train_seed  # torch and the engine: imported by the task's worker, never by the driver

    if splits is None:
        from trainables.core.data import load_dataset

        splits = load_dataset(job.config.dataset, job.data_root, job.config.image_size)
    events: queue.SimpleQueue = queue.SimpleQueue()

    def on_epoch(report: EpochReport) -> None:
        lose_the_worker_once(report)
        events.put(report)

    def train() -> None:
        try:
            events.put(train_seed(job, splits, on_epoch))
        except BaseException as error:  # handed to the generator, which raises it in the task
            events.put(error)

    threading.Thread(target=train, name=f"seed {job.config.seed}", daemon=True).start()
    while True:
        item = events.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, SeedOutput):
            return


def lose_the_worker_once(report: EpochReport) -> None:
    """Fault injection (``FAULT_ENV``): the worker dies abruptly at its second epoch, once per marker file."""
    marker = os.environ.get(FAULT_ENV)
    if not marker or report.epoch < 2:
        return
    try:
        with open(marker, "x"):
            pass
    except FileExistsError:
        return
    os._exit(1)

"""What crosses the boundaries of study.final: a seed's job and its output (between the driver and a seed's task),
and the results the driver records and prints (a seed's, a seed ensemble's, a configuration's, the command's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainables.core.config import TrainConfig

if TYPE_CHECKING:
    from trainables.core.engine import Embeddings


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
    study: str | None = None  # the study retrained (--study): the MLflow UI opens at its runs, the pick first

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


@dataclass(frozen=True)
class SeedJob:
    """One seed of one configuration: what its task needs to train and test it."""

    index: int  # in the configuration's seeds: 0 is the config's own seed
    config: TrainConfig  # with the seed set
    device: str  # cpu, cuda, cuda:N
    num_workers: int | None  # None: engine.loader_workers' rule
    threads: int | None  # torch threads; None: leave torch's default
    data_root: str | None  # where a task on another node loads the dataset


@dataclass(frozen=True)
class EpochReport:
    """One epoch of a seed, as its training reported it."""

    index: int
    epoch: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class SeedOutput:
    """What one seed's training hands the driver to record: no MLflow was touched where it trained."""

    index: int
    test: dict[str, float]  # the test_* metrics
    similarity: dict[str, float]  # mean cosine similarity of positive and negative test pairs
    time_s: float  # training and testing, seconds
    bundle: dict[str, Any]  # the model's bundle on the CPU (config, weights, kind, image size), for the pyfunc model
    pictures: dict[str, bytes]  # PNG files by name: the similarity histogram, the retrieval grid, the t-SNE map
    node: str  # the host it trained on
    embeddings: Embeddings | None = None  # the test set's (queries, gallery): a seed ensemble's metrics are computed from them

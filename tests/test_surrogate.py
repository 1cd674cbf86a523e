"""The surrogate trainable: no torch, a deterministic seeded curve of the documented shape, fit_budgets' ladder, and
Ray Tune runs that report every epoch and resume an interrupted trial from its checkpoint."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray
from ray import tune

from study.ray_session import LOCAL_RAY_ENV
from tests.conftest import ROOT
from trainables import surrogate
from trainables.core import budgets, schedule
from trainables.core.config import ConfigError, TrainConfig
from trainables.surrogate import LadderPlace, ladder_places, surrogate_metrics, train_surrogate

DEFAULT = TrainConfig.from_dict({})  # heating and the lr drop from 0.75 of the budget: shared_prefix(b) = floor(0.75 b)
LADDER_KEYS = ("budget", "epoch", "epochs_trained", "completed_budget", "objective_step")
VAL_KEYS = ("val_recall_at_1", "val_recall_at_2", "val_recall_at_4", "val_recall_at_8", "val_map_at_r", "val_r_precision", "val_nmi")
TIME_KEYS = ("time/data_s", "time/compute_s", "time/train_s", "time/eval_s", "time/epoch_s")


def test_importing_the_surrogate_imports_no_torch_faiss_or_sklearn():
    probe = "import trainables.surrogate, sys; print(sorted(m for m in ('torch','torchvision','faiss','sklearn') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_fault_variable_and_marker_are_train_dmls():
    from trainables import dml  # imports torch: fine in this process, the surrogate's own import is checked above

    assert surrogate.FAULT_ENV == dml.FAULT_ENV
    assert surrogate.FAULT_DONE == "injected_fault_done"  # the name train_dml gives its marker (dml.py, fault_done)


def test_a_bad_config_fails_as_in_train_dml():
    with pytest.raises(ConfigError, match=r"trial config: loss='arcface' is not allowed"):
        train_surrogate({"loss": "arcface"})
    with pytest.raises(ConfigError, match=r"trial config: unknown key 'alfa'"):
        train_surrogate({"alfa": 2.0})


# -- the curve ----------------------------------------------------------------------------------------------------


def test_the_same_config_budget_and_epoch_give_the_same_metrics_and_another_seed_other_noise():
    a = surrogate_metrics(DEFAULT, 8, 5)
    assert a == surrogate_metrics(TrainConfig.from_dict({}), 8, 5)
    assert a == surrogate_metrics(DEFAULT.replace(epochs=3), 8, 5)  # the budget, not the config's epochs, sets the schedule
    assert a == surrogate_metrics(DEFAULT.replace(momentum=0.5), 8, 5)  # momentum does not change Adam's training
    assert surrogate_metrics(DEFAULT.replace(seed=1), 8, 5)["val_recall_at_1"] != a["val_recall_at_1"]
    assert surrogate_metrics(DEFAULT.replace(lr=1.1e-3), 8, 5)["val_recall_at_1"] != a["val_recall_at_1"]
    # a fresh interpreter (another hash salt) draws the same: the noise is seeded from a sha256, not hash()
    probe = (
        "import json; from trainables.core.config import TrainConfig; from trainables.surrogate import surrogate_metrics; "
        "print(json.dumps(surrogate_metrics(TrainConfig.from_dict({}), 8, 5)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == a


def final_recall(config: TrainConfig, budget: int, seeds: int = 40) -> float:
    """Mean over seeds of val R@1 at the end of ``budget``."""
    return float(np.mean([surrogate_metrics(config.replace(seed=s), budget, budget)["val_recall_at_1"] for s in range(seeds)]))


def test_a_finished_longer_budget_ends_higher():
    for config in (DEFAULT, DEFAULT.replace(loss="ice", ice_scale=32.0), DEFAULT.replace(heating="none", lr_schedule="cosine")):
        finals = [final_recall(config, b) for b in (1, 4, 16, 30)]
        assert finals == sorted(finals), finals
        assert finals[2] > finals[1] + 0.05
    assert 0.2 < final_recall(DEFAULT, 1) < 0.4  # docs/findings.md, the papers' tables: about 0.3 after one epoch ...
    assert 0.6 < final_recall(DEFAULT, 16) < 0.85  # ... and 0.6-0.85 at 16 epochs


def test_an_epoch_and_the_softmax_loss_start_follow_the_fit_classes_of_the_validation_fraction():
    """As the real split holds out round(val_fraction x 136) of Omniglot's training characters: 0.2 leaves 109 (2,180
    images), 0.3 leaves 95 (1,900). A batch of 16 x 3 = 48 images: 2180 // 48 = 45, 1900 // 48 = 39 steps an epoch.
    The softmax loss starts at ln(fit classes): ln 109 = 4.691, ln 95 = 4.554 before the curve and the lr scale it."""
    batch = DEFAULT.replace(classes_per_batch=16, samples_per_class=3)
    assert [surrogate.steps_per_epoch(batch.replace(val_fraction=f)) for f in (0.2, 0.3)] == [45, 39]
    assert [surrogate.fit_classes(batch.replace(val_fraction=f)) for f in (0.2, 0.3)] == [109, 95]
    losses = [surrogate_metrics(batch.replace(val_fraction=f, loss="softmax"), 4, 1)["train_loss"] for f in (0.2, 0.3)]
    assert losses[1] / losses[0] == pytest.approx(math.log(95) / math.log(109))


def test_an_lr_far_from_the_sweet_spot_scores_lower():
    sweet = final_recall(DEFAULT.replace(lr=2e-3), 16)
    for lr in (1e-5, 1e-4, 0.1, 1.0):
        assert final_recall(DEFAULT.replace(lr=lr), 16) < sweet - 0.05, lr
    assert final_recall(DEFAULT.replace(lr=2e-3, optimizer="sgd"), 16) < final_recall(DEFAULT.replace(lr=5e-2, optimizer="sgd"), 16)


def test_normalization_ranks_as_the_papers_table_1():
    ranked = [final_recall(DEFAULT.replace(normalization=n, heating="none"), 8) for n in ("none", "l2", "bn")]
    assert ranked == sorted(ranked)


CONFIGS = [
    DEFAULT,
    DEFAULT.replace(loss="ice", ice_scale=4.0, samples_per_class=8, classes_per_batch=48, lr_schedule="linear"),
    DEFAULT.replace(normalization="none", alpha=1.0, heating="none", lr_schedule="constant", lr=1.0),
    DEFAULT.replace(heating="cosine", alpha=64.0, heating_target=1.0, lr_schedule="cosine", lr=1e-6, embedding_dim=2),
    DEFAULT.replace(optimizer="sgd", lr=0.05, mean_proxy_weight=1.0, classes_per_batch=2, samples_per_class=1),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "ice", "plain", "extreme", "sgd"])
def test_values_are_in_range_ordered_and_the_schedule_is_the_real_one(config):
    for budget in (1, 2, 5, 16):
        losses = []
        for epoch in range(1, budget + 1):
            metrics = surrogate_metrics(config, budget, epoch)
            assert all(math.isfinite(v) for v in metrics.values())
            assert all(0 <= metrics[k] <= 1 for k in (*VAL_KEYS, "train_accuracy")), metrics
            recalls = [metrics[f"val_recall_at_{k}"] for k in (1, 2, 4, 8)]
            assert recalls == sorted(recalls)
            assert metrics["val_map_at_r"] <= metrics["val_r_precision"] <= metrics["val_recall_at_1"]
            assert 0.3 <= metrics["val_nmi"] <= 0.95
            last_step = epoch - 1 / surrogate.steps_per_epoch(config)  # the engine reads lr_now after the epoch's last step
            budget_config = config.replace(epochs=budget)
            assert metrics["lr_now"] == pytest.approx(config.lr * schedule.lr_factor_at(budget_config, last_step))
            assert ("alpha_now" in metrics) == (config.loss == "softmax")  # ICE's schedule_metrics is empty
            if config.loss == "softmax":
                assert metrics["alpha_now"] == pytest.approx(schedule.alpha_at(budget_config, last_step))
            losses.append(metrics["train_loss"])
        assert all(b < a for a, b in zip(losses, losses[1:])), losses  # train_loss falls every epoch of a budget


def test_the_tail_of_a_budget_bumps_the_curve():
    def mean_recall(epoch: int) -> float:
        return float(np.mean([surrogate_metrics(DEFAULT.replace(seed=s), 16, epoch)["val_recall_at_1"] for s in range(40)]))

    # budget 16 drops the lr and heats from its 13th epoch (12 = 0.75 x 16 epochs before): more gain there than before
    assert mean_recall(13) - mean_recall(12) > mean_recall(12) - mean_recall(11) + 0.02


# -- the ladder ---------------------------------------------------------------------------------------------------


def rows(places: Iterator[LadderPlace], single_budget: bool = False) -> list[tuple[int | None, ...]]:
    return [tuple(p.report_keys(single_budget).get(k) for k in LADDER_KEYS) for p in places]


def test_the_ladder_2_4_8_by_hand():
    # shared_prefix of budgets 2, 4, 8 with heating and the lr drop at 0.75: 1, 3, 6. Budget 4 continues from epoch 1
    # of budget 2, budget 8 from epoch 3 of budget 4: 2 + (4 - 1) + (8 - 3) = 10 epochs.
    assert [schedule.shared_prefix(DEFAULT.replace(epochs=b)) for b in (2, 4, 8)] == [1, 3, 6]
    expected = [
        # budget, epoch, epochs_trained, completed_budget, objective_step
        (2, 1, 1, 0, None),
        (2, 2, 2, 2, 2),
        (4, 2, 3, 2, None),
        (4, 3, 4, 2, None),
        (4, 4, 5, 4, 4),
        (8, 4, 6, 4, None),
        (8, 5, 7, 4, None),
        (8, 6, 8, 4, None),
        (8, 7, 9, 4, None),
        (8, 8, 10, 8, 8),
    ]
    assert rows(ladder_places(DEFAULT, [2, 4, 8])) == expected
    # budgets.py's documented rule: b_1, then b_{i+1} - shared_prefix(b_i) per promotion
    assert expected[-1][2] == 2 + (4 - 1) + (8 - 3)
    # one budget: objective_step every epoch
    assert rows(ladder_places(DEFAULT, [3]), single_budget=True) == [(3, 1, 1, 0, 1), (3, 2, 2, 0, 2), (3, 3, 3, 3, 3)]


class Interrupted(Exception):
    """Stops fit_budgets after an epoch, as a failed trial does."""


class FakeRun:
    """What fit_budgets reads of engine.Run: a bundle that names its epoch."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def bundle(self) -> dict[str, int]:
        return {"epoch": self.epoch}


def fake_fit(config: TrainConfig, on_epoch, *, resume=None, **kwargs) -> FakeRun:
    """engine.fit without training: the epochs after ``resume`` up to ``config.epochs``."""
    run = FakeRun(int(resume["epoch"]) if resume else 0)
    for epoch in range(run.epoch + 1, config.epochs + 1):
        run = FakeRun(epoch)
        on_epoch(epoch, {}, run)
    return run


@pytest.fixture
def torchless_engine(monkeypatch):
    """fit_budgets' lazy ``from .engine import fit`` finds fake_fit: the real ladder logic, no torch."""
    engine = types.ModuleType("trainables.core.engine")
    engine.fit = fake_fit
    monkeypatch.setitem(sys.modules, "trainables.core.engine", engine)


def place_of(state: budgets.LadderState) -> LadderPlace:
    return LadderPlace(
        budget=state.budget,
        epoch=int(state.bundle["epoch"]),
        epochs_trained=state.epochs_trained,
        completed_budget=state.completed_budget,
        prefix_epoch=None if state.prefix is None else int(state.prefix["epoch"]),
    )


LADDERS = [
    (DEFAULT, [2, 4, 8]),  # prefixes 1, 3, 6
    (DEFAULT.replace(lr_decay_start=0.0, lr_schedule="linear"), [2, 4, 8]),  # linear to zero: no prefix, every budget from scratch
    (DEFAULT.replace(heating="none", lr_schedule="constant"), [1, 3, 5]),  # nothing changes: the whole budget is its prefix
    (DEFAULT.replace(heating_start=0.5, lr_decay_start=0.5), [1, 2, 3, 7]),  # prefixes 0, 1, 1, 3
    (DEFAULT, [5]),
]


@pytest.mark.parametrize("config, ladder_budgets", LADDERS, ids=["default", "from-scratch", "whole-prefix", "repeated-prefix", "single"])
def test_the_ladder_is_fit_budgets_and_resumes_after_every_epoch(torchless_engine, config, ladder_budgets):
    reported: list[tuple[tuple, LadderPlace]] = []

    def record(metrics: dict[str, float], state: budgets.LadderState) -> None:
        reported.append((tuple(metrics.get(k) for k in LADDER_KEYS), place_of(state)))

    budgets.fit_budgets(config, ladder_budgets, record)
    mine = list(ladder_places(config, ladder_budgets))
    assert rows(mine, len(ladder_budgets) == 1) == [keys for keys, _ in reported]
    assert mine == [place for _, place in reported]  # the prefix too: the epoch fit_budgets keeps its prefix bundle at
    total = ladder_budgets[0] + sum(
        b - schedule.shared_prefix(config.replace(epochs=a)) for a, b in zip(ladder_budgets, ladder_budgets[1:])
    )
    assert mine[-1].epochs_trained == total and mine[-1].completed_budget == ladder_budgets[-1]

    for stop in range(len(mine)):  # interrupted after each epoch: the checkpoint's place goes on as fit_budgets' state
        state = None

        def interrupt(metrics: dict[str, float], current: budgets.LadderState, stop: int = stop) -> None:
            nonlocal state
            state = current
            if current.epochs_trained == stop + 1:
                raise Interrupted

        with pytest.raises(Interrupted):
            budgets.fit_budgets(config, ladder_budgets, interrupt)
        resumed: list[LadderPlace] = []
        budgets.fit_budgets(config, ladder_budgets, lambda m, s, out=resumed: out.append(place_of(s)), state=state)
        saved = LadderPlace.from_dict(json.loads(json.dumps(mine[stop].to_dict())))  # through the checkpoint's JSON
        assert place_of(state) == saved
        assert list(ladder_places(config, ladder_budgets, saved)) == resumed == mine[stop + 1 :]


# -- Ray Tune -----------------------------------------------------------------------------------------------------

CONFIG = {"epochs": 3}  # budgets [1, 3]: shared_prefix(1) = 0, so budget 3 trains from scratch: 1 + 3 = 4 epochs
LADDER_1_3 = [(1, 1, 1, 1, 1), (3, 1, 2, 1, None), (3, 2, 3, 1, None), (3, 3, 4, 3, 3)]


class LocalRay:
    """One local Ray at a time for this module: 2 CPUs, study.launch's local settings, the workers' env vars as asked
    (a worker's environment is fixed when Ray starts, so other env vars need a new Ray)."""

    def __init__(self) -> None:
        self.env_vars: dict[str, str] | None = None

    def start(self, env_vars: dict[str, str]) -> None:
        if ray.is_initialized() and env_vars == self.env_vars:
            return
        ray.shutdown()
        ray.init(
            address="local",
            num_cpus=2,
            num_gpus=0,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": env_vars} if env_vars else None,  # warnings: LOCAL_RAY_ENV
        )
        self.env_vars = env_vars


@pytest.fixture(scope="module")
def local_ray() -> Iterator[LocalRay]:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in LOCAL_RAY_ENV.items():
            patch.setenv(key, value)
        patch.delenv(surrogate.FAULT_ENV, raising=False)
        try:
            yield LocalRay()
        finally:
            ray.shutdown()


class Reported(tune.Callback):
    """Every result the driver received, by trial id, in order: what the study's MLflow callback records. (Ray's own
    result.json of a trial that failed and was retried can lack the rows of the failed attempt: seen once, under
    load, with every row in its progress.csv.)"""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.rows.setdefault(trial.trial_id, []).append(dict(result))


def fit(tmp_path, name: str, seeds: list[int], max_failures: int, checkpoint_every_s: float = 0.0) -> tuple[tune.ResultGrid, Reported]:
    reported = Reported()
    tuner = tune.Tuner(
        tune.with_parameters(train_surrogate, budgets=[1, 3], epoch_seconds=0.0, checkpoint_every_s=checkpoint_every_s),
        param_space={**CONFIG, "seed": tune.grid_search(seeds)},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp_path / "ray"), verbose=0, failure_config=tune.FailureConfig(max_failures=max_failures),
            callbacks=[reported],
        ),
    )  # fmt: skip
    return tuner.fit(), reported


def reported_frame(reported: Reported, result: tune.Result) -> pd.DataFrame:
    """The results the driver received from ``result``'s trial, one row each."""
    return pd.DataFrame(reported.rows[result.metrics["trial_id"]])


def ladder_rows(frame: pd.DataFrame) -> list[tuple[int | None, ...]]:
    return [tuple(None if pd.isna(row[k]) else int(row[k]) for k in LADDER_KEYS) for _, row in frame.iterrows()]


@pytest.mark.slow
def test_a_tune_run_reports_every_epoch_of_the_ladder(local_ray, tmp_path):
    local_ray.start({})
    results, reported = fit(tmp_path, "plain", [0, 1], max_failures=0)
    assert len(results) == 2 and not results.errors
    for result in results:
        frame = reported_frame(reported, result)
        assert ladder_rows(frame) == LADDER_1_3
        config = TrainConfig.from_dict({**CONFIG, "seed": result.config["seed"]})
        for _, row in frame.iterrows():
            expected = surrogate_metrics(config, int(row["budget"]), int(row["epoch"]))
            assert {k: row[k] for k in expected} == pytest.approx(expected)
        assert all(k in frame.columns for k in (*VAL_KEYS, *TIME_KEYS, "train_loss", "lr_now", "alpha_now"))
        last = result.metrics
        assert last["device"] == "cpu" and last["node"] and last["node_ip"] and last["node_id"]
        assert "resumed_from_epoch" not in frame.columns
        assert result.checkpoint is not None
        with result.checkpoint.as_directory() as folder:
            saved = json.loads((Path(folder) / surrogate.STATE_NAME).read_text())
        # prefix_epoch: shared_prefix(3) = floor(0.75 x 3) = 2, where a budget above 3 would continue from
        assert saved == {"budget": 3, "epoch": 3, "epochs_trained": 4, "completed_budget": 3, "prefix_epoch": 2}


@pytest.mark.faults
@pytest.mark.slow
def test_a_trial_that_fails_resumes_from_its_checkpoint(local_ray, tmp_path):
    local_ray.start({surrogate.FAULT_ENV: "2"})  # each trial raises once after its 2nd epoch, before reporting it
    results, reported = fit(tmp_path, "faulty", [0], max_failures=1)
    assert len(results) == 1 and not results.errors
    result = results[0]
    assert result.metrics["epochs_trained"] == 4 and result.metrics["completed_budget"] == 3  # the ladder's total
    assert (Path(result.path) / surrogate.FAULT_DONE).is_file()  # the fault did fire
    frame = reported_frame(reported, result)
    assert ladder_rows(frame) == LADDER_1_3  # every epoch once: the retry went on from the checkpoint of epoch 1
    assert [None if pd.isna(tag) else tag for tag in frame["resumed_from_epoch"]] == [None, "1", "1", "1"]
    saved = json.loads((Path(result.checkpoint.path) / surrogate.STATE_NAME).read_text())
    assert LadderPlace.from_dict(saved) == LadderPlace(budget=3, epoch=3, epochs_trained=4, completed_budget=3, prefix_epoch=2)


@pytest.mark.faults
@pytest.mark.slow
def test_a_trial_without_a_checkpoint_yet_retries_from_its_start_and_reports_each_epoch_again(local_ray, tmp_path):
    local_ray.start({surrogate.FAULT_ENV: "2"})  # raises once after its 2nd epoch; no epoch was checkpointed
    results, reported = fit(tmp_path, "sparse", [0], max_failures=1, checkpoint_every_s=3600.0)
    assert len(results) == 1 and not results.errors
    result = results[0]
    assert result.checkpoint is None and not list(Path(result.path).glob("checkpoint_*"))  # none in an hour
    frame = reported_frame(reported, result)
    # the first attempt reported epoch 1 (its 2nd raised before its report); the retry started over: 1, 2, 3, 4
    assert ladder_rows(frame) == [LADDER_1_3[0], *LADDER_1_3]
    assert "resumed_from_epoch" not in frame.columns

"""Tests of config key ``precision``: its validation, what it means on each device (``engine.precision_plan``), a bf16
step on the CPU, and the fp16 gradient scaler's step, run on the CPU's GradScaler (the same class as CUDA's)."""

from __future__ import annotations

import math

import pytest
import torch

from trainables.core.config import ConfigError, TrainConfig


def test_precision_defaults_to_fp32_and_refuses_other_names_by_key():
    assert TrainConfig().precision == "fp32"
    for name in ("fp32", "bf16", "fp16"):
        assert TrainConfig.from_dict({"precision": name}).precision == name
    with pytest.raises(ConfigError, match=r"^cfg.yaml: precision='fp64' is not allowed; expected one of fp32, bf16, fp16$"):
        TrainConfig.from_dict({"precision": "fp64"}, source="cfg.yaml")


def test_each_precision_is_an_autocast_dtype_and_a_scaler_per_device():
    from trainables.core.engine import precision_plan

    expected = {
        ("fp32", "cpu"): (None, False),
        ("fp32", "cuda"): (None, False),
        ("bf16", "cpu"): (torch.bfloat16, False),
        ("bf16", "cuda"): (torch.bfloat16, False),
        ("fp16", "cuda"): (torch.float16, True),
    }
    for (precision, device), (dtype, scaled) in expected.items():
        plan = precision_plan(precision, device)
        assert (plan.device_type, plan.dtype, plan.scaled) == (device, dtype, scaled), (precision, device)
    with pytest.raises(ConfigError, match=r"^trial config: precision='fp16' is not allowed on the cpu; expected bf16 or fp32"):
        precision_plan("fp16", "cpu", "trial config")
    assert precision_plan("fp32", "cpu").scaler() is None


def test_a_run_with_fp16_on_the_cpu_stops_at_once_naming_its_config():
    from trainables.core.engine import build_run

    config = TrainConfig.from_dict({"precision": "fp16", "dataset": "synthetic"})
    with pytest.raises(ConfigError, match=r"^runs/x.yaml: precision='fp16' is not allowed on the cpu; expected bf16 or fp32"):
        build_run(config, device=torch.device("cpu"), source="runs/x.yaml")


def test_the_autocast_of_a_plan_computes_a_linear_layer_in_its_dtype():
    from trainables.core.engine import precision_plan

    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with precision_plan("bf16", "cpu").autocast():
        assert layer(x).dtype == torch.bfloat16
    with precision_plan("fp32", "cpu").autocast():
        assert layer(x).dtype == torch.float32


def test_a_scaled_step_unscales_the_gradient_and_skips_an_overflow():
    """SGD, lr 0.1, loss 3 w: the scaled step moves w by 0.3, as the plain step does; an infinite loss skips the step
    and halves the scale (GradScaler's backoff factor 0.5)."""
    from trainables.core.engine import optimizer_step

    def step(loss_of, scaler):
        weight = torch.nn.Parameter(torch.tensor([1.0]))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        optimizer_step(loss_of(weight), optimizer, scaler)
        return float(weight.detach())

    assert step(lambda w: 3 * w.sum(), None) == pytest.approx(0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert step(lambda w: 3 * w.sum(), scaler) == pytest.approx(0.7)
    assert scaler.get_scale() == 1024.0
    assert step(lambda w: w.sum() * math.inf, scaler) == 1.0
    assert scaler.get_scale() == 512.0


@pytest.mark.usefixtures("one_thread")
def test_bf16_on_the_cpu_trains_to_a_finite_loss_other_than_fp32s():
    from trainables.core.data import load_dataset
    from trainables.core.engine import fit

    splits = load_dataset("synthetic", None, 0)
    values = dict(dataset="synthetic", epochs=1, classes_per_batch=8, samples_per_class=2, embedding_dim=16)
    losses = {}
    for precision in ("fp32", "bf16"):
        run = fit(TrainConfig.from_dict({**values, "precision": precision}), splits=splits, device=torch.device("cpu"))
        losses[precision] = run.metrics["train_loss"]
        assert math.isfinite(run.metrics["val_recall_at_1"])
    assert math.isfinite(losses["bf16"])
    # bf16 keeps 8 bits of mantissa: the same seeded run, a different loss, within a few percent
    assert losses["bf16"] != losses["fp32"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)


@pytest.mark.usefixtures("one_thread")
def test_a_scaled_epoch_carries_its_scaler_in_the_checkpoint():
    """fp16's path on the CPU: train_one_epoch with a scaler, and the Run's bundle with the scaler's state."""
    from trainables.core.data import load_dataset
    from trainables.core.engine import PrecisionPlan, build_run, train_one_epoch
    from trainables.core.transforms import image_dataset

    values = dict(dataset="synthetic", epochs=1, classes_per_batch=8, samples_per_class=2, embedding_dim=16)
    run = build_run(TrainConfig.from_dict(values), splits=load_dataset("synthetic", None, 0), device=torch.device("cpu"))
    assert run.scaler is None and "scaler" not in run.bundle()
    run.plan = PrecisionPlan("cpu", torch.bfloat16, scaled=True)
    run.scaler = run.plan.scaler()
    dataset, collate = image_dataset(run.train_set, run.image_size, 1.0, {c: i for i, c in enumerate(run.classes)})
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=run.sampler, collate_fn=collate)
    before = [p.detach().clone() for p in run.model.parameters()]
    metrics = train_one_epoch(run.model, run.loss_fn, run.optimizer, loader, run.device, plan=run.plan, scaler=run.scaler)
    assert math.isfinite(metrics["train_loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))  # the scaled steps were taken
    assert run.bundle()["scaler"]["scale"] == run.scaler.get_scale()

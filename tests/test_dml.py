"""The Ray trainable called directly (no Tune session): a worker decodes its dataset once, for every rung and every trial it runs."""

from __future__ import annotations

import warnings

import pytest
import ray

from trainables import dml
from trainables.core import data, engine


def test_a_worker_decodes_its_dataset_once_for_all_its_rungs_and_trials(monkeypatch):
    loads = []

    def counting_load(*args, **kwargs):
        loads.append(args[0])
        return data.load_dataset(*args, **kwargs)

    reports = []
    monkeypatch.setattr(engine, "load_dataset", counting_load)
    monkeypatch.setattr(dml, "load_dataset", counting_load, raising=False)
    monkeypatch.setattr(dml.tune, "report", lambda metrics, checkpoint=None: reports.append(metrics))
    dml.worker_dataset.cache_clear()
    config = {"dataset": "synthetic", "epochs": 2, "classes_per_batch": 4, "samples_per_class": 2, "embedding_dim": 8, "image_size": 32}
    ray_was_up = ray.is_initialized()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Ray: get_checkpoint / get_trial_dir outside a Tune session
            dml.train_dml(config, budgets=[1, 2])  # two rungs: budget 2 continues after budget 1's shared prefix
            dml.train_dml({**config, "seed": 1}, budgets=[1, 2])  # the next trial the same (reused) worker runs
    finally:
        if ray.is_initialized() and not ray_was_up:
            ray.shutdown()  # the trainable's resource query starts a Ray outside a worker: later tests expect none
    assert len(reports) == 6 and reports[-1]["completed_budget"] == pytest.approx(2)
    assert loads == ["synthetic"]  # before: once per rung of every trial (4 here)

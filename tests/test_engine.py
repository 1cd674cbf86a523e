"""Tests of trainables.core.engine: a run compared with a second, independent run and with an
uninterrupted run after resuming from its checkpoint bundle.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from trainables.core import schedule
from trainables.core.config import TrainConfig


def test_fit_is_deterministic_and_resumes(one_thread):
    from trainables.core.data import load_dataset
    from trainables.core.engine import fit

    config = TrainConfig.from_dict(dict(dataset="synthetic", epochs=2, classes_per_batch=8, samples_per_class=2, embedding_dim=16))
    cpu = torch.device("cpu")

    def run(**kwargs):
        history, bundles = {}, {}

        def on_epoch(epoch, metrics, state):
            history[epoch] = dict(metrics)
            bundles[epoch] = copy.deepcopy(state.bundle())

        final = fit(config, on_epoch, mode="study", device=cpu, **kwargs)
        return final, history, bundles

    first, hist_a, bundles = run()  # loads the synthetic data itself
    splits = load_dataset("synthetic", None, 0)
    second, hist_b, _ = run(splits=splits)
    assert sorted(hist_a) == [1, 2]
    for epoch in (1, 2):
        assert hist_a[epoch]["train_loss"] == hist_b[epoch]["train_loss"]
        assert math.isfinite(hist_a[epoch]["train_loss"])
    val_keys = [k for k in hist_a[2] if k.startswith("val_")]
    assert "val_recall_at_1" in val_keys
    assert {k: hist_a[2][k] for k in val_keys} == {k: hist_b[2][k] for k in val_keys}
    assert first.metrics["train_loss"] == second.metrics["train_loss"]
    # the engine applies the schedule of each (0-based) epoch to the loss and the optimizer
    for epoch in (1, 2):
        assert hist_a[epoch]["alpha_now"] == pytest.approx(schedule.alpha_at(config, epoch - 1))
        assert hist_a[epoch]["lr_now"] == pytest.approx(config.lr * schedule.lr_factor_at(config, epoch - 1))
    assert hist_a[1]["alpha_now"] == pytest.approx(16.0)

    assert bundles[1]["epoch"] == 1
    resumed, hist_r, _ = run(splits=splits, resume=bundles[1])
    assert sorted(hist_r) == [2]  # only the remaining epoch is trained
    assert hist_r[2]["train_loss"] == pytest.approx(hist_a[2]["train_loss"], abs=1e-6)
    for key in val_keys:
        assert hist_r[2][key] == pytest.approx(hist_a[2][key], abs=1e-6), key
    assert resumed.epoch == 2


def test_a_study_run_validates_on_held_out_alphabets_with_val_split_alphabets(tmp_path, one_thread):
    from tests.test_data import make_omniglot
    from trainables.core.data import DatasetError
    from trainables.core.engine import build_run

    make_omniglot(tmp_path)  # Greek, Latin, Balinese: 2 characters each
    values = dict(dataset="omniglot", val_split="alphabets", classes_per_batch=2, samples_per_class=2, embedding_dim=8)
    run = build_run(TrainConfig.from_dict(values), data_root=str(tmp_path), device=torch.device("cpu"))
    alphabet = {c: run.eval_set.names[c].split("/")[0] for c in run.eval_set.names}
    val = {alphabet[int(c)] for c in run.eval_set.classes}
    fit = {alphabet[int(c)] for c in run.train_set.classes}
    assert len(val) == 1 and len(run.eval_set.classes) == 2  # the alphabet nearest 0.2 x 6 classes
    assert fit == {"Greek", "Latin", "Balinese"} - val
    with pytest.raises(DatasetError, match="dataset 'synthetic'.*val_split=alphabets"):
        build_run(TrainConfig.from_dict({**values, "dataset": "synthetic"}), device=torch.device("cpu"))


def photo_metrics(data_root, monkeypatch, cached: bool, seed: int, augment: float) -> dict[str, float]:
    from trainables.core.engine import fit

    monkeypatch.setenv("DML_CACHE_MAX_GB", "1" if cached else "0")  # 0: no cache, the PIL path streams every image
    values = dict(dataset="sop", image_size=32, epochs=2, classes_per_batch=8, samples_per_class=2, embedding_dim=16, seed=seed)
    run = fit(TrainConfig.from_dict({**values, "augment": augment}), data_root=str(data_root), device=torch.device("cpu"))
    return {k: run.metrics[k] for k in ("train_loss", "val_recall_at_1", "val_map_at_r", "val_nmi")}


@pytest.mark.slow
@pytest.mark.parametrize("augment", [0.0, 1.0])
def test_a_trial_trains_to_the_same_metrics_through_the_decoded_cache(tmp_path_factory, monkeypatch, one_thread, augment):
    """An SOP-shaped photo set (tests/photo_data.py: 740 images of 40 to 250 px), small_cnn at 32 px, 2 epochs, seeds
    0, 1, 2 through each path: the means of each metric over the seeds differ by no more than the larger of the
    two paths' spreads over the seeds (NMI's k-means on 14 validation classes is itself seed-dependent).
    Without augmentation both paths train on the same crops up to resampling (squashed to 37 px and cropped,
    against cropped once: about 6 grey levels apart at this size, 1 at 224 px; tests/test_cache.py)."""
    from tests.photo_data import make_sop

    root = tmp_path_factory.mktemp("sop")
    make_sop(root, scale=0.006, size_scale=0.2)
    monkeypatch.delenv("DML_CACHE_DIR", raising=False)
    runs = {path: [photo_metrics(root, monkeypatch, path, seed, augment) for seed in (0, 1, 2)] for path in (False, True)}
    assert (root / ".dml_cache").is_dir()
    for key in runs[False][0]:
        streamed, through_cache = ([m[key] for m in runs[path]] for path in (False, True))
        spread = max(max(streamed) - min(streamed), max(through_cache) - min(through_cache))
        assert abs(np.mean(through_cache) - np.mean(streamed)) <= max(spread, 0.02), (key, streamed, through_cache)


def test_loader_workers_follow_the_trials_cpus_on_cuda_only(one_thread):
    from types import SimpleNamespace

    from trainables.core.engine import loader_workers, trial_cpus

    photos, characters = SimpleNamespace(kind="photos"), SimpleNamespace(kind="characters")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [loader_workers(None, photos, cuda, cpus) for cpus in (1, 2, 4, 8)] == [1, 1, 3, 7]
    assert [loader_workers(None, images, cpu, 8) for images in (photos, characters)] == [0, 0]
    assert loader_workers(None, characters, cuda, 8) == 0
    assert [loader_workers(n, photos, device, 8) for n in (0, 5) for device in (cpu, cuda)] == [0, 0, 5, 5]  # asked for
    assert trial_cpus() == 1  # torch's threads, which the trainable sets to the trial's CPUs
    torch.set_num_threads(2)
    assert trial_cpus() == 2


def child_pids() -> set[int]:
    """The live processes whose parent is this one (from /proc: field 4 of each stat, after the command's parentheses)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                children.add(int(stat.parent.name))
    return children


def test_a_runs_evaluation_loaders_keep_their_workers_and_embed_as_a_fresh_loader(tmp_path, monkeypatch, one_thread):
    """A trial evaluates after every epoch: its kept loader's worker processes are the same ones at the second
    evaluation (not forked again), at most one per batch, and the embeddings equal those of a loader made for the
    call alone, in the training process."""
    from tests.photo_data import make_sop
    from trainables.core.cache import attach_cache
    from trainables.core.data import load_dataset
    from trainables.core.engine import EvalLoaders, embed
    from trainables.core.models import EmbeddingNet

    monkeypatch.delenv("DML_CACHE_DIR", raising=False)
    make_sop(tmp_path, scale=0.0004, size_scale=0.15)
    splits = load_dataset("sop", tmp_path, 32)
    assert attach_cache(splits, 32, tmp_path)
    images, cpu = splits.train, torch.device("cpu")
    model = EmbeddingNet("small_cnn", 8, "l2", image_size=32).eval()
    loaders = EvalLoaders(32, cpu, num_workers=4, batch_size=8)
    before = child_pids()
    first = embed(model, images, 32, cpu, loaders=loaders)
    workers = child_pids() - before
    second = embed(model, images, 32, cpu, loaders=loaders)
    assert len(workers) == min(4, math.ceil(len(images) / 8)) > 1
    assert workers <= child_pids(), "the kept loader's workers ended between two evaluations"
    assert loaders(images) is loaders(images)
    few = images.with_classes(images.classes[:1])
    assert len(few) <= 8 and loaders(few).num_workers == 1  # one batch: one worker
    # the same batches read in this process by a loader made for the call (a batch of another size may round
    # differently: oneDNN's kernels on some CPUs, e.g. AVX-512 Xeons, depend on the batch size)
    fresh = embed(model, images, 32, cpu, loaders=EvalLoaders(32, cpu, num_workers=0, batch_size=8))
    torch.testing.assert_close(first, fresh, rtol=0, atol=0)
    torch.testing.assert_close(second, fresh, rtol=0, atol=0)


def test_an_ensemble_sets_its_members_unit_embeddings_side_by_side_so_its_cosine_is_their_mean():
    """Two members by hand: A's rows are unit already, B's are (3, 4) and (0, 2), unit (0.6, 0.8) and (0, 1). The pair's
    cosine is 0 under A and 0.8 under B; the ensemble's is their mean, 0.4, and its rows are unit length."""
    from trainables.core.engine import Embeddings, concatenated

    a = Embeddings(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    b = Embeddings(torch.tensor([[3.0, 4.0], [0.0, 2.0]]), gallery=torch.tensor([[0.0, 5.0]]))
    joint = concatenated([a, Embeddings(b.queries)])
    expected = torch.tensor([[1.0, 0.0, 0.6, 0.8], [0.0, 1.0, 0.0, 1.0]]) / 2**0.5
    torch.testing.assert_close(joint.queries, expected)
    assert joint.gallery is None
    assert float(joint.queries[0] @ joint.queries[1]) == pytest.approx(0.4)
    torch.testing.assert_close(joint.queries.norm(dim=1), torch.ones(2))
    with_gallery = concatenated([Embeddings(a.queries, torch.tensor([[2.0, 0.0]])), b])
    torch.testing.assert_close(with_gallery.gallery, torch.tensor([[1.0, 0.0, 0.0, 1.0]]) / 2**0.5)

"""Tests of trainables.core.sampler.ClassBatchSampler: batch composition, determinism, resumption.

Every batch must hold C distinct classes with k indices each, grouped class by class
(004_44fc264e74e143df, sec. 4: batch content C x k); checked against the labels directly.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainables.core.sampler import ClassBatchSampler

# 10 classes of uneven sizes; class 7 has a single image, class 8 two (< k = 3)
SIZES = [6, 5, 9, 3, 4, 12, 7, 1, 2, 8]


def make_labels(seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.arange(len(SIZES)), SIZES)
    labels = labels * 10 + 3  # class ids need not be 0..M-1
    return np.random.default_rng(seed).permutation(labels)


def check_batch(batch, labels, C, k):
    assert len(batch) == C * k
    groups = [batch[g * k : (g + 1) * k] for g in range(C)]
    seen = []
    for group in groups:
        classes = {int(labels[i]) for i in group}
        assert len(classes) == 1, f"group {group} mixes classes {classes}"
        (cls,) = classes
        seen.append(cls)
        members = np.flatnonzero(labels == cls)
        assert all(0 <= i < len(labels) for i in group)
        if len(members) >= k:
            assert len(set(group)) == k, f"class {cls} has {len(members)} >= k images but group {group} repeats"
        else:
            # drawn with replacement: repeats are unavoidable; every index still a member
            assert set(group) <= set(members.tolist())
            assert len(set(group)) <= len(members)
    assert len(set(seen)) == C, f"batch classes {seen} are not distinct"


@pytest.mark.parametrize("C, k", [(4, 3), (10, 2), (2, 5), (3, 1)])
def test_batch_composition(C, k):
    labels = make_labels()
    sampler = ClassBatchSampler(labels, C, k, seed=1)
    assert len(sampler) == max(1, len(labels) // (C * k))
    for epoch in range(4):
        batches = list(sampler)
        assert len(batches) == len(sampler)
        for batch in batches:
            check_batch(batch, labels, C, k)
        assert sampler.epoch == epoch + 1  # advances after a full pass


def test_small_classes_drawn_with_replacement():
    labels = make_labels()
    sampler = ClassBatchSampler(labels, 10, 3, seed=2, batches_per_epoch=5)  # every class in every batch
    singleton = int(np.flatnonzero(labels == 73)[0])
    for batch in sampler:
        groups = [batch[g * 3 : (g + 1) * 3] for g in range(10)]
        by_class = {int(labels[g[0]]): g for g in groups}
        assert by_class[73] == [singleton] * 3
        assert set(by_class[83]) <= set(np.flatnonzero(labels == 83).tolist())


def test_explicit_batches_per_epoch():
    labels = make_labels()
    sampler = ClassBatchSampler(labels, 3, 2, seed=0, batches_per_epoch=17)
    assert len(sampler) == 17 and len(list(sampler)) == 17


def test_same_seed_same_batches_different_seed_different():
    labels = make_labels()
    a = ClassBatchSampler(labels, 4, 3, seed=5)
    b = ClassBatchSampler(labels, 4, 3, seed=5)
    c = ClassBatchSampler(labels, 4, 3, seed=6)
    epochs_a = [list(a) for _ in range(3)]
    epochs_b = [list(b) for _ in range(3)]
    epochs_c = [list(c) for _ in range(3)]
    assert epochs_a == epochs_b
    assert epochs_a != epochs_c
    assert epochs_a[0] != epochs_a[1]  # epochs differ from each other


def test_resume_mid_epoch():
    labels = make_labels()
    reference = ClassBatchSampler(labels, 4, 2, seed=9)
    ref_epoch0, ref_epoch1 = list(reference), list(reference)
    assert len(ref_epoch0) > 3

    interrupted = ClassBatchSampler(labels, 4, 2, seed=9)
    iterator = iter(interrupted)
    first = [next(iterator) for _ in range(3)]
    assert first == ref_epoch0[:3]
    state = interrupted.state_dict()
    assert state == {"seed": 9, "epoch": 0, "position": 3}

    resumed = ClassBatchSampler(labels, 4, 2, seed=123)  # the state carries the seed
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # what the engine does before each epoch: must not rewind
    assert list(resumed) == ref_epoch0[3:]
    assert list(resumed) == ref_epoch1


def test_resume_at_epoch_boundary_with_set_epoch():
    labels = make_labels()
    reference = ClassBatchSampler(labels, 4, 2, seed=4)
    ref = [list(reference) for _ in range(3)]
    resumed = ClassBatchSampler(labels, 4, 2, seed=4)
    resumed.load_state_dict({"seed": 4, "epoch": 2, "position": 0})
    assert list(resumed) == ref[2]
    jumped = ClassBatchSampler(labels, 4, 2, seed=4)
    jumped.set_epoch(1)
    assert list(jumped) == ref[1]


def test_too_many_classes_per_batch_raises():
    labels = make_labels()
    with pytest.raises(ValueError, match="classes_per_batch"):
        ClassBatchSampler(labels, len(SIZES) + 1, 2)

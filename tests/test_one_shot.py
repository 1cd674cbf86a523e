"""N-way one-shot error (trainables/core/metrics.one_shot_error) against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainables.core.data import ImageSet, alphabets
from trainables.core.metrics import one_shot_error


def separated(n_classes: int, per_class: int = 3, dim: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Each class on its own axis (one-hot), with a small same-class jitter: nearest support is always right."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(n_classes), per_class)
    x = np.eye(dim)[labels] + 0.01 * rng.standard_normal((len(labels), dim))
    return x.astype(np.float32), labels


def test_perfectly_separated_classes_have_no_error():
    x, y = separated(25)
    assert one_shot_error(x, y, ways=20, episodes=50) == 0.0
    assert one_shot_error(torch.from_numpy(x), torch.from_numpy(y), ways=5, episodes=10) == 0.0


def test_identical_embeddings_pick_the_first_support():
    # every similarity ties, argmax takes support 0: only the query of the first drawn class is right
    y = np.repeat(np.arange(30), 2)
    x = np.ones((60, 8), np.float32)
    assert one_shot_error(x, y, ways=20, episodes=7) == pytest.approx(19 / 20)
    assert one_shot_error(x, y, ways=4, episodes=7) == pytest.approx(3 / 4)


def test_episodes_stay_within_a_group_and_skip_small_groups():
    xs, ys = separated(6)  # classes 0-5: separated
    same = np.ones((3 * 4, 64), np.float32)  # classes 10-13: indistinguishable
    x = np.concatenate([xs, same])
    y = np.concatenate([ys, np.repeat(np.arange(10, 14), 3)])
    groups = {**{c: "good" for c in range(6)}, **{c: "bad" for c in range(10, 14)}}
    assert one_shot_error(x, y, groups, ways=5, episodes=40) == 0.0  # "bad" has 4 < 5 classes: never drawn
    assert one_shot_error(x, y, {c: "one" for c in groups}, ways=10, episodes=40) > 0.0  # mixed episodes err
    # ways = 4: both groups drawn; a "bad" episode errs on 3 of 4 queries, a "good" one on none
    error = one_shot_error(x, y, groups, ways=4, episodes=400, seed=3)
    assert 0.3 < error < 0.45  # about half the episodes x 3/4


def test_classes_with_one_image_are_never_drawn_and_too_few_classes_fail():
    x, y = separated(5, per_class=2)
    x1 = np.concatenate([x, np.ones((1, 64), np.float32)])
    y1 = np.concatenate([y, [99]])  # a singleton class
    assert one_shot_error(x1, y1, ways=5, episodes=20) == 0.0
    with pytest.raises(ValueError, match="no group has 6 classes"):
        one_shot_error(x, y, ways=6)


def test_alphabets_come_from_omniglot_class_names():
    images = ImageSet(
        labels=np.array([0, 1, 2]),
        kind="characters",
        arrays=np.zeros((3, 8, 8), np.uint8),
        names={0: "Tagalog/character01", 1: "Tagalog/character02", 2: "Sanskrit/character01"},
    )
    assert alphabets(images) == {0: "Tagalog", 1: "Tagalog", 2: "Sanskrit"}
    images.names = {0: "a", 1: "b", 2: "c"}
    assert alphabets(images) is None

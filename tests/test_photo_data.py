"""Tests of tests/photo_data.py: small versions of the CUB-, Cars196-, SOP- and In-shop-shaped datasets are read by
``trainables.core.data`` in their standard layouts, with class-disjoint splits and JPEG photos."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.photo_data import MAKERS, SIZES, class_counts
from trainables.core.data import load_dataset


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_small_versions_load_in_the_standard_layouts(tmp_path, name):
    MAKERS[name](tmp_path, scale=0.004, size_scale=0.1)
    splits = load_dataset(name, tmp_path)
    assert np.intersect1d(splits.train.classes, splits.test.classes).size == 0
    assert len(splits.train.classes) >= 2 and len(splits.test.classes) >= 2
    first_test = {"cub200": 101, "cars196": 99}.get(name)
    if first_test:  # the loaders split CUB and Cars by class id
        assert splits.train.classes.max() < first_test <= splits.test.classes.min()
    if name == "inshop":  # the test classes are split into queries and a gallery: every item in both
        assert np.array_equal(splits.test.classes, splits.gallery.classes)
        assert set(splits.gallery.paths).isdisjoint(splits.test.paths)
    for images in (splits.train, splits.test) if name != "inshop" else (splits.train,):
        counts = np.unique(images.labels, return_counts=True)[1]
        assert counts.min() >= 2
        with Image.open(images.paths[0]) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
        assert images.load(len(images) - 1).ndim == 3


def test_class_counts_sum_and_bounds():
    counts = class_counts(np.random.default_rng(0), 59_551, 11_318, 2, 12)
    assert counts.sum() == 59_551 and counts.min() >= 2 and counts.max() <= 12
    with pytest.raises(ValueError, match="do not fit"):
        class_counts(np.random.default_rng(0), 100, 5, 2, 12)


def test_size_models_keep_the_long_side_in_range():
    sizes = SIZES["cars196"].draw(np.random.default_rng(0), 2000)
    assert sizes.max() <= 2500 and sizes.min() >= 8
    assert (sizes[:, 0] > sizes[:, 1]).mean() > 0.9  # Cars196: wide photos
    assert (SIZES["inshop"].draw(np.random.default_rng(0), 50) == 256).all()  # In-shop's img/: 256 x 256

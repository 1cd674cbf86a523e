"""The decoded cache proves its content before it is read: a checksum of each chunk of pixels and of the shapes file,
written at build into the manifest and checked when a process opens the cache; a mismatch rebuilds and says so.

Before: a cache whose pixels were overwritten with other bytes of the same length was read as it was (a final trained
on it exited 0 and its test R@1 fell from 0.98 to 0.14)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from tests.test_cache import SIZE, cache_files, decodes, every_path, sop  # noqa: F401  (fixtures)
from trainables.core import cache
from trainables.core.data import load_dataset


@pytest.mark.parametrize("spoil", ["pixels", "shapes", "manifest digests"])
def test_a_cache_whose_bytes_changed_at_the_same_length_is_rebuilt(sop, decodes, caplog, spoil):  # noqa: F811
    splits = load_dataset("sop", sop)
    assert cache.attach_cache(splits, SIZE, sop)
    expected = np.array(splits.train.decoded.pixels[splits.train.decoded.rows])
    (pixels,), (shapes,), (manifest,) = cache_files(sop, ".pixels"), cache_files(sop, ".shapes.npy"), cache_files(sop, ".json")
    if spoil == "pixels":  # other bytes of the same length, in the last chunk
        raw = bytearray(pixels.read_bytes())
        raw[-100:] = bytes(255 - b for b in raw[-100:])
        pixels.write_bytes(bytes(raw))
    elif spoil == "shapes":
        raw = bytearray(shapes.read_bytes())
        raw[-8:] = bytes(8 * [7])
        shapes.write_bytes(bytes(raw))
    else:
        meta = json.loads(manifest.read_text())
        meta["digests"][0] = "0" * len(meta["digests"][0])
        manifest.write_text(json.dumps(meta))
    cache._verified.clear()  # as a new process
    decodes.clear()
    again = load_dataset("sop", sop)
    with caplog.at_level(logging.WARNING, logger="trainables.core.cache"):
        assert cache.attach_cache(again, SIZE, sop)
    assert "do not match their checksums" in caplog.text and "rebuilding" in caplog.text
    assert len(decodes) == len(every_path(splits))
    np.testing.assert_array_equal(again.train.decoded.pixels[again.train.decoded.rows], expected)


def test_a_whole_cache_is_checked_once_per_process_and_read_without_decoding(sop, decodes):  # noqa: F811
    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    cache._verified.clear()
    decodes.clear()
    checked = []
    real = cache._digest
    cache_digest = lambda view: checked.append(len(view)) or real(view)  # noqa: E731
    try:
        cache._digest = cache_digest
        for _ in range(2):
            assert cache.attach_cache(load_dataset("sop", sop), SIZE, sop)
    finally:
        cache._digest = real
    assert decodes == [] and sum(checked) > 0
    (manifest,) = cache_files(sop, ".json")
    chunks = len(json.loads(manifest.read_text())["digests"])
    assert len(checked) == chunks + 1  # each chunk and the shapes once, in the first open only

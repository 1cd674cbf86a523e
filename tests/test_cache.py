"""Tests of trainables.core.cache and the batch-wise crops of trainables.core.transforms.

The decoded cache is built from small SOP-shaped datasets that tests/photo_data.py writes into tmp_path.
Decodes are counted by wrapping ``data.decode_sized`` (the one function the cache decodes with), in this
process or, for other processes, by a wrapper that appends a line per decode to a file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import RandomResizedCrop, v2

from tests.conftest import wait_for
from tests.photo_data import make_sop
from trainables.core import cache, data
from trainables.core.data import DatasetError, load_dataset, source_size
from trainables.core.transforms import (
    CachedImages,
    TorchImages,
    center_crop_boxes,
    crop_resize,
    eval_transform,
    keep_batch,
    normalize_batch,
    random_crop_boxes,
)

ROOT = Path(__file__).resolve().parents[1]
SIZE = 32  # crop size of the tests: the cache holds source_size(32) = 37 px squares


@pytest.fixture
def sop(tmp_path, monkeypatch):
    """A small SOP-shaped data root (about 50 images of 40 to 130 px), the cache under it."""
    monkeypatch.delenv(cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv(cache.CACHE_MAX_GB_ENV, raising=False)
    make_sop(tmp_path, scale=0.0004, size_scale=0.15)
    return tmp_path


@pytest.fixture
def decodes(monkeypatch):
    """Paths decoded in this process, in order."""
    seen: list[str] = []
    real = data.decode_sized

    def counting(source, where, mode, size=None):
        seen.append(where)
        return real(source, where, mode, size)

    monkeypatch.setattr(data, "decode_sized", counting)
    return seen


def every_path(splits) -> list[str]:
    return [*splits.train.paths, *splits.test.paths]


def cache_files(root: Path, suffix: str) -> list[Path]:
    return sorted((root / ".dml_cache").glob(f"*{suffix}"))


# a second process: attach the cache of the SOP set under argv[1] at SIZE, appending each decode to argv[2]
OTHER_PROCESS = textwrap.dedent(
    """
    import sys, threading
    from trainables.core import cache, data
    real, decoded = data.decode_sized, []
    def counting(source, where, mode, size=None):
        with open(sys.argv[2], "a") as log:
            log.write(where + "\\n")
        decoded.append(where)
        if len(decoded) == int(sys.argv[3]):  # midway (0: never): held here until the test kills it
            threading.Event().wait()
        return real(source, where, mode, size)
    data.decode_sized = counting
    splits = data.load_dataset("sop", sys.argv[1])
    assert cache.attach_cache(splits, int(sys.argv[4]), sys.argv[1])
    print(int(splits.train.decoded.pixels[splits.train.decoded.rows].sum()))
    """
)


def other_process(root: Path, log: Path, stop_after: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(cache.CACHE_DIR_ENV, None)
    command = [sys.executable, "-c", OTHER_PROCESS, str(root), str(log), str(stop_after), str(SIZE)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# -- one decode per node per size ------------------------------------------------------------------------------------


def test_each_image_is_decoded_once_per_size(sop, decodes):
    splits = load_dataset("sop", sop)
    assert cache.attach_cache(splits, SIZE, sop)
    assert sorted(decodes) == sorted(every_path(splits))  # every image once, train and test together
    decoded = splits.train.decoded
    assert decoded.pixels.shape == (len(every_path(splits)), source_size(SIZE), source_size(SIZE), 3)
    assert isinstance(decoded.pixels, np.memmap) and not decoded.pixels.flags.writeable
    for images in (splits.train, splits.test):  # each set's rows hold its own images, in order
        for i in (0, len(images) - 1):
            expected, shape = data.decode_sized(images.paths[i], "", "RGB", source_size(SIZE))
            np.testing.assert_array_equal(images.decoded.pixels[images.decoded.rows[i]], expected)
            assert tuple(images.decoded.shapes[images.decoded.rows[i]]) == shape
    decodes.clear()
    again = load_dataset("sop", sop)  # a later trial or epoch of this node
    assert cache.attach_cache(again, SIZE, sop) and decodes == []
    subset = again.train.with_classes(again.train.classes[:2])  # the engine's fit classes keep their rows
    np.testing.assert_array_equal(subset.decoded.pixels[subset.decoded.rows], splits.train.decoded.pixels[subset.decoded.rows])
    assert cache.attach_cache(again, 48, sop)  # another size is another cache
    assert len(decodes) == len(every_path(splits)) and len(cache_files(sop, ".json")) == 2


def test_another_process_reads_the_cache_without_decoding(sop, decodes, tmp_path_factory):
    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    log = tmp_path_factory.mktemp("log") / "decodes.txt"
    process = other_process(sop, log)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert lines(log) == []
    assert int(out) == int(splits.train.decoded.pixels[splits.train.decoded.rows].sum())


def test_concurrent_processes_build_once(sop, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "decodes.txt"
    processes = [other_process(sop, log) for _ in range(3)]
    results = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err for _, err in results]
    paths = every_path(load_dataset("sop", sop))
    assert sorted(lines(log)) == sorted(paths)  # one builder decoded each image once; the others waited and read
    assert len({out for out, _ in results}) == 1


# -- torn caches and changed data ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tear", ["truncated pixels", "no manifest", "truncated shapes"])
def test_a_torn_cache_is_rebuilt_never_read(sop, decodes, caplog, tear):
    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    expected = np.array(splits.train.decoded.pixels[splits.train.decoded.rows])
    (pixels,), (manifest,), (shapes,) = cache_files(sop, ".pixels"), cache_files(sop, ".json"), cache_files(sop, ".shapes.npy")
    if tear == "truncated pixels":
        os.truncate(pixels, pixels.stat().st_size // 2)
    elif tear == "no manifest":
        manifest.unlink()
    else:
        os.truncate(shapes, 64)
    decodes.clear()
    again = load_dataset("sop", sop)
    with caplog.at_level(logging.WARNING, logger="trainables.core.cache"):
        assert cache.attach_cache(again, SIZE, sop)
    assert "rebuilding" in caplog.text
    assert len(decodes) == len(every_path(splits))
    np.testing.assert_array_equal(again.train.decoded.pixels[again.train.decoded.rows], expected)


@pytest.mark.faults
def test_a_build_killed_midway_leaves_no_readable_cache_and_is_rebuilt(sop, decodes, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "decodes.txt"
    process = other_process(sop, log, stop_after=3)
    wait_for(lambda: len(lines(log)) >= 3, 120, "the builder's third decode", process)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert cache_files(sop, ".json") == [] and cache_files(sop, ".pixels") == []  # only the temporary file
    assert len(cache_files(sop, ".tmp*")) == 1
    splits = load_dataset("sop", sop)
    assert cache.attach_cache(splits, SIZE, sop)  # the killed builder's lock went with it
    assert len(decodes) == len(every_path(splits))
    assert cache_files(sop, ".tmp*") == []  # the next builder removed the killed one's temporary file


def test_a_changed_dataset_gets_a_new_key(sop, decodes):
    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    first = cache_files(sop, ".json")
    changed = Path(splits.test.paths[0])
    Image.new("RGB", (50, 40), (200, 10, 10)).save(changed, "JPEG")
    decodes.clear()
    again = load_dataset("sop", sop)
    cache.attach_cache(again, SIZE, sop)
    assert len(decodes) == len(every_path(splits)) and len(cache_files(sop, ".json")) == 2 and first[0] in cache_files(sop, ".json")
    red = again.test.decoded.pixels[again.test.decoded.rows[0]]
    assert red[..., 0].mean() > 150 and red[..., 1].mean() < 60


# -- bad data keeps its one-line errors -------------------------------------------------------------------------------


def truncated_jpeg(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [
        (truncated_jpeg, "unreadable image (OSError"),
        (lambda path: path.write_bytes(b""), "unreadable image (UnidentifiedImageError"),
        (lambda path: Image.new("RGB", (200, 200)).save(path, "JPEG"), "unreadable image (DecompressionBomb"),
    ],
    ids=["truncated JPEG", "zero-byte file", "decompression bomb"],
)
def test_bad_images_keep_their_one_line_errors_when_the_cache_is_built(sop, monkeypatch, spoil, needle):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # 200 x 200 is 4x the limit: refused; the others are below
    splits = load_dataset("sop", sop)
    bad = Path(splits.train.paths[3])
    spoil(bad)
    with pytest.raises(DatasetError) as error:
        cache.attach_cache(splits, SIZE, sop)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{bad}: ") and needle in message, message
    assert cache_files(sop, ".json") == [] and cache_files(sop, ".pixels") == [] and cache_files(sop, ".tmp*") == []


def test_decoding_in_worker_processes_gives_the_same_cache_and_errors(sop, monkeypatch):
    monkeypatch.setattr(cache, "CHUNK", 16)
    splits = load_dataset("sop", sop)
    serial = data.load_dataset("sop", sop)
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(sop / "serial"))
    cache.attach_cache(serial, SIZE, sop)
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(sop / "parallel"))
    cache.attach_cache(splits, SIZE, sop, workers=2)
    np.testing.assert_array_equal(np.asarray(splits.train.decoded.pixels), np.asarray(serial.train.decoded.pixels))
    np.testing.assert_array_equal(splits.train.decoded.shapes, serial.train.decoded.shapes)
    truncated_jpeg(Path(splits.test.paths[-1]))
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(sop / "broken"))
    with pytest.raises(DatasetError, match=f"{splits.test.paths[-1]}: unreadable image"):
        cache.attach_cache(load_dataset("sop", sop), SIZE, sop, workers=2)


# -- where the cache goes, and when it streams instead ---------------------------------------------------------------


def test_the_cache_folder_and_the_budget(sop, monkeypatch, decodes, caplog):
    assert cache.cache_folder(sop) == sop / ".dml_cache"
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, "0")
    splits = load_dataset("sop", sop)
    assert not cache.attach_cache(splits, SIZE, sop) and splits.train.decoded is None and decodes == []
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, "0.000001")  # 1 kB: the set does not fit, so it streams
    with caplog.at_level(logging.INFO, logger="trainables.core.cache"):
        assert not cache.attach_cache(splits, SIZE, sop)
    assert "streaming from files" in caplog.text and decodes == []
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, "lots")
    with pytest.raises(DatasetError, match="DML_CACHE_MAX_GB='lots': expected a number"):
        cache.attach_cache(splits, SIZE, sop)
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, "1")
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(sop / "elsewhere"))
    assert cache.attach_cache(splits, SIZE, sop) and len(list((sop / "elsewhere").glob("*.json"))) == 1
    characters = load_dataset("synthetic", None)
    assert not cache.attach_cache(characters, SIZE, None) and characters.train.decoded is None


# -- batch-wise crops ------------------------------------------------------------------------------------------------


def test_random_crop_boxes_follow_torchvision_random_resized_crop():
    shapes = torch.tensor([[300, 400]] * 4000 + [[100, 400]] * 4000)  # landscape, and too wide for most draws
    torch.manual_seed(0)
    boxes = random_crop_boxes(shapes, 1.0)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= shapes[:, 1]).all() and (boxes[:, 3] <= shapes[:, 0]).all()
    for part in (slice(0, 4000), slice(4000, None)):
        height, width = shapes[part][0].tolist()
        ours = (w[part] * h[part] / (height * width)).numpy()
        torch.manual_seed(1)
        image = torch.zeros(3, height, width)
        crops = [RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)]
        theirs = np.array([hh * ww / (height * width) for _, _, hh, ww in crops])
        assert abs(ours.mean() - theirs.mean()) < 0.02 and abs(np.median(ours) - np.median(theirs)) < 0.03
    less = random_crop_boxes(shapes[:4000], 0.25)  # augment 0.25: at least 77 % of the area unless the fallback
    assert ((less[:, 2] - less[:, 0]) * (less[:, 3] - less[:, 1]) / (300 * 400)).min() >= 0.77 - 0.01


def test_crop_resize_crops_flips_and_matches_the_eval_path():
    rng = np.random.default_rng(0)
    original = rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)
    squashed = np.asarray(Image.fromarray(original).resize((90, 90), Image.Resampling.BILINEAR)).copy()  # rows 60 -> 90
    pixels, shapes, no = torch.from_numpy(squashed[None]), torch.tensor([[60, 90]]), torch.tensor([False])
    whole = crop_resize(pixels, shapes, torch.tensor([[0.0, 0.0, 90.0, 60.0]]), no, 90)
    assert whole.dtype == torch.uint8 and whole.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(whole[0].permute(1, 2, 0), torch.from_numpy(squashed), atol=0, rtol=0)
    flipped = crop_resize(pixels, shapes, torch.tensor([[0.0, 0.0, 90.0, 60.0]]), torch.tensor([True]), 90)
    torch.testing.assert_close(flipped, whole.flip(-1), atol=0, rtol=0)
    boxes, flips = torch.tensor([[0.0, 0.0, 90.0, 60.0]] * 4), torch.tensor([True, False, False, True])
    four = crop_resize(pixels.repeat(4, 1, 1, 1), shapes.repeat(4, 1), boxes, flips, 90)
    torch.testing.assert_close(four, torch.cat([flipped, whole, whole, flipped]), atol=0, rtol=0)  # each image its own flip
    # the left half of the original (45 x 60 px) is the stored 45 x 90 px, resized as torchvision resizes a crop
    left = crop_resize(pixels, shapes, torch.tensor([[0.0, 0.0, 45.0, 60.0]]), no, 45)
    by_torchvision = v2.functional.resized_crop(pixels.permute(0, 3, 1, 2), 0, 0, 90, 45, [45, 45], antialias=True)
    torch.testing.assert_close(left, by_torchvision, atol=1, rtol=0)
    boxes = center_crop_boxes(torch.tensor([[300, 400], [500, 250]]), 224)
    by_hand = [[68.75, 18.75, 331.25, 281.25], [15.625, 140.625, 234.375, 359.375]]  # sides 300 and 250 x 224 / 256, centred
    torch.testing.assert_close(boxes, torch.tensor(by_hand, dtype=torch.float64))


def test_cached_evaluation_images_match_the_pil_path(tmp_path):
    make_sop(tmp_path, scale=0.0002)  # 24 photos at SOP's sizes (about 300 to 1,000 px), cropped to 224 as in the papers
    splits = load_dataset("sop", tmp_path)
    cache.attach_cache(splits, 224, tmp_path)
    cached, _ = CachedImages(splits.test, 224).__getitems__(list(range(len(splits.test))))
    assert cached.dtype == torch.uint8  # normalized on the device, after the copy
    cached = normalize_batch(cached, "photos")
    streamed = torch.stack([TorchImages(splits.test, eval_transform("photos", 224))[i][0] for i in range(len(splits.test))])
    assert cached.shape == streamed.shape == (len(splits.test), 3, 224, 224)
    # the same crop, resampled twice (squashed to 256 x 256, then cropped) against once: about 1 grey level apart
    assert (cached - streamed).abs().mean() < 0.03, (cached - streamed).abs().mean()
    assert abs(cached.mean() - streamed.mean()) < 0.005


def test_cached_training_crops_are_seeded_by_torch(sop):
    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    train = CachedImages(splits.train, SIZE, 1.0, {int(c): i for i, c in enumerate(splits.train.classes)})
    torch.manual_seed(0)
    a, labels = train.__getitems__([0, 1, 2])
    torch.manual_seed(0)
    b, _ = train.__getitems__([0, 1, 2])
    torch.testing.assert_close(a, b)  # seeded by torch's generator
    assert labels.dtype == torch.int64 and labels.max() < len(splits.train.classes)
    with pytest.raises(ValueError, match="decoded cache"):
        CachedImages(load_dataset("sop", sop).train, SIZE)


def test_manifest_names_count_size_and_bytes(sop):
    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    (manifest,) = cache_files(sop, ".json")
    meta = json.loads(manifest.read_text())
    size = source_size(SIZE)
    assert meta["count"] == len(every_path(splits)) and meta["size"] == size and meta["bytes"] == meta["count"] * size * size * 3


def test_a_spawned_loader_worker_maps_the_cache_file_instead_of_a_copy(sop):
    """A DataLoader worker started by spawn (forkserver, Python 3.14's default, pickles alike) reads the same file:
    the pickled cache is its file's name, not its pixels, and the worker's batches are the training process's."""
    import pickle

    splits = load_dataset("sop", sop)
    cache.attach_cache(splits, SIZE, sop)
    decoded = splits.test.decoded
    payload = pickle.dumps(decoded)
    assert len(payload) < 2048 + decoded.shapes.nbytes + decoded.rows.nbytes < decoded.pixels.nbytes
    again = pickle.loads(payload)
    assert isinstance(again.pixels, np.memmap) and again.pixels.filename == decoded.pixels.filename
    np.testing.assert_array_equal(again.pixels[again.rows], decoded.pixels[decoded.rows])
    dataset = CachedImages(splits.test, SIZE)  # evaluation crops: the same in any process
    here = dataset.__getitems__(list(range(4)))[0]
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=keep_batch, multiprocessing_context="spawn")
    there = next(iter(loader))[0]
    torch.testing.assert_close(there, here)


def test_the_drivers_photo_check_builds_the_cache_once_and_then_decodes_nothing(sop, decodes, monkeypatch):
    from study.checks import check_photos

    splits = load_dataset("sop", sop)
    assert check_photos(splits, "sop", SIZE, sop, workers=1)
    assert sorted(decodes) == sorted(every_path(splits))  # no cache yet: the check built it, each image once
    decodes.clear()
    assert check_photos(load_dataset("sop", sop), "sop", SIZE, sop) and decodes == []  # a cache present: read, not decoded
    trial = load_dataset("sop", sop)
    assert cache.attach_cache(trial, SIZE, sop) and decodes == []  # a trial on the node reads the check's build
    assert check_photos(load_dataset("synthetic", None), "synthetic", 0, sop) is False  # characters: checked when loaded
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, "0")
    assert check_photos(load_dataset("sop", sop), "sop", SIZE, sop) is False and decodes == []  # cache off: trials stream
    monkeypatch.delenv(cache.CACHE_MAX_GB_ENV)
    bad = Path(splits.train.paths[3])
    truncated_jpeg(bad)  # a changed file: a new key, a new build, which stops at it with its one line
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(bad))}: unreadable image \(OSError[^\n]*$"):
        check_photos(load_dataset("sop", sop), "sop", SIZE, sop, workers=1)


def test_a_uint8_batch_is_normalized_as_torchvision_normalizes_and_a_float_one_is_left_alone():
    from trainables.core.data import IMAGENET_MEAN, IMAGENET_STD

    images = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    expected = v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)(images.float() / 255)
    torch.testing.assert_close(normalize_batch(images, "photos"), expected, atol=1e-5, rtol=0)
    gray = torch.randint(0, 256, (2, 1, 5, 4), dtype=torch.uint8)
    torch.testing.assert_close(normalize_batch(gray, "characters"), gray.float() / 255 * 2 - 1, atol=1e-6, rtol=0)
    normalized = expected.clone()
    assert normalize_batch(normalized, "photos") is normalized

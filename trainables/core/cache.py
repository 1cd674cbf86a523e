"""The decoded cache of a node: a photo dataset decoded once, for every trial and epoch on the node.

The first process that needs a dataset's photos at a crop size S decodes every image once, squashes it to
R x R (R = ``data.source_size(S)``: 256 for 224) and writes them to one uint8 file, (M, R, R, 3), beside the
original (height, width) of each image, so that crops can still be drawn in the image's own proportions
(``transforms.CachedImages``). Every later trial and epoch reads the file through ``np.memmap``: the page cache
holds one copy per node, however many trials read it.

Files, in the cache folder (``$DML_CACHE_DIR``, else ``<data root>/.dml_cache``), named by the key, a hash of
the format, R and every image's path, size and mtime (a changed dataset gives a new key):

- ``KEY.pixels``: the raw (M, R, R, 3) array;
- ``KEY.shapes.npy``: (M, 2) original (height, width);
- ``KEY.json``: the manifest (count, size, bytes, the first path, build time), written last;
- ``KEY.lock``: the ``flock`` that one builder holds while the others wait (the kernel releases it when the
  builder dies, and the next builder removes the dead one's temporary files).

Each file is written under a temporary name, fsynced and renamed; the manifest comes last. A cache is read only
when its manifest names its count and size and the pixel file has exactly the bytes those give: a build killed
at any point (no manifest) or a file cut short afterwards is rebuilt, never read. Decoding keeps
``data.decode_image``'s one-line errors (a truncated JPEG, a decompression bomb, an empty file): the build stops
with the file's name.

The cache is skipped, and the images are streamed from their files by the PIL path as before, when it would
not fit: over ``$DML_CACHE_MAX_GB`` (0 turns the cache off) or over the folder's free space less 1 GiB, or when
the folder cannot be written; and when the disk fills during the build (its space is reserved before any pixel
is written, so this is an error, never a SIGBUS), which then removes its files and says so in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import math
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from . import data
from .data import DatasetSplits, Decoded, source_size

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "DML_CACHE_DIR"
CACHE_MAX_GB_ENV = "DML_CACHE_MAX_GB"
FORMAT = 2  # bump when the file layout or the decoding changes: old caches then have other keys (2: checksums)
FREE_MARGIN = 1 << 30  # bytes left free on the cache's disk
CHUNK = 256  # images per decoding task


def cache_folder(data_root: str | os.PathLike | None) -> Path | None:
    """``$DML_CACHE_DIR``, else ``.dml_cache`` under the data root (a hidden folder: no loader reads it as images)."""
    folder = os.environ.get(CACHE_DIR_ENV)
    if folder:
        return Path(folder).expanduser()
    root = data.resolve_data_root(data_root)
    return None if root is None else root / ".dml_cache"


def cache_key(paths: list[str], size: int) -> str:
    """A hash of the format, ``size`` and each path with its size and mtime: any changed, added or removed file changes it."""
    digest = hashlib.sha256(f"{FORMAT} {size} {len(paths)}\n".encode())
    for path in paths:
        try:
            stat = os.stat(path)
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        except OSError:  # a missing file fails with its own message when the build decodes it
            digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()[:24]


def _files(folder: Path, key: str) -> tuple[Path, Path, Path]:
    return folder / f"{key}.pixels", folder / f"{key}.shapes.npy", folder / f"{key}.json"


def _digest(view: memoryview | bytes) -> str:
    """A chunk's checksum: SHA-256, the fastest of hashlib's where CPUs hash it in hardware (docs/performance.md)."""
    return hashlib.sha256(view).hexdigest()[:32]


def _chunk_digests(pixels: np.ndarray) -> list[str]:
    """The checksum of each CHUNK rows of ``pixels`` (N, size, size, 3), as the build writes them."""
    return [_digest(memoryview(np.ascontiguousarray(pixels[start : start + CHUNK])).cast("B")) for start in range(0, len(pixels), CHUNK)]


_verified: set[tuple[str, str]] = set()  # (folder, key) of the caches this process has checked: once a process


def read_cache(folder: Path, key: str, count: int, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(pixels (count, size, size, 3) read-only memmap, shapes (count, 2)) of a complete cache, else None.

    Complete: the manifest exists and names ``count`` and ``size``, both files have exactly the bytes those give, and,
    the first time this process opens it, the shapes file and each chunk of pixels match the manifest's checksums (a
    file overwritten at the same length is rebuilt, never trained on).
    """
    pixels, shapes, manifest = _files(folder, key)
    nbytes = count * size * size * 3
    try:
        meta = json.loads(manifest.read_text())
        if meta.get("count") != count or meta.get("size") != size or pixels.stat().st_size != nbytes:
            raise ValueError(f"manifest {meta} against {pixels.stat().st_size} bytes of pixels")
        table = shapes.read_bytes()
        sizes = np.load(io.BytesIO(table))
        if sizes.shape != (count, 2):
            raise ValueError(f"shapes {sizes.shape}")
        images = np.memmap(pixels, np.uint8, "r", shape=(count, size, size, 3)) if count else np.empty((0, size, size, 3), np.uint8)
        if (str(folder), key) not in _verified:
            if _digest(table) != meta.get("shapes_digest") or _chunk_digests(images) != meta.get("digests"):
                log.warning("decoded cache %s: its files do not match their checksums (changed after the build); rebuilding", pixels)
                return None
            _verified.add((str(folder), key))
    except FileNotFoundError:
        if pixels.exists() or shapes.exists():
            log.warning("decoded cache %s: no manifest (a build was cut short); rebuilding", pixels)
        return None
    except (OSError, ValueError, EOFError) as torn:
        log.warning("decoded cache %s: torn (%s); rebuilding", pixels, torn)
        return None
    return images, sizes.astype(np.int64)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _publish(temporary: Path, path: Path) -> None:
    """fsync ``temporary`` and rename it onto ``path``: a reader sees the whole file or none."""
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _save(path: Path, payload: bytes) -> None:
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        temporary.write_bytes(payload)
        _publish(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _decode_chunk(job: tuple[str, int, int, list[str], int]) -> np.ndarray:
    """Decode ``paths`` into rows start.. of the (count, size, size, 3) pixel file ``target``; returns their shapes (n, 2)."""
    target, start, count, paths, size = job
    out = np.memmap(target, np.uint8, "r+", shape=(count, size, size, 3))
    shapes = np.empty((len(paths), 2), np.int64)
    for i, path in enumerate(paths):
        out[start + i], shapes[i] = data.decode_sized(path, path, "RGB", size)
    out.flush()
    del out
    return shapes


def _allocate(fd: int, nbytes: int) -> None:
    """Reserve ``nbytes`` of disk for the open file ``fd`` before the decoders write it through a memmap.

    A sparse file (a plain truncate) would take its blocks only as pages are written, and a page the full disk
    cannot back kills the writer with SIGBUS, with no message; reserved up front, a full disk is an OSError (ENOSPC)
    here instead. A filesystem that cannot reserve (EOPNOTSUPP, EINVAL) gets the sparse file.
    """
    if nbytes == 0:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, nbytes)


def build_cache(folder: Path, key: str, paths: list[str], size: int, workers: int = 1) -> None:
    """Decode ``paths`` at size x size into the cache ``key`` in ``folder`` (the caller holds its lock).

    A build that fails (a full disk, a bad image) leaves none of its files behind: no manifest, so nothing is read.
    """
    try:
        _build(folder, key, paths, size, workers)
    except BaseException:
        for path in _files(folder, key):
            path.unlink(missing_ok=True)
        raise


def _build(folder: Path, key: str, paths: list[str], size: int, workers: int) -> None:
    pixels, shapes, manifest = _files(folder, key)
    manifest.unlink(missing_ok=True)  # first: a reader never trusts the files below while they change
    for stale in folder.glob(f"{key}.*.tmp*"):  # a killed builder's (this process holds the key's lock)
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    nbytes = len(paths) * size * size * 3
    temporary = pixels.with_name(f"{pixels.name}.tmp{os.getpid()}")
    jobs = [(str(temporary), start, len(paths), paths[start : start + CHUNK], size) for start in range(0, len(paths), CHUNK)]
    try:
        with open(temporary, "wb") as handle:
            _allocate(handle.fileno(), nbytes)
        if workers > 1 and len(jobs) > 1:
            # spawned, not forked: a trial's process holds torch's threads, which a fork copies in an unknown state
            with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
                parts = list(pool.map(_decode_chunk, jobs))
        else:
            parts = [_decode_chunk(job) for job in jobs]
        _publish(temporary, pixels)
    finally:
        temporary.unlink(missing_ok=True)
    table = io.BytesIO()
    np.save(table, np.concatenate(parts) if parts else np.empty((0, 2), np.int64))
    _save(shapes, table.getvalue())
    built = np.memmap(pixels, np.uint8, "r", shape=(len(paths), size, size, 3)) if paths else np.empty((0, size, size, 3), np.uint8)
    digests = _chunk_digests(built)  # of the file as published: what a reader will check
    del built
    seconds = time.perf_counter() - started
    meta = {"format": FORMAT, "count": len(paths), "size": size, "bytes": nbytes, "first": paths[0] if paths else "", "seconds": seconds}
    meta |= {"chunk": CHUNK, "digests": digests, "shapes_digest": _digest(table.getvalue())}
    _save(manifest, json.dumps(meta).encode())
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)  # the renames themselves
    finally:
        os.close(directory)
    log.info("decoded cache %s: %d images at %d px, %.1f GB, built in %.0f s", pixels, len(paths), size, nbytes / 1e9, seconds)


def open_cache(folder: Path, paths: list[str], size: int, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The cache of ``paths`` at size x size in ``folder``, built first if no complete one exists.

    One process builds under the key's ``flock``; the others wait for the lock and then read what it built.
    """
    key = cache_key(paths, size)
    found = read_cache(folder, key, len(paths), size)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / f"{key}.lock"):
        found = read_cache(folder, key, len(paths), size)  # built by another process while this one waited
        if found is None:
            build_cache(folder, key, paths, size, workers)
            found = read_cache(folder, key, len(paths), size)
    if found is None:
        raise data.DatasetError(f"{folder}: the decoded cache {key} was not readable right after it was built")
    return found


def _budget() -> float:
    value = os.environ.get(CACHE_MAX_GB_ENV, "")
    if not value:
        return float("inf")
    try:
        gigabytes = float(value)
    except ValueError:
        gigabytes = float("nan")
    if not (math.isfinite(gigabytes) and gigabytes >= 0):  # nan or inf would let any size in, a negative turn it off
        raise data.DatasetError(f"${CACHE_MAX_GB_ENV}={value!r}: expected a number of gigabytes, finite and >= 0 (0 turns the cache off)")
    return gigabytes * 1e9


def attach_cache(splits: DatasetSplits, image_size: int, data_root: str | os.PathLike | None = None, workers: int = 1) -> bool:
    """Give each photo set of ``splits`` (train, test, gallery) its rows of the node's decoded cache, in place.

    Returns False, and leaves the sets to stream from their files, for characters (decoded in memory already),
    a cache over the budget or the disk's free space, or a folder that cannot be written; the log says which.
    """
    sets = [s for s in (splits.train, splits.test, splits.gallery) if s is not None and s.paths is not None and s.kind == "photos"]
    size = source_size(image_size)
    if not sets or all(s.decoded is not None and s.decoded.size == size for s in sets):
        return bool(sets)
    folder = cache_folder(data_root)
    if folder is None or _budget() == 0:
        return False
    paths = list(dict.fromkeys(p for s in sets for p in s.paths))
    nbytes = len(paths) * size * size * 3
    key = cache_key(paths, size)
    if read_cache(folder, key, len(paths), size) is None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(folder).free - FREE_MARGIN
        except OSError as error:
            log.warning("decoded cache off: %s (%s); streaming the images from their files", folder, error)
            return False
        if nbytes > min(_budget(), free):
            log.info(
                "decoded cache off: %d images at %d px need %.1f GB, over $%s (%s) or %s's free space (%.1f GB); streaming from files",
                len(paths), size, nbytes / 1e9, CACHE_MAX_GB_ENV, os.environ.get(CACHE_MAX_GB_ENV, "unset"), folder, free / 1e9,
            )  # fmt: skip
            return False
        if not os.access(folder, os.W_OK):
            log.warning("decoded cache off: %s is not writable; streaming the images from their files", folder)
            return False
    try:
        pixels, shapes = open_cache(folder, paths, size, workers)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # the disk filled after the free-space check above (another writer): the cache is a speed-up, not a need
        log.warning("decoded cache off: %s filled up while the cache was built (%s); streaming the images from their files", folder, error)
        return False
    row = {p: i for i, p in enumerate(paths)}
    for images in sets:
        images.decoded = Decoded(pixels, shapes, np.array([row[p] for p in images.paths], dtype=np.int64))
    return True

"""python bench/photo_loader.py: the photo loader at 224 px, the PIL path against the decoded cache, side by side.

On an SOP-shaped set (bench/photo_data.py; generated under --root if missing), with one torch thread per
process, in one run:

- build: the first run's cost of building the decoded cache (``cache.attach_cache``, one decoding process),
  beside the time the PIL path takes for one epoch of the same images;
- images/s per core of the training loader over random batches of --batch images: the PIL path
  (``TorchImages`` with ``train_transform``: decode, RandomResizedCrop, flip, normalize, image by image), the
  cached path (``CachedImages``: gather from the memory map, crop, resize and flip in uint8, batch-wise; the
  batch a GPU trial copies to its device and normalizes there), the same with the normalization on the CPU
  (``normalize_batch``: what a CPU trial's training process adds) and the bound (gathering the batch's bytes
  from the memory map alone);
- memory of 1 and of 4 concurrent reader processes (each a trial's training loader: one epoch of the training
  set through the cache): per process RSS, PSS (shared pages split among the processes that map them) and
  the PSS of the cache's mapping, summed over the processes: what the node holds. This process unmaps the
  cache first, so the readers alone share its pages.

--replicate K measures at K times the generated set's size without generating K times the JPEGs: a second root
(ROOT-xK) lists every image K times, under K folder links to the same files, with the class ids of each copy
shifted (SOP's 2-12 images per class and class-disjoint splits kept). Each listed path is its own image to the
cache (decoded and stored once per path), so the cache, its build and the readers' memory have the full size's
bytes; only the pixels repeat. SOP's 120,053 images: --scale 0.02 --replicate 50.

Examples:
  python bench/photo_loader.py --root /tmp/photobench --scale 0.1 --out docs/bench/photo_loader.json
  python bench/photo_loader.py --root /tmp/photobench --scale 0.1 --pil-batches 10 --batches 40     # quicker
  python bench/photo_loader.py --root /tmp/photobench --scale 0.02 --replicate 50 --build-workers 2  # SOP's size
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.photo_data import make_sop  # noqa: E402
from trainables.core import cache  # noqa: E402
from trainables.core.data import load_dataset  # noqa: E402
from trainables.core.transforms import CachedImages, TorchImages, normalize_batch, train_transform  # noqa: E402

SIZE = 224


def replicate(root: Path, copies: int) -> Path:
    """A data root listing every SOP image of ``root`` ``copies`` times (folder links ``copy{k}`` to ``root``'s
    folder; class ids of copy k shifted by k x the largest id). Returns it; made once."""
    base = root / "Stanford_Online_Products"
    target = root.with_name(f"{root.name}-x{copies}") / "Stanford_Online_Products"
    if (target / "Ebay_test.txt").is_file():
        return target.parent
    target.mkdir(parents=True, exist_ok=True)
    tables = {name: (base / name).read_text().splitlines() for name in ("Ebay_train.txt", "Ebay_test.txt")}
    shift = max(int(line.split()[1]) for lines in tables.values() for line in lines[1:])
    for k in range(copies):
        (target / f"copy{k}").unlink(missing_ok=True)
        (target / f"copy{k}").symlink_to(base, target_is_directory=True)
    for name, lines in tables.items():
        rows = [lines[0]]
        for k in range(copies):
            for line in lines[1:]:
                image, label, superclass, path = line.split()
                rows.append(f"{len(rows)} {int(label) + k * shift} {superclass} copy{k}/{path}")
        (target / name).write_text("\n".join(rows) + "\n")
    return target.parent


def batches(n: int, batch: int, count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(n, batch, replace=False) for _ in range(count)]


def rate(fetch, plan: list[np.ndarray]) -> float:
    """Images per second of ``fetch(indices)`` over ``plan`` (after one warm-up batch)."""
    fetch(plan[0])
    start = time.perf_counter()
    for indices in plan[1:]:
        fetch(indices)
    return sum(len(i) for i in plan[1:]) / (time.perf_counter() - start)


def memory(mapping_suffix: str = ".pixels") -> dict[str, float]:
    """This process's RSS and PSS (MiB), and the RSS and PSS of its mappings of the cache's pixel file."""
    rollup = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        rollup[key] = int(value.split()[0]) / 1024
    mapped = {"Rss": 0.0, "Pss": 0.0}
    current = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            current = head[-1].endswith(mapping_suffix)
        elif current and head and head[0].rstrip(":") in mapped:
            mapped[head[0].rstrip(":")] += int(head[1]) / 1024
    return {"rss_mib": rollup["Rss"], "pss_mib": rollup["Pss"], "cache_rss_mib": mapped["Rss"], "cache_pss_mib": mapped["Pss"]}


def barrier(folder: Path, name: str, count: int) -> None:
    """Mark this process at ``name`` in ``folder`` and wait until ``count`` processes have."""
    (folder / f"{name}.{os.getpid()}").touch()
    while len(list(folder.glob(f"{name}.*"))) < count:
        time.sleep(0.05)


def reader(root: str, batch: int, start_at: float, together: Path, count: int) -> None:
    """One trial's training loader: an epoch of the training set through the cache; prints its memory as JSON,
    sampled while all ``count`` readers are alive and done (PSS splits a page among the processes mapping it then)."""
    torch.set_num_threads(1)
    splits = load_dataset("sop", root)
    cache.attach_cache(splits, SIZE, root)
    dataset = CachedImages(splits.train, SIZE, 1.0)
    order = np.random.default_rng(os.getpid()).permutation(len(dataset))
    time.sleep(max(0.0, start_at - time.time()))
    started = time.perf_counter()
    for i in range(0, len(order), batch):
        dataset.__getitems__(order[i : i + batch])
    epoch_s = time.perf_counter() - started
    barrier(together, "done", count)
    sample = memory()
    barrier(together, "sampled", count)
    print(json.dumps({**sample, "epoch_s": epoch_s, "images": len(order)}))


def pil_rate(images, batch: int, count: int) -> float:
    """Images/s of the PIL path's training images (decode, RandomResizedCrop, flip, normalize), one at a time."""
    pil = TorchImages(images, train_transform("photos", SIZE, 1.0))
    return rate(lambda idx: torch.stack([pil[int(i)][0] for i in idx]), batches(len(pil), batch, count))


def cached_rates(splits, batch: int, count: int) -> dict[str, float]:
    """Images/s of the cached training loader (uint8 out, and normalized on the CPU), its evaluation crops and the bytes alone."""
    dataset = CachedImages(splits.train, SIZE, 1.0)
    plan = batches(len(dataset), batch, count, seed=1)
    decoded = splits.train.decoded
    return {
        "cached_uint8_images_per_s": rate(dataset.__getitems__, plan),
        "cached_images_per_s": rate(lambda idx: normalize_batch(dataset.__getitems__(idx)[0], "photos"), plan),
        "bytes_images_per_s": rate(lambda idx: decoded.pixels[decoded.rows[idx]], plan),
        "cached_eval_images_per_s": rate(CachedImages(splits.train, SIZE).__getitems__, plan),
    }


def concurrent_readers(root: Path, count: int, batch: int) -> list[dict]:
    start_at = time.time() + 8  # after every process has imported torch and opened the cache
    with tempfile.TemporaryDirectory() as together:
        command = [sys.executable, __file__, "--reader", "--root", str(root), "--batch", str(batch), "--start-at", str(start_at)]
        command += ["--together", together, "--readers", str(count)]
        processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
        return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="data root holding (or to hold) Stanford_Online_Products/")
    parser.add_argument("--scale", type=float, default=0.1, help="share of SOP's 120,053 images to generate if missing")
    parser.add_argument("--replicate", type=int, default=1, help="list the generated images this many times (see above)")
    parser.add_argument("--build-workers", type=int, default=1, help="processes building the cache (default 1: per core)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=60, help="batches timed for the cached path and the bound")
    parser.add_argument("--pil-batches", type=int, default=15, help="batches timed for the PIL path")
    parser.add_argument("--out", type=Path, help="JSON file for the results")
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--together", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--readers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.pop(cache.CACHE_DIR_ENV, None)
    if args.reader:
        return reader(str(args.root), args.batch, args.start_at, args.together, args.readers)
    torch.set_num_threads(1)
    if not (args.root / "Stanford_Online_Products" / "Ebay_test.txt").is_file():
        make_sop(args.root, scale=args.scale, workers=len(os.sched_getaffinity(0)))
    if args.replicate > 1:
        args.root = replicate(args.root, args.replicate)
    results: dict = {"uptime_before": os.popen("uptime").read().strip(), "host": platform.node(), "cpus": os.cpu_count()}
    splits = load_dataset("sop", args.root)
    images = len(splits.train) + len(splits.test)
    results["images"], results["train_images"] = images, len(splits.train)

    results["pil_images_per_s"] = pil_rate(splits.train, args.batch, args.pil_batches)
    print(f"PIL path: {results['pil_images_per_s']:.0f} images/s", flush=True)

    for stale in (args.root / ".dml_cache").glob("*"):  # a cold build: the first trial on a fresh node
        stale.unlink()
    subprocess.run(["sync"], check=False)
    started = time.perf_counter()
    cache.attach_cache(splits, SIZE, args.root, workers=args.build_workers)
    results["build_workers"] = args.build_workers
    results["build_s"] = time.perf_counter() - started
    results["build_images_per_s"] = images / results["build_s"]
    results["cache_gib"] = splits.train.decoded.pixels.nbytes / 2**30
    results["pil_epoch_s"] = images / results["pil_images_per_s"]
    print(f"build: {results['build_s']:.0f} s ({results['build_images_per_s']:.0f} images/s), {results['cache_gib']:.2f} GiB", flush=True)

    results.update(cached_rates(splits, args.batch, args.batches))
    print(
        f"cached, uint8 out: {results['cached_uint8_images_per_s']:.0f} images/s; normalized on the CPU: "
        f"{results['cached_images_per_s']:.0f}; bytes alone: {results['bytes_images_per_s']:.0f}; "
        f"eval crops: {results['cached_eval_images_per_s']:.0f}",
        flush=True,
    )
    del splits  # this process's mapping of the cache: the readers alone share it
    gc.collect()
    results["parent_cache_rss_mib"] = memory()["cache_rss_mib"]
    for count in (1, 4):
        results[f"readers_{count}"] = concurrent_readers(args.root, count, args.batch)
        total = sum(r["pss_mib"] for r in results[f"readers_{count}"])
        print(f"{count} readers: PSS total {total:.0f} MiB, {results[f'readers_{count}']}", flush=True)
    results["uptime_after"] = os.popen("uptime").read().strip()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

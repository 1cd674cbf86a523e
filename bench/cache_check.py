"""What the decoded cache's checksums cost a process that opens it, against what one epoch reads from it.

Workload: a photo cache's pixels in memory (``--images`` images at ``--size`` px, RGB, as the cache holds them), the
chunk checksums ``trainables.core.cache.read_cache`` computes the first time a process opens a cache; beside them,
what building the cache costs (decoding the same number of 500 x 375 JPEGs to ``--size`` px, as
``trainables.core.data.decode_sized`` does, timed on 64 and scaled) and one epoch's reads of the pixels (every image
once, in shuffled batches of ``--batch``, as the cached loader gathers them).

Question: is proving the cache's content before it is read cheap next to what the cache saves?

Bound: the check costs at most a tenth of decoding the images (it is paid once per process; the decode it saves
is paid by every process without a cache).

  python -m bench.cache_check
  python -m bench.cache_check --images 11788 --size 256     # CUB-200-2011's training and test images
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

from bench import harness
from trainables.core import cache, data

BOUND = 0.1  # the check's seconds over decoding the same images
SAMPLE = 64  # JPEGs decoded to time a decode


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(prog="python -m bench.cache_check", description=doc[0], epilog=doc[-1])
    parser.add_argument("--images", type=int, default=4096, help="images in the cache (default 4096)")
    parser.add_argument("--size", type=int, default=256, help="their side in px, as the cache stores them (default 256)")
    parser.add_argument("--batch", type=int, default=64, help="images per batch of the epoch's reads (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each, alternating; medians (default 3)")
    return parser.parse_args(argv)


def epoch_reads(pixels: np.ndarray, batch: int, rng: np.random.Generator) -> None:
    """Every image once, in shuffled batches: the rows the cached loader gathers for an epoch."""
    order = rng.permutation(len(pixels))
    for start in range(0, len(order), batch):
        pixels[np.sort(order[start : start + batch])].copy()


def decode_seconds(size: int, rng: np.random.Generator) -> float:
    """Seconds to decode one 500 x 375 JPEG photo to ``size`` px as the cache's build does (median over SAMPLE)."""
    smooth = rng.integers(0, 256, size=(SAMPLE, 47, 63, 3), dtype=np.uint8)  # upscaled: a photo's smoothness, not noise
    photos = []
    for array in smooth:
        buffer = io.BytesIO()
        Image.fromarray(array).resize((500, 375), Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=90)
        photos.append(buffer.getvalue())
    times = []
    for photo in photos:
        started = time.perf_counter()
        data.decode_sized(io.BytesIO(photo), "sample", "RGB", size)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(args.images, args.size, args.size, 3), dtype=np.uint8)
    check, reads = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        cache._chunk_digests(pixels)
        check.append(time.perf_counter() - started)
        started = time.perf_counter()
        epoch_reads(pixels, args.batch, rng)
        reads.append(time.perf_counter() - started)
    decode = decode_seconds(args.size, rng) * args.images
    ratio = statistics.median(check) / decode
    print(harness.machine_line())
    print(f"{pixels.nbytes / 1e6:.0f} MB ({args.images} images at {args.size} px), medians of {args.repeats}:")
    rows = [
        ("checksums, once per process", f"{statistics.median(check):.2f} s"),
        ("decoding the images (the cache's build, one worker)", f"{decode:.1f} s"),
        ("one epoch's reads of the cache", f"{statistics.median(reads):.2f} s"),
    ]
    print("\n".join(harness.table(("what", "seconds"), rows)))
    return harness.bound(ratio <= BOUND, f"the check costs at most {BOUND:g} of decoding the images ({ratio:.3f})")


if __name__ == "__main__":
    raise SystemExit(main())

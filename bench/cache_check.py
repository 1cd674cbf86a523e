"""What the decoded cache's checksums cost a process that opens it, against decoding the images the cache saves.

Workload: a cache's pixels in memory (``--images`` images at ``--size`` px, RGB), the chunk checksums
``trainables.core.cache.read_cache`` computes when a process first opens a cache; beside them, decoding as many
500 x 375 JPEGs to ``--size`` px as ``trainables.core.data.decode_sized`` does (64 timed, scaled), and one epoch's
reads of the pixels (every image once, in shuffled batches of 64, as the cached loader gathers them).

Question: is proving the cache's content before it is read cheap next to what the cache saves?

Bound: the check costs at most a fifth of decoding the images (paid once per process; every process without a cache
pays the decode).

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

BOUND = 0.2  # the check's seconds over decoding the same images


def seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def decode_seconds(size: int, rng: np.random.Generator, sample: int = 64) -> float:
    """Seconds to decode one 500 x 375 JPEG photo to ``size`` px as the cache's build does (median over ``sample``)."""
    photos = []
    for small in rng.integers(0, 256, size=(sample, 47, 63, 3), dtype=np.uint8):  # upscaled: a photo's smoothness
        photos.append(io.BytesIO())
        Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC).save(photos[-1], "JPEG", quality=90)
    return statistics.median(seconds(lambda p=p: data.decode_sized(io.BytesIO(p.getvalue()), "sample", "RGB", size)) for p in photos)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4096, help="images in the cache (default 4096)")
    parser.add_argument("--size", type=int, default=256, help="their side in px, as the cache stores them (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats, medians (default 3)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(args.images, args.size, args.size, 3), dtype=np.uint8)

    def epoch() -> None:
        order = rng.permutation(len(pixels))
        for start in range(0, len(order), 64):
            pixels[np.sort(order[start : start + 64])].copy()

    check = statistics.median(seconds(lambda: cache._chunk_digests(pixels)) for _ in range(args.repeats))
    reads = statistics.median(seconds(epoch) for _ in range(args.repeats))
    decode = decode_seconds(args.size, rng) * args.images
    print(harness.machine_line())
    print(f"{pixels.nbytes / 1e6:.0f} MB ({args.images} images at {args.size} px), medians of {args.repeats}:")
    rows = [
        ("checksums, once per process", f"{check:.2f}"),
        ("decoding the images, one worker", f"{decode:.1f}"),
        ("an epoch's reads", f"{reads:.2f}"),
    ]
    print("\n".join(harness.table(("what", "seconds"), rows)))
    return harness.bound(check / decode <= BOUND, f"the check costs at most {BOUND:g} of decoding the images ({check / decode:.3f})")


if __name__ == "__main__":
    raise SystemExit(main())

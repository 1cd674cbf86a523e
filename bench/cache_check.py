"""What the decoded cache's checksums cost a process that opens it, against decoding the images the cache saves.

Workload: a cache's pixels (``--images`` at ``--size`` px, RGB) and the chunk checksums ``trainables.core.cache``
computes when a process first opens a cache; beside them, decoding as many 500 x 375 JPEGs to ``--size`` px as
``trainables.core.data.decode_sized`` does (64 timed, scaled). Question: is proving the cache's content before it is
read cheap next to what the cache saves? Bound: the check costs at most a fifth of decoding the images.

  python -m bench.cache_check --images 11788 --size 256     # CUB-200-2011's images
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4096, help="images in the cache (default 4096)")
    parser.add_argument("--size", type=int, default=256, help="their side in px, as the cache stores them (default 256)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(args.images, args.size, args.size, 3), dtype=np.uint8)
    check = statistics.median(seconds(lambda: cache._chunk_digests(pixels)) for _ in range(3))
    photos = [io.BytesIO() for _ in range(64)]
    for photo, small in zip(photos, rng.integers(0, 256, size=(64, 47, 63, 3), dtype=np.uint8)):  # upscaled: smooth
        Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC).save(photo, "JPEG", quality=90)
    each = statistics.median(seconds(lambda p=p: data.decode_sized(io.BytesIO(p.getvalue()), "x", "RGB", args.size)) for p in photos)
    decode = each * args.images
    print(harness.machine_line(), f"\n{pixels.nbytes / 1e6:.0f} MB: checksums {check:.2f} s (median of 3), decoding {decode:.1f} s")
    return harness.bound(check / decode <= BOUND, f"the check costs at most {BOUND:g} of decoding the images ({check / decode:.3f})")


if __name__ == "__main__":
    raise SystemExit(main())

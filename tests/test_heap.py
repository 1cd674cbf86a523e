"""study.launch.heap: the driver's freed heap given back to the operating system, at most every so often."""

from __future__ import annotations

import gc

from study.launch.heap import Releaser, release_freed


def resident_mb() -> float:
    """This process's resident memory (VmRSS), in MB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_release_freed_hands_back_the_pages_malloc_kept():
    """200 MB of 2 KB blocks (each a malloc of its own), all but every 50th freed: glibc keeps the freed pages in its
    arena (the kept blocks hold its top), so the resident memory stays until malloc_trim gives them back."""
    blocks = [bytes(2048) for _ in range(100_000)]
    kept = blocks[::50]
    del blocks
    gc.collect()
    before = resident_mb()
    assert release_freed() is True  # glibc, as on every machine this project runs on
    after = resident_mb()
    assert before - after > 100, (before, after)  # of the 196 MB freed; the 4 MB kept stay
    assert len(kept) == 2000


def test_the_releaser_releases_at_most_every_interval_and_after_a_clock_that_went_back():
    now, calls = [0.0], []
    releaser = Releaser(release=lambda: calls.append(now[0]), clock=lambda: now[0])
    for t in (100.0, 105.0, 109.9, 110.0, 115.0, 120.5, 3.0, 4.0):  # 3.0: unpickled in a new process, its clock behind
        now[0] = t
        releaser.maybe_release()
    assert calls == [100.0, 110.0, 120.5, 3.0]

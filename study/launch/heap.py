"""The driver's freed heap, given back to the operating system.

A study's driver allocates and frees a great many short-lived blocks: each trial's results as Ray delivers them,
Tune's snapshots of every trial (serialized, then parsed back by ``study.launch.tunestate``), the MLflow records. glibc's
malloc keeps freed memory inside its arenas for reuse, so the driver's resident memory creeps up with the study
although what it holds grows far less. ``malloc_trim(0)`` hands the arenas' free pages back; every 10 s, it slows
the driver's growth per trial (docs/findings.md, engineering decisions).

Where the C library has no ``malloc_trim`` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import functools
import time


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` from the running process's own symbols, or None."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed() -> bool:
    """Gives the malloc arenas' free pages back to the operating system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class Releaser:
    """``maybe_release`` calls ``release`` (default ``release_freed``) at most once every ``every_s`` seconds of ``clock``."""

    every_s = 10.0

    def __init__(self, release=release_freed, clock=time.monotonic) -> None:
        self.release, self.clock, self.last = release, clock, None

    def maybe_release(self) -> None:
        """Releases when ``every_s`` have passed since the last release, or the clock went back (a resumed study's
        callbacks are unpickled in a new process, whose monotonic clock may be behind the old one)."""
        now = self.clock()
        if self.last is None or not 0 <= now - self.last < self.every_s:
            self.last = now
            self.release()

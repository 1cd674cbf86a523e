"""JSON-lines files that survive a torn write: the one rule the Optuna journal and the trial records' spool share.

A writer killed mid-append, or stopped by a full disk, leaves a partial last line. The next append would land
straight after it and glue a good record onto the torn one. So before each append, under the file's lock, the
bytes after the last newline are cut off and kept in ``<file>.torn`` for inspection (``cut_torn_tail``); a
reader skips a line that does not parse. No reader ever acted on a torn record: its writer never returned.

``Spool`` is such a file used as a queue (append at the end, read in order, drop the ones done from the front),
safe for several writers of one host at once: each change holds an ``flock`` on ``<file>.lock``.

This module imports no Ray, MLflow or torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)
CHUNK = 1 << 16


def tail_start(fh) -> int:
    """The offset just after the last newline of the open binary file ``fh`` (0 when it has none)."""
    end = fh.seek(0, os.SEEK_END)
    position = end
    while position > 0:
        step = min(CHUNK, position)
        position -= step
        fh.seek(position)
        block = fh.read(step)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return position + newline + 1
    return 0


def keep_torn(path: str, data: bytes) -> None:
    """Appends bytes cut from ``path`` to ``<path>.torn``."""
    if data:
        with open(path + ".torn", "ab") as fh:
            fh.write(data + b"\n")


def cut_torn_tail(path: str) -> int:
    """Cuts a partial last line off the file ``path``; returns the bytes cut (kept in ``<path>.torn``)."""
    with open(path, "rb+") as fh:
        end = fh.seek(0, os.SEEK_END)
        start = tail_start(fh)
        if start == end:
            return 0
        fh.seek(start)
        keep_torn(path, fh.read())
        fh.truncate(start)
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("%s ended in a torn record (%d bytes): cut off, kept in %s.torn", path, end - start, path)
    return end - start


def named(error: OSError, path: str) -> OSError:
    """``error`` naming ``path`` (an ``OSError`` raised when a buffered file is flushed or closed names no file)."""
    return error if error.filename else type(error)(error.errno, error.strerror, path)


def parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def json_or_none(line: str | bytes) -> Any:
    """A line's record; None for a blank line or one that does not parse (torn: never acknowledged)."""
    try:
        return json.loads(line) if line.strip() else None
    except ValueError:
        return None


class Spool:
    """A queue of JSON records in the file ``path``: ``append`` at the end, ``read`` in order, ``drop`` from the front.

    What ``append`` returned from is on disk (in the page cache: a killed process loses nothing of it). The file is
    removed when the last record is dropped.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The spool's lock (an ``flock``: between processes, and between two opens in one process), held for the body."""
        try:
            fh = open(self.path + ".lock", "a")
        except FileNotFoundError:  # the first record of a study: its folder is made once
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fh = open(self.path + ".lock", "a")
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def append(self, record: dict[str, Any]) -> None:
        """``record`` as the last line; a line torn by an earlier append that failed or was killed is cut first."""
        line = (json.dumps(record) + "\n").encode()
        with self.locked():
            try:
                if os.path.exists(self.path):
                    cut_torn_tail(self.path)
                with open(self.path, "ab") as fh:
                    fh.write(line)
            except OSError as error:  # a full disk: the line is torn or missing, and said to be
                raise named(error, self.path) from error

    def read(self) -> list[dict[str, Any]]:
        """Every record, in order (torn lines skipped)."""
        try:
            with open(self.path, "rb") as fh:
                return [record for record in map(json_or_none, fh) if record is not None]
        except FileNotFoundError:
            return []

    def drop(self, count: int) -> None:
        """Removes the first ``count`` records (done with), atomically; the file goes with the last."""
        if count <= 0:
            return
        with self.locked():
            left = self.read()[count:]
            if not left:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path)
                return
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as fh:
                fh.writelines(json.dumps(record) + "\n" for record in left)
            os.replace(tmp, self.path)

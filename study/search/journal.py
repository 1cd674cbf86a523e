"""Optuna's journal file, made to survive a torn write.

Optuna's ``JournalFileBackend`` appends each batch of records as JSON lines.
When the writer dies mid-write, or the disk fills, the file ends in a partial
line. Optuna's reader skips it, but the next append lands straight after it,
so the partial line and a good record share one line, and from then on every
read fails with ``JSONDecodeError``.

``RepairingJournalBackend`` closes both ends of that:

- before each append, under the journal's lock, a torn tail (bytes after the
  last newline) is cut off, so a new record always starts a line (``study.lines``,
  the rule the trial records' spool shares);
- when the backend is opened, a journal an older writer already glued
  together is repaired: in each line that does not parse, the torn prefix is
  dropped and the complete record after it kept (``repair``).

What is cut off is kept in ``<journal>.torn`` for inspection, never silently
thrown away. No reader ever saw a torn record (Optuna's reader skips it), so
dropping it changes nothing any process has acted on.

The journal's lock (``KillSafeLock``) is Optuna's own, a symbolic link
``<journal>.lock`` that other Optuna writers (optuna-dashboard, a user's
script) also take, inside an ``flock`` of this project's writers. A writer
killed while it holds Optuna's link leaves it behind, and Optuna's lock waits
30 s (its grace period) before breaking it: a driver SIGKILLed mid-append made
its ``--resume`` wait that long (docs/performance.md, measurements behind the
code). The kernel drops the ``flock`` with its holder, and the holder's mark
beside it says that it held the link, so the next writer removes the link left
behind at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from study.inputs import with_password, without_password
from study.lines import cut_torn_tail, keep_torn, named, parses

log = logging.getLogger(__name__)
PREFIX = "journal:"  # --optuna-storage journal:PATH names a journal file; anything else is a database URL


def open_storage(storage: str | optuna.storages.BaseStorage) -> optuna.storages.BaseStorage:
    """``journal:PATH`` for a journal file (safe with concurrent writers and torn writes), else an RDB URL; a storage object as it is."""
    if isinstance(storage, optuna.storages.BaseStorage):
        return storage
    path = journal_file(storage)
    if path is not None:
        return optuna.storages.JournalStorage(RepairingJournalBackend(path))
    return PasswordHidingStorage(with_password(storage, "the Optuna storage"))


class PasswordHidingStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage, whose pickle holds its URL with the password hidden (``study.inputs.without_password``).

    Ray Tune pickles the searcher's state with each snapshot, and with it the Optuna trials still running, their study
    and its storage; unpickled in the driver that was given the URL (``--resume`` asks for it again), it connects with
    the password as given.
    """

    def __getstate__(self) -> dict[Any, Any]:
        return {**super().__getstate__(), "url": without_password(self.url)}

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__({**state, "url": with_password(state["url"], "the Optuna storage")})


def journal_file(storage: str) -> str | None:
    """The file a ``journal:PATH`` storage names, as given; None for a database URL."""
    return storage.removeprefix(PREFIX) if storage.startswith(PREFIX) else None


def salvage(line: bytes) -> tuple[bytes, bytes]:
    """A line holding a torn record glued to a complete one: (the complete record, the torn bytes before it)."""
    for start in range(1, len(line)):
        if line[start : start + 1] == b"{" and parses(line[start:]):
            return line[start:], line[:start]
    return b"", line


def repair(path: str) -> int:
    """Rewrites a journal whose lines do not all parse (each keeps its complete record); returns the bytes dropped."""
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    tail = lines.pop()  # after the last newline: b"" or a torn tail, cut before the next append
    bad = [i for i, line in enumerate(lines) if not parses(line)]
    if not bad:
        return 0
    dropped = []
    for i in bad:
        lines[i], torn = salvage(lines[i])
        dropped.append(torn)
    kept = [line for line in lines if line]
    temporary = path + ".repairing"
    with open(temporary, "wb") as fh:
        fh.write(b"".join(line + b"\n" for line in kept) + tail)
        fh.flush()
        os.fsync(fh.fileno())
    keep_torn(path, b"\n".join(dropped))
    os.replace(temporary, path)
    size = sum(len(d) for d in dropped)
    log.warning("repaired the Optuna journal %s: %d torn record(s), %d bytes, moved to %s.torn", path, len(bad), size, path)
    return size


HELD = "held"  # the mark of a writer of this project that holds Optuna's link


class KillSafeLock:
    """A lock for Optuna's ``JournalFileBackend`` (its ``lock_obj``: ``acquire`` and ``release``, as Optuna's own locks).

    Optuna's symbolic-link lock of the journal at ``path``, taken under an ``flock`` of ``<path>.flock``, whose
    file marks whether its holder holds the link: a holder killed with the link held leaves the mark, and the next
    one, which the kernel lets in, removes that link at once instead of waiting out Optuna's grace period. A link
    without the mark is another Optuna writer's: waited for as Optuna waits. Threads of one process each take the
    ``flock`` through their own open file, so they exclude each other as processes do."""

    def __init__(self, path: str) -> None:
        self.link = JournalFileSymlinkLock(path)  # Optuna's default lock, so other Optuna writers agree with it
        self.link_path, self.mark_path = path + ".lock", path + ".flock"
        self._marks: list = []  # the open mark file while held: at most one, as the flock admits one holder

    def acquire(self) -> bool:
        mark = open(self.mark_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(mark, fcntl.LOCK_EX)  # waits for this project's other writers; dropped when a holder dies
            mark.seek(0)
            if mark.read().strip() == HELD:  # the last holder died holding the link: nobody else can be in it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.link_path)
                    log.warning("removed the lock %s that a writer killed while it held it left behind", self.link_path)
            self.link.acquire()
            mark.seek(0)
            mark.truncate()
            mark.write(HELD)
            mark.flush()
        except BaseException:
            mark.close()  # drops the flock
            raise
        self._marks.append(mark)
        return True

    def release(self) -> None:
        mark = self._marks.pop()
        try:
            self.link.release()
            mark.seek(0)
            mark.truncate()
            mark.flush()
        finally:
            mark.close()  # drops the flock


class RepairingJournalBackend(JournalFileBackend):
    """Optuna's journal file backend that never appends after a torn record, with a lock a killed writer does not
    keep for 30 s (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = KillSafeLock(path)
        super().__init__(path, lock_obj=self.lock)
        with self.locked():
            repair(path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The journal's lock (the one Optuna's own appends take), held for the body."""
        self.lock.acquire()  # waits; a link left by a killed writer of this project is removed at once
        try:
            yield
        finally:
            self.lock.release()

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in logs).encode("utf-8")
        with self.locked():
            try:
                cut_torn_tail(self.path)
                with open(self.path, "ab") as fh:
                    fh.write(data)  # one write of whole lines
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as error:  # a full disk: the records are torn or missing, and said to be
                raise named(error, self.path) from error

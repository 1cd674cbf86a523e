"""Locks that keep two drivers apart: one per study, and one around the first use of a local MLflow store; and a
process's own lock, which tells a later process whether the one that wrote a record is still alive.

All are ``flock`` locks on a small file. The kernel drops a lock when its
process dies, however it dies (SIGKILL included), so a crashed driver never
leaves a stale lock behind. The study lock's file names its holder (pid, host,
start time, command), so a second driver can say who runs the study.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from study.inputs import UsageError
from study.records.store import is_local_sqlite, sqlite_file
from study.search.journal import journal_file


class StudyLocked(UsageError):
    """Another driver runs the study."""


def lock_folder(optuna_storage: str, runs_dir: Path) -> Path:
    """Where a study's lock lives: beside its Optuna journal, else under the runs folder."""
    path = journal_file(optuna_storage)
    return Path(path).expanduser().resolve().parent / "locks" if path is not None else runs_dir / "locks"


def holder_line() -> str:
    """Who holds a lock: pid, host, since when, and the command."""
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()} since {since}: {' '.join(sys.argv)}"


@contextlib.contextmanager
def held_alone(path: Path, refusal: Callable[[str], str]) -> Iterator[Path]:
    """Holds the lock file ``path`` for the body; a second holder fails at once with ``StudyLocked(refusal(holder))``,
    ``holder`` the first's line (pid, host, start time, command)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            fh.seek(0)
            raise StudyLocked(refusal(fh.read().strip() or "another process")) from None
        fh.seek(0)
        fh.truncate()
        fh.write(holder_line() + "\n")
        fh.flush()
        try:
            yield path
        finally:
            fh.seek(0)
            fh.truncate()  # released: the file stays (unlinking could let two drivers lock two different files)


def study_lock(folder: Path, study_name: str, advice: str = "") -> contextlib.AbstractContextManager[Path]:
    """Holds study ``study_name``'s lock for the body; a second holder fails at once with ``StudyLocked`` naming the first.
    ``advice``: what a command other than study.launch (which takes ``--study NAME``) says to do instead."""
    path = folder / f"{study_name}.lock"
    flag = "--study" if advice else "--study-name"
    advice = advice or "expected no other driver of it: wait for that one to end, or stop it and --resume"
    return held_alone(path, lambda holder: f"{flag} {study_name}: the study is being run by {holder} (lock {path}); {advice}")


def final_lock(folder: Path, study_name: str) -> contextlib.AbstractContextManager[Path]:
    """Holds the lock of ``study.final --study study_name`` for the body: one final of a study at a time, so that the
    study's parent run gets one set of seed runs and the registry one version."""
    path = folder / f"final-{study_name}.lock"
    return held_alone(
        path,
        lambda holder: (
            f"--study {study_name}: a study.final of study {study_name} is running: {holder} (lock {path}); "
            "expected one at a time: wait for it to end, or stop it and run the command again"
        ),
    )


@contextlib.contextmanager
def store_setup_lock(tracking_uri: str) -> Iterator[None]:
    """For a local sqlite store, one process at a time creates or migrates it (MLflow's migrations race otherwise)."""
    if not is_local_sqlite(tracking_uri):
        yield
        return
    database = sqlite_file(tracking_uri)
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        fh = open(database.with_name(database.name + ".lock"), "a", encoding="utf-8")
    except OSError:
        yield  # no lock to take: the tracking checks report the folder
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # waits for the other driver's setup, a few seconds
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def process_lock(folder: Path, prefix: str) -> Iterator[Path]:
    """A lock of this process's own, held for the body: ``folder/PREFIX-<pid>-<random>.lock``, naming its holder. The
    records the process writes name it (``owner_tags``), so that a later process tells from ``abandoned`` whether
    their writer is gone. Removed at the end of the body unless ``keep`` says otherwise; left behind, unheld, when the
    process is killed."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}.lock"
    with open(path, "w", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else holds it
        fh.write(holder_line() + "\n")
        fh.flush()
        try:
            yield path
        finally:
            if path in _KEPT:
                _KEPT.discard(path)
            else:
                path.unlink(missing_ok=True)


_KEPT: set[Path] = set()  # process locks whose records were left unended: kept on disk when their holder ends


def keep(lock: Path) -> None:
    """The ``process_lock`` ``lock`` stays on disk when its body ends (unheld once the process ends): the records it owns
    were left unended (their store away or full), and a later process finds it ``abandoned`` and ends them. Writes
    nothing: it must hold on a full disk."""
    _KEPT.add(lock)


def owner_tags(lock: Path) -> dict[str, str]:
    """The tags that name a record's writer: this host and its ``process_lock``."""
    return {"owner_host": socket.gethostname(), "owner_lock": str(lock)}


def abandoned(lock: str | os.PathLike) -> str | None:
    """The holder line of ``lock`` when no process holds it any more (its process ended without removing it: SIGKILL,
    the machine stopped); None while it is held, or when there is no such file here (nothing to tell)."""
    try:
        fh = open(lock, encoding="utf-8")
    except OSError:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        return fh.read().strip() or "a process"

"""A study's Ray Tune state, kept resumable: a copy of its last readable snapshot, put back when the files are torn.

Ray Tune snapshots a study's state (``experiment_state-*.json``, the searcher's ``search_gen_state-*.json`` and
``searcher-state-*.pkl``, ...) into the experiment folder under ``--storage-path`` by copying them from the driver,
not atomically. A full disk cuts them short, and ``Tuner.restore`` then fails on the torn JSON. So, during a
study, ``KeepTuneState`` (a Tune callback of the driver) copies each new snapshot whose files all read back into
``<experiment>/.last-good/``: each file under a temporary name, read back (Tune may rewrite it during the copy), then
renamed in place; a copy that fails on a full disk or reads back torn leaves the previous one.
A snapshot is the newest file of each kind, the one Tune restores from: a resumed study's older files stay in the
folder but are not copied again at each new snapshot. Before a resume, ``recover`` puts that copy back in place of
torn files (kept as ``*.torn``). A resume from a slightly older snapshot loses nothing: trials continue from their
checkpoints, the records skip the epochs they already hold, and the Optuna journal keeps what was told.

A full disk also stops the study before it tears more: ``KeepTuneState`` looks at the free space of the study's
folders (the experiment folder and the runs folder) every ``watch_every_s`` and raises ``DiskFull`` (an ``OSError``,
ENOSPC, naming the folder) from Tune's loop when one has less than ``MIN_FREE_BYTES`` left. The driver ends with
one line, its runs marked stopped and its Optuna trials left RUNNING, as a signal leaves them, for ``--resume``
once space is freed (trials that failed on the full disk would instead end FAILED for good).

Local storage paths only (an ``s3://`` store writes each object whole). This module imports no Ray.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import time
from pathlib import Path

from study.inputs import free_bytes
from study.records.tracking import runs_dir

log = logging.getLogger(__name__)

STATE_PATTERNS = ("experiment_state-*.json", "search_gen_state-*.json", "searcher-state-*.pkl", "basic-variant-state-*.json")
GOOD = ".last-good"
FULL_PARSE_BYTES = 16 << 20  # larger snapshots (thousands of trials) are checked by their ends, not parsed every time
MIN_FREE_BYTES = 1 << 20  # below this a study's folder counts as full: Tune's next snapshot or checkpoint would tear


class DiskFull(OSError):
    """A folder of the study is on a filesystem with (almost) no space left: ENOSPC, ``filename`` the folder."""

    def __init__(self, folder: str) -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), folder)


def check_space(folders) -> None:
    """Raises ``DiskFull`` for the first of ``folders`` whose filesystem has less than ``MIN_FREE_BYTES`` left."""
    for folder in folders:
        free = free_bytes(folder)
        if free is not None and free < MIN_FREE_BYTES:
            raise DiskFull(str(folder))


def state_files(folder: Path) -> list[Path]:
    """The Tune state files in ``folder``."""
    return sorted(path for pattern in STATE_PATTERNS for path in folder.glob(pattern))


def snapshot_files(folder: Path) -> list[Path]:
    """The state files Tune restores from: the newest of each kind in ``folder`` (Tune names each by its driver's
    session, a timestamp, and reads the greatest name). A resumed study's older files stay beside them, unread."""
    return sorted(max(found) for pattern in STATE_PATTERNS if (found := list(folder.glob(pattern))))


def kinds(files: list[Path]) -> set[str]:
    """Which of ``STATE_PATTERNS`` the files are."""
    return {pattern for pattern in STATE_PATTERNS for path in files if path.match(pattern)}


# What Tune's restore reads of its experiment state (Ray 2.60's TuneController): a file without them is no state to
# resume from, and Tune would start the experiment afresh with a line in the log alone
EXPERIMENT_KEYS = {"trial_data": list, "runner_data": dict}


def readable(path: Path) -> bool:
    """Whether a state file reads back whole: JSON parses (a large one: starts with '{' and ends with '}') and, for
    the experiment's state, holds what Tune restores from (``EXPERIMENT_KEYS``); a pickle loads (Tune writes its
    searchers' state as pickles, whatever the file's suffix)."""
    try:
        data = path.read_bytes()
        if data.lstrip()[:1] != b"{":
            pickle.loads(data)  # noqa: S301 - the study's own file, written by its own driver
            return True
        if len(data) > FULL_PARSE_BYTES:
            return data.rstrip()[-1:] == b"}"
        state = json.loads(data)
        if path.match(STATE_PATTERNS[0]):
            return all(isinstance(state.get(key), kind) for key, kind in EXPERIMENT_KEYS.items())
        return isinstance(state, dict)
    except Exception:  # torn, empty, unreadable: not a state to resume from
        return False


def keep_good_state(experiment_dir: str) -> bool:
    """Copies the experiment's snapshot (``snapshot_files``) into ``.last-good/`` when every file reads back; True when
    copied. Tune rewrites its files in place, so each copy is checked again after it is made: a copy that caught a
    file mid-rewrite is dropped with the rest, and the previous good copy stays. So does a copy that holds more kinds
    of file than the snapshot (Tune's first snapshot, caught before all its files arrived). Copies of an older
    snapshot left there are removed."""
    folder = Path(experiment_dir)
    files, good = snapshot_files(folder), folder / GOOD
    if not files or not all(readable(path) for path in files) or kinds(state_files(good)) - kinds(files):
        return False
    good.mkdir(exist_ok=True)
    copies = [(good / f".{path.name}.tmp", good / path.name) for path in files]
    try:
        for path, (tmp, _) in zip(files, copies, strict=True):
            shutil.copyfile(path, tmp)
        if not all(readable(tmp) for tmp, _ in copies):
            return False
        for tmp, target in copies:
            os.replace(tmp, target)
    finally:
        for tmp, _ in copies:
            tmp.unlink(missing_ok=True)
    for stale in set(state_files(good)) - {target for _, target in copies}:
        stale.unlink(missing_ok=True)
    return True


def whole(experiment_dir: str) -> bool:
    """Whether Tune can restore the experiment: its state files read back, or a good copy of them does."""
    folder = Path(experiment_dir)
    current, copies = snapshot_files(folder), state_files(folder / GOOD) if (folder / GOOD).is_dir() else []
    return any(all(readable(path) for path in files) for files in (current, copies) if files)


def resumable(experiment_dir: str) -> bool:
    """Whether ``--resume`` can continue the experiment: its folder exists, and its state or a good copy reads back
    whole, or Tune has saved none yet (stopped before its first snapshot: ``--resume`` starts the trials afresh)."""
    folder = Path(experiment_dir)
    return folder.is_dir() and (whole(experiment_dir) or not (state_files(folder) or state_files(folder / GOOD)))


def set_aside(experiment_dir: str) -> list[str]:
    """Renames the experiment's state files to ``<name>.torn`` (a fresh Tuner then starts there); returns their names."""
    files = state_files(Path(experiment_dir))
    for path in files:
        os.replace(path, path.with_name(path.name + ".torn"))
    return [path.name for path in files]


def recover(experiment_dir: str) -> list[str]:
    """Before a resume: torn state files are replaced by the last good copy (each torn one kept as ``<name>.torn``).

    Returns the names replaced ([] when every file read back, or when there is no good copy to put back).
    """
    folder = Path(experiment_dir)
    good = folder / GOOD
    torn = [path for path in snapshot_files(folder) if not readable(path)]
    copies = state_files(good) if good.is_dir() else []
    if not torn or not copies or not all(readable(path) for path in copies):
        return []
    for path in torn:
        os.replace(path, path.with_name(path.name + ".torn"))
    for path in state_files(folder):  # the readable files of the torn snapshot: the good copy replaces it whole
        path.unlink()
    for copy in copies:
        shutil.copyfile(copy, folder / copy.name)
    log.warning("Tune's state in %s was torn (%s): resumed from its last good copy", experiment_dir, ", ".join(p.name for p in torn))
    return [path.name for path in torn]


KEPT = ".kept-checkpoints"  # in a trial's folder: hard links of its newest checkpoint folders
KEPT_PER_TRIAL = 4  # Tune's num_to_keep (2) and the two it deleted last
KEPT_BEFORE_GOOD = 2  # and the newest written before the good copy of Tune's state: it names one of them


def keep_checkpoint_links(trial_dir: Path) -> None:
    """Hard links of each of the trial's ``checkpoint_*`` folders under ``<trial>/.kept-checkpoints/`` (no copy of the
    data while Tune keeps the folder): its newest ``KEPT_PER_TRIAL``, and its newest ``KEPT_BEFORE_GOOD`` written
    before the experiment's good copy of Tune's state (``.last-good``, up to ``KeepTuneState.every_s`` old).

    Tune's ``num_to_keep=2`` deletes the checkpoint its last snapshot names when the trial's second checkpoint since
    that snapshot registers, and forces its next snapshot only after that: a driver killed in between would leave
    the trial unrestorable ("Could not recover from checkpoint as it does not exist on storage anymore"). The links
    keep that folder's files for ``put_back_checkpoints``; so they do for a resume from the good copy, which with
    checkpoints every epoch can name one more than 4 checkpoints old (the last registered before the copy; the one
    before it too, as a checkpoint is written before Tune registers it)."""
    kept = trial_dir / KEPT
    for checkpoint in sorted(trial_dir.glob("checkpoint_*")):
        mirror, tmp = kept / checkpoint.name, kept / f".{checkpoint.name}.tmp"
        if mirror.is_dir() or not checkpoint.is_dir():
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(checkpoint, tmp, copy_function=os.link)
        os.replace(tmp, mirror)
    links = sorted(kept.glob("checkpoint_*"))
    copied = max((path.stat().st_mtime_ns for path in state_files(trial_dir.parent / GOOD)), default=None)
    before_good = [link for link in links if copied is not None and link.stat().st_mtime_ns <= copied][-KEPT_BEFORE_GOOD:]
    for stale in set(links[:-KEPT_PER_TRIAL]) - set(before_good):
        shutil.rmtree(stale, ignore_errors=True)


def put_back_checkpoints(experiment_dir: str) -> list[str]:
    """Before a resume: each trial's kept checkpoint folder that Tune has deleted goes back in place (moved from
    ``.kept-checkpoints``), so that the one Tune's snapshot names exists. Returns ``<trial folder>/<checkpoint>``
    of those put back. Tune tracks only the one it restores from; the others stay on disk."""
    restored = []
    for kept in sorted(Path(experiment_dir).glob(f"*/{KEPT}")):
        for mirror in sorted(kept.glob("checkpoint_*")):
            if not (kept.parent / mirror.name).exists():
                os.replace(mirror, kept.parent / mirror.name)
                restored.append(f"{kept.parent.name}/{mirror.name}")
    return restored


def drop_checkpoint_links(trial_dir: Path) -> None:
    """A trial that has ended is not restored from a checkpoint: its links go (with the data Tune has deleted)."""
    shutil.rmtree(trial_dir / KEPT, ignore_errors=True)


class KeepTuneState:
    """Copies each new snapshot of a study's Tune state, checking at most every ``every_s`` seconds (the first one as
    soon as Tune has written it), and stops the study on a full disk (``DiskFull``): the Tune callback
    ``study.launch.callbacks.KeepState`` calls ``maybe_keep`` at each step of Tune's loop.

    ``watched``: the folders whose free space is watched (default: the experiment folder and the runs folder).
    A resumed study runs the keeper pickled with its Tuner, so attributes added later are read with defaults.
    """

    every_s = 10.0
    watch_every_s = 0.5

    def __init__(self, experiment_dir: str, watched: tuple[str, ...] | None = None) -> None:
        self.experiment_dir, self.last_try, self.seen = experiment_dir, 0.0, ()
        self.watched = watched if watched is not None else (experiment_dir, str(runs_dir()))
        self.last_watch = 0.0

    def maybe_keep(self, force: bool = False) -> None:
        """Raises ``DiskFull`` when a watched folder's disk is full; else copies a new readable snapshot when due."""
        if force or time.monotonic() - getattr(self, "last_watch", 0.0) >= self.watch_every_s:
            self.last_watch = time.monotonic()
            check_space(getattr(self, "watched", (self.experiment_dir,)))
        if not force and time.monotonic() - self.last_try < self.every_s:
            return
        files = snapshot_files(Path(self.experiment_dir))
        if not files:  # Tune has not written its first snapshot: look again at the next step
            return
        self.last_try = time.monotonic()
        stats = [(p.name, p.stat()) for p in files if p.exists()]
        stamp = tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)
        if stamp == self.seen:
            return
        try:
            if keep_good_state(self.experiment_dir):
                self.seen = stamp
        except OSError as error:  # a full disk: the previous good copy stays
            log.warning("could not keep a copy of Tune's state in %s (%s)", self.experiment_dir, error)

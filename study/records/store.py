"""A local MLflow store (``sqlite:///PATH``): its database file, read directly, and rebound when its runs folder moved.

A local MLflow store keeps absolute paths: each experiment's and run's artifact location (``file://<runs
folder>/artifacts/...``, as ``study.records.tracking`` lays them out), logged models and model versions, and a study's
``optuna_storage`` and ``storage_path`` params. A copy of a runs folder (say, rsynced from a cluster's head to
a laptop) would still read and write the original's artifacts, journal and checkpoints, or find them gone.

The store is *moved* when an experiment's artifacts folder ``<old>/artifacts/<experiment>`` is not the one beside
its database, ``<new>/artifacts/<experiment>``, and that one exists. Every command checks that when it checks the
store (``tracking.check_store``) and rebinds a moved store before anything else: each path under ``<old>/`` is
rewritten to the same path under ``<new>/``, in one transaction, and one line says so.

MLflow has no API that changes a run's artifact location or a param, so the rebinding updates the sqlite
database's columns that hold those paths (the tables and columns MLflow 3's schema names, each only if present).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from study.inputs import UsageError

# (table, column) of MLflow's sqlite schema that hold artifact paths (file:// URIs)
URI_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


PATH_PARAMS = {"optuna_storage": "journal:", "storage_path": ""}  # a study's params that hold a path, after a prefix


@dataclass(frozen=True)
class Move:
    """A store whose paths name ``old`` (the runs folder it was written in) and that now lies in ``new``."""

    old: Path
    new: Path


def file_path(uri: str) -> Path | None:
    """The local path of a ``file://`` URI (None for any other scheme)."""
    parts = urlsplit(uri)
    return Path(unquote(parts.path)) if parts.scheme == "file" else None


def find_move(database: Path) -> Move | None:
    """The move of the sqlite store ``database``, read from its experiments' artifact locations (None: not moved).
    Read as ``read_sqlite`` reads, which rolls back what a writer killed mid-transaction left."""
    new = database.resolve().parent
    with read_sqlite(database) as db:
        locations = [row[0] for row in db.execute("SELECT artifact_location FROM experiments") if row[0]]
    for location in locations:
        path = file_path(location)
        if path is None or path.parent.name != "artifacts":
            continue
        old = path.parent.parent
        if old != new and (new / "artifacts" / path.name).is_dir():
            return Move(old, new)
    return None


def rebind(database: Path, move: Move) -> int:
    """Rewrite every path under ``move.old`` in the store to the same path under ``move.new``; the rows changed."""
    changed = 0
    with sqlite3.connect(database) as db:  # one transaction: all of it or nothing
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, column in URI_COLUMNS:
            if table not in tables or column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                continue
            for old, new in ((move.old.as_uri() + "/", move.new.as_uri() + "/"), (f"{move.old}/", f"{move.new}/")):
                changed += db.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old),
                ).rowcount
        for key, prefix in PATH_PARAMS.items():
            old, new = f"{prefix}{move.old}/", f"{prefix}{move.new}/"
            changed += db.execute(
                "UPDATE params SET value = ? || substr(value, ?) WHERE key = ? AND substr(value, 1, ?) = ?",
                (new, len(old) + 1, key, len(old), old),
            ).rowcount
            exact_old, exact_new = f"{prefix}{move.old}", f"{prefix}{move.new}"
            changed += db.execute("UPDATE params SET value = ? WHERE key = ? AND value = ?", (exact_new, key, exact_old)).rowcount
    return changed


def rebind_if_moved(uri: str) -> Move | None:
    """For a local sqlite store that was moved: rebind it and say so in one line (stderr); the move, or None."""
    if not is_local_sqlite(uri):
        return None
    database = sqlite_file(uri)
    if not database.is_file():
        return None
    try:
        move = find_move(database)
        if move is None:
            return None
        rows = rebind(database, move)
    except sqlite3.Error as error:
        raise UsageError(f"{database}: cannot rebind a moved MLflow store ({error}); expected a writable sqlite database") from None
    print(f"note: {database} was written in {move.old}; its paths now name {move.new} ({rows} rewritten)", file=sys.stderr)
    return move


def is_local_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:///")


def sqlite_file(uri: str) -> Path:
    """The database file of a local sqlite store (``sqlite:///PATH``, see ``is_local_sqlite``), ``~`` expanded."""
    return Path(uri.removeprefix("sqlite:///")).expanduser()


def read_sqlite(database: Path):
    """A connection (closed at the end of a ``with``) that reads a local store's sqlite file directly, opened for
    writing as MLflow opens it (sqlite opens a write-protected file read-only): a writer killed mid-transaction leaves
    a hot journal that the first reader must roll back, and a read-only connection cannot (SQLITE_READONLY_ROLLBACK,
    "attempt to write a readonly database": every command failed on such a store, --resume first)."""
    import sqlite3

    return contextlib.closing(sqlite3.connect(database))

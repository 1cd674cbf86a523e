"""What a user gives the study commands, read safely: ``UsageError`` (bad input, one line, exit status 2), YAML, and
the passwords of storage URLs, which never reach a record, a log or the terminal (``redacted``).

Search spaces, configs and best_config.yaml files are read with a bounded safe loader: a few kB each, no alias
bombs, no key given twice. This module imports neither MLflow, Ray nor torch.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml


class UsageError(ValueError):
    """Bad input from the command line or a file; printed as one line, exit status 2."""


# scheme://user:password@: the password runs to the last "@" before a space (an unescaped "@" or "/" in it is still hidden)
_URL_PASSWORD = re.compile(r"(?P<scheme_user>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):(?:[^\s@]*@)+")


REDACTED = ":***@"  # what a password in a URL becomes


def redacted(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``: ``postgresql://user:***@host/db``.

    What a study records (params, tags), logs and prints goes through this: a --tracking-uri or --optuna-storage
    may carry a password, and every reader of MLflow or of a terminal would see it.
    """
    return _URL_PASSWORD.sub(r"\g<scheme_user>:***@", text)


_GIVEN: dict[str, str] = {}  # a URL with its password hidden -> the URL as given: this process's memory only


def without_password(url: str) -> str:
    """``url`` as the state a study pickles or writes (Ray Tune's searcher and callbacks, the record) holds it: its
    password hidden (``redacted``). The URL as given stays in this process's memory, for ``with_password``."""
    hidden = redacted(url)
    if hidden != url:
        _GIVEN[hidden] = url
    return hidden


def with_password(url: str, what: str) -> str:
    """The URL ``without_password`` hid, as given; ``url`` itself when it hides no password. A hidden password this
    process was never given (``study.sync`` of a study whose URL had one) is a UsageError naming ``what``."""
    if REDACTED not in url:
        return url
    if url not in _GIVEN:
        raise UsageError(
            f"{what} {url}: the password was not given to this command; give the URL with it, or leave it out of the URL "
            "and let the database driver read it (PostgreSQL: $PGPASSWORD or ~/.pgpass)"
        )
    return _GIVEN[url]


def without_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` part (an address to show as a link; the browser asks for the login)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def print_error(error: BaseException | str) -> int:
    """Bad input as the commands print it: one line ``error: ...`` on stderr, passwords redacted; returns exit status 2."""
    print(f"error: {redacted(str(error))}", file=sys.stderr)
    return 2


DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a file could not be written: a full or read-only disk


def disk_error(error: BaseException, codes: tuple[int, ...] = DISK_ERRORS) -> OSError | None:
    """The ``OSError`` with an errno of ``codes`` (a full or read-only disk) that ``error`` is, or was raised from or
    while handling: Ray Tune turns an exception in a callback into a ``TuneError`` holding only its text."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in codes:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def disk_error_line(error: OSError, folders: list[str]) -> str:
    """One line for a full or read-only disk: the file (else the fullest of ``folders``), what the system said, and
    the space left on that filesystem."""
    space = {folder: free for folder in folders if (free := free_bytes(folder)) is not None}
    where = error.filename or min(space, key=space.get, default="a study file")
    free = free_bytes(where if os.path.isdir(where) else os.path.dirname(where))
    left = f" ({free} bytes free on its filesystem)" if free is not None else ""
    return f"{where}: {error.strerror or os.strerror(error.errno)}{left}"


def disk_full_exit(error: BaseException, folders: list[str], advice: str) -> int:
    """How a command ends on a full or read-only disk (``disk_error``): one line naming the file (else the fullest of
    ``folders``), what the system said, the space left and ``advice``; exit status 1. Any other error is raised as it is."""
    disk = disk_error(error)
    if disk is None:
        raise error
    print_error(f"{disk_error_line(disk, folders)}; {advice}")
    return 1


def free_bytes(folder: str | os.PathLike) -> int | None:
    """The bytes an unprivileged writer may still use on the filesystem of ``folder`` (None when it cannot be read)."""
    try:
        st = os.statvfs(folder)
    except OSError:  # not created yet, or gone
        return None
    return st.f_bavail * st.f_frsize


class RedactingFilter(logging.Filter):
    """A handler's filter that redacts the passwords of URLs in every record it lets through (see ``redacted``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if redacted(message) != message:
            record.msg, record.args = redacted(message), None
        if record.exc_info or record.exc_text:  # a traceback: handlers write its text, cached on the record by the first
            record.exc_text = redacted(record.exc_text or logging.Formatter().formatException(record.exc_info))
        return True


def redact_logs() -> None:
    """From now on every handler of every logger (the terminal's, MLflow's own, a command's log file) redacts URL
    passwords in what it writes (``RedactingFilter``, added once per handler). Call it once the handlers are set up."""
    loggers = [logging.getLogger(), *(x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger))]
    for handler in {h for logger in loggers for h in logger.handlers}:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


MAX_YAML_BYTES = 1 << 20  # search spaces and configs are a few kB
MAX_YAML_NODES = 100_000  # after aliases are expanded; the shipped files have a few hundred


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses documents whose aliases expand past MAX_YAML_NODES nodes, or refer to themselves.

    Aliases are shared, not copied, while loading, so a "billion laughs" file loads in microseconds;
    it is whoever walks the result (str(), validation, MLflow params) that expands it to gigabytes.
    """

    def compose_document(self):
        node = super().compose_document()
        _expanded_nodes(node)
        return node

    def construct_mapping(self, node, deep=False):
        """A key given twice in one mapping is an error (PyYAML keeps the last silently); merged keys (<<) may be overridden."""
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                key = (key_node.tag, key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
                if key is None or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key_node.value!r} appears twice in one mapping", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_nodes(root: yaml.Node) -> int:
    """The number of nodes of ``root`` with every alias expanded; ValueError past MAX_YAML_NODES or on a cycle."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = [] if isinstance(node, yaml.ScalarNode) else node.value
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in children for part in pair]
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_YAML_NODES:
                raise ValueError(f"its aliases expand to more than {MAX_YAML_NODES} values")
            continue
        if id(node) in open_nodes:
            raise ValueError("an alias refers to a value that contains it")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def parse_yaml(text: str, where: str, what: str) -> Any:
    """Parse YAML ``text`` safely and within bounds; any problem is a UsageError naming ``where`` and ``what`` was expected."""
    if len(text) > MAX_YAML_BYTES:
        raise UsageError(f"{where}: {len(text)} characters; expected {what}, at most {MAX_YAML_BYTES} characters")
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UsageError(f"{where}{at}: YAML syntax error ({problem}); expected {what}") from None
    except ValueError as error:
        raise UsageError(f"{where}: refused: {error}; expected {what}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply; expected {what}") from None


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """Parse a YAML file (see ``parse_yaml``); any problem is a UsageError naming the file."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{file}: file not found; expected {what}")
    try:
        if file.stat().st_size > MAX_YAML_BYTES:
            raise UsageError(f"{file}: {file.stat().st_size} bytes; expected {what}, at most {MAX_YAML_BYTES} bytes")
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{file}: unreadable ({error}); expected {what}") from None
    return parse_yaml(text, str(file), what)


def write_yaml(path: str | os.PathLike, data: Any) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def given_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> frozenset[str]:
    """The flags the command line sets itself, defaults aside (``--resume`` takes the others from the study)."""
    unset = object()
    probe = argparse.Namespace(**{dest: unset for dest in vars(parser.parse_args([]))})
    return frozenset(dest for dest, value in vars(parser.parse_args(argv, probe)).items() if value is not unset)

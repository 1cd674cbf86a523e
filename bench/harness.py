"""What every benchmark records beside its figures, and how it says whether its bound held.

A benchmark runs from the repository root as ``python -m bench.NAME``. It keeps the machine it ran on, the commit
of the code it measured and the load average beside its rows (figures of a shared machine compare only under the
same load), appends one JSON row per run to a ``.jsonl`` or writes one JSON, writes a Markdown table, and ends by
printing whether its acceptance bound held: its exit status is 1 when it did not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    """The CPU model, its cores, the platform and the Python of this machine."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor())
    return {"cpu": cpu or platform.machine(), "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def machine_line() -> str:
    """:func:`machine` in one line."""
    m = machine()
    return f"{m['cores']} CPUs ({m['cpu']}), {m['platform']}, Python {m['python']}"


def load() -> list[float]:
    """The 1-, 5- and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_state() -> dict[str, Any]:
    """The load average and the five busiest processes, before a run: what else the machine was doing."""
    top = subprocess.run(["ps", "-eo", "pcpu,nice,args", "--sort=-pcpu"], capture_output=True, text=True).stdout.splitlines()[1:6]
    return {"loadavg_before": os.getloadavg(), "top_processes_before": [line.strip()[:160] for line in top]}


def commit(checkout: Path = ROOT) -> str:
    """The short commit of ``checkout``, with ``+`` when its tracked files have changes."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    return head + ("+" if changed else "")


def now() -> str:
    """The time in UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command(name: str, argv: Sequence[str]) -> str:
    """The command line that ran benchmark ``name`` with ``argv``, as a reader types it again."""
    return f"python -m bench.{name} {shlex.join(argv)}".rstrip()


def append_row(path: str | Path, row: dict[str, Any]) -> None:
    """One run's row appended to a ``.jsonl`` file (its folder made)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("a") as out:
        out.write(json.dumps(row, default=str) + "\n")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a ``.jsonl`` file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write(path: str | Path, text: str) -> Path:
    """``text`` written to ``path``, its folder made."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return Path(path)


def cell(value: Any, spec: str = ".1f", unit: str = "") -> str:
    """A table cell: ``value`` in ``spec`` with ``unit``; "-" for a figure not measured (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{unit}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines: the header, its rule, then one line per row (cells formatted already, or str())."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def bound(held: bool | None, statement: str) -> int:
    """Print whether the acceptance bound held (None: this run measured nothing it applies to); the exit status."""
    word = {True: "held", False: "NOT held", None: "not measured"}[held]
    print(f"bound {word}: {statement}", flush=True)
    return 1 if held is False else 0


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The command line of benchmark ``name``: its docstring's first paragraph as the description, the rest as is."""
    first, _, rest = doc.partition("\n\n")
    raw = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(prog=f"python -m bench.{name}", description=first, epilog=rest, formatter_class=raw)

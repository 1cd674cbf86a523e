"""CPU-seconds of each test, counting every process it starts (drivers, local Rays, trial workers, servers).

A pytest plugin: each test process (each pytest-xdist worker) moves itself into a cgroup of its own (a child of
the one it was in), which the processes it starts inherit, and reads the cgroup's CPU time before and after each
test (setup and teardown included, so a module's shared study counts in its first test). Needs root and a cgroup
hierarchy with CPU accounting (cgroup v2's cpu.stat, or v1's cpuacct). Wall seconds say little on a loaded
machine; CPU-seconds say what a test costs whatever runs beside it.

  python -m pytest -p tools.cpu_per_test                    # writes cpu_per_test.jsonl ($CPU_PER_TEST_OUT)
  python -m tools.cpu_per_test cpu_per_test.jsonl --top 30  # the files and tests that cost most, as Markdown

A process a test leaves running is counted in the later tests of its worker.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

# where a hierarchy may be mounted, its controller in /proc/self/cgroup ("" for v2), and how to read a group's CPU
# seconds from the group's folder
V2 = ("cpu.stat", lambda text: int(text.split("usage_usec")[1].split()[0]) * 1e-6)
HIERARCHIES = (
    (Path("/sys/fs/cgroup"), "", *V2),  # cgroup v2 alone
    (Path("/sys/fs/cgroup/unified"), "", *V2),  # v2 beside v1
    (Path("/sys/fs/cgroup/cpuacct"), "cpuacct", "cpuacct.usage", lambda text: int(text) * 1e-9),  # v1
)


class Group:
    """A cgroup of this process (and of what it starts from now on)."""

    def __init__(self, name: str) -> None:
        for mount, controller, file, parse in HIERARCHIES:
            if not (mount / file).is_file():
                continue
            try:
                home = mount / own_cgroup(controller).lstrip("/")
                path = home / name  # inside this process's own group, whose CPU time then includes it
                path.mkdir(exist_ok=True)
                (path / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                continue
            self.home, self.path, self.file, self.parse = home, path, file, parse
            return
        raise pytest.UsageError(
            "-p tools.cpu_per_test: no cgroup with CPU accounting this process may join; expected root and cpu.stat (v2) or cpuacct (v1)"
        )

    def seconds(self) -> float:
        return self.parse((self.path / self.file).read_text())

    def leave(self) -> None:
        """Back to the cgroup this process was in; the group is removed once nothing is left in it."""
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        try:
            self.path.rmdir()
        except OSError:  # a process the tests left running is still in it
            pass


def own_cgroup(controller: str) -> str:
    """This process's cgroup in the v1 hierarchy of ``controller``, or in the v2 one (``""``): /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mine = controller in controllers.split(",") if controller else controllers == ""
        if mine:
            return path
    raise OSError(f"/proc/self/cgroup: no {controller or 'v2'} hierarchy")


_group: Group | None = None


def pytest_configure(config) -> None:
    global _group
    if os.environ.get("PYTEST_XDIST_WORKER") is None and config.getoption("numprocesses", None):
        return  # the xdist controller runs no tests
    _group = Group(f"cpu_per_test_{os.getpid()}")


def pytest_unconfigure(config) -> None:
    if _group is not None:
        _group.leave()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _group is None:
        yield
        return
    cpu, wall = _group.seconds(), time.monotonic()
    yield
    row = {"test": item.nodeid, "cpu_s": round(_group.seconds() - cpu, 2), "wall_s": round(time.monotonic() - wall, 2)}
    with Path(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.jsonl")).open("a") as out:
        out.write(json.dumps(row) + "\n")


def summarize(rows: list[dict], top: int) -> list[str]:
    """Markdown: the total, each file's CPU and wall seconds (most CPU first), then the ``top`` tests."""
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        file = files[row["test"].split("::")[0]]
        file[0] += row["cpu_s"]
        file[1] += row["wall_s"]
    lines = [f"{len(rows)} tests, {sum(r['cpu_s'] for r in rows):,.0f} CPU-s, {sum(r['wall_s'] for r in rows):,.0f} s of wall summed", ""]
    lines += ["| file | CPU-s | wall s |", "|---|---|---|"]
    lines += [f"| {name} | {cpu:,.1f} | {wall:,.1f} |" for name, (cpu, wall) in sorted(files.items(), key=lambda f: -f[1][0])[:top]]
    lines += ["", "| test | CPU-s | wall s |", "|---|---|---|"]
    lines += [f"| {r['test']} | {r['cpu_s']:,.1f} | {r['wall_s']:,.1f} |" for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.cpu_per_test", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", type=Path, help="the plugin's output (cpu_per_test.jsonl)")
    parser.add_argument("--top", type=int, default=25, help="how many files and tests to list (default 25)")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    print("\n".join(summarize(rows, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

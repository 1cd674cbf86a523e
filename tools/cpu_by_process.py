"""CPU-seconds of a command by kind of process: Ray's daemons, trial workers, drivers, pytest's workers, servers.

Runs the command in a cgroup of its own (as root, where cgroup v2 is mounted) and samples the processes in it, the
command's and all they start, for their CPU time (user + system, from /proc) twice a second until the command ends;
the cgroup's own count is the command's whole CPU time, which the samples are checked against. Without such a
cgroup it samples every process on the machine, the command's or not, and the machine's busy CPU-seconds over the
same time (/proc/stat) are the check; on a shared machine the others' processes are then counted too. A process is
counted from its first sample (what it had used before the command started is subtracted) to its last, so one that
lives under half a second, or the last half second of one, is missed. A Ray trial worker starts as Ray's
``setup_worker.py``, which ``exec``s the worker in the same process, so its imports of Ray and of the trainable
count under "ray workers". Linux only.

  python -m tools.cpu_by_process --out cpu.json -- python -m pytest -q          # the test suite
  python -m tools.cpu_by_process -- python -m study.launch --space smoke         # one study
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
# the first pattern (a regular expression) found in a process's command line names its kind
KINDS = (
    (r"setup_worker\.py", "ray workers"),
    (r"default_worker\.py", "ray workers"),
    ("^ray::", "ray workers"),
    ("gcs_server", "ray daemons"),
    ("raylet", "ray daemons"),
    ("dashboard", "ray daemons"),
    ("runtime_env", "ray daemons"),
    (r"log_monitor\.py", "ray daemons"),
    ("autoscaler", "ray daemons"),
    (r"-m study\.", "study drivers (python -m study.*)"),
    ("mlflow", "mlflow servers"),
    ("gunicorn", "mlflow servers"),
    ("uvicorn", "mlflow servers"),
    ("moto", "S3 stand-in (moto)"),
    ("chrom", "chromium"),
    ("sshd", "sshd"),
    ("/bin/ray ", "ray cli"),
    ("pytest", "pytest"),
    ("execnet", "pytest"),
    (r"python[0-9.]* (-u )?-c ", "python -c (pytest-xdist workers, test helpers)"),
)


def kind(command: str) -> str:
    for pattern, name in KINDS:
        if re.search(pattern, command):
            return name
    return "other"


def busy_seconds() -> float:
    """The machine's busy CPU-seconds since boot (all of /proc/stat's first line but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK


def processes() -> dict[tuple[int, int], float]:
    """(pid, start time in ticks) -> CPU-seconds used, for every process now running."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended
                continue
            found[int(entry), int(fields[19])] = (int(fields[11]) + int(fields[12])) / TICK
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Group:
    """A cgroup (v2) of its own for the command, inside this process's: its members, and the CPU time of all that
    ever ran in it (cpu.stat). ``make()`` returns None where there is none to make (not root, no cgroup v2)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls) -> Group | None:
        for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):  # v2 alone, or beside v1
            if not (mount / "cgroup.controllers").is_file():
                continue
            own = next((line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::")), None)
            path = mount / (own or "/").lstrip("/") / f"cpu_by_process_{os.getpid()}"
            try:
                path.mkdir()
            except OSError:
                continue
            return cls(path)
        return None

    def join(self) -> None:
        """Move the calling process in (a child's ``preexec_fn``: what it starts is in the group too)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def members(self) -> set[int]:
        found = set()
        for procs in self.path.rglob("cgroup.procs"):  # with the groups made inside it (tools/cpu_per_test.py)
            try:
                found.update(int(pid) for pid in procs.read_text().split())
            except OSError:  # a group removed meanwhile
                continue
        return found

    def cpu_seconds(self) -> float:
        return int((self.path / "cpu.stat").read_text().split("usage_usec")[1].split()[0]) * 1e-6

    def remove(self) -> None:
        """Removes the group and the groups made inside it (tools/cpu_per_test.py leaves its own when a process a test
        left was still in it), each once it is empty."""
        for folder, _, _ in os.walk(self.path, topdown=False):
            try:
                os.rmdir(folder)
            except OSError:  # a process the command left running is still in it
                pass


def sample(argv: list[str], every_s: float = 0.5, group: Group | None = None) -> dict:
    """Samples the command's processes when ``group`` is given (Group.make()), else every process on the machine."""
    before = processes()
    busy0, started = busy_seconds(), time.time()
    child = subprocess.Popen(argv, preexec_fn=group.join if group else None)
    seen: dict[tuple[int, int], list] = {}  # -> [command line, CPU-seconds]
    while child.poll() is None:
        members = group.members() if group else None
        for key, seconds in processes().items():
            if key[0] == os.getpid() or (members is not None and key[0] not in members):
                continue
            if key not in seen:
                seen[key] = [command_line(key[0]), 0.0]
            seen[key][1] = seconds - before.get(key, 0.0)
        time.sleep(every_s)
    by_kind, count = Counter(), Counter()
    for command, seconds in seen.values():
        if seconds > 0:
            name = kind(command)
            by_kind[name] += seconds
            count[name] += 1
    return {
        "command": argv,
        "returncode": child.returncode,
        "wall_s": round(time.time() - started, 1),
        # what the samples are checked against: the command's whole CPU time (its cgroup), else the machine's
        "scope": "the command's processes (a cgroup)" if group else "every process on the machine",
        "busy_cpu_s": round(group.cpu_seconds() if group else busy_seconds() - busy0, 1),
        "sampled_cpu_s": round(sum(by_kind.values()), 1),
        "kinds": {name: {"cpu_s": round(s, 1), "processes": count[name]} for name, s in by_kind.most_common()},
        # every process that used at least 0.05 CPU-s, the costliest first: [CPU-s, command line (its first 300 characters)]
        "processes": sorted(([round(s, 2), command[:300]] for command, s in seen.values() if s >= 0.05), reverse=True),
    }


def markdown(result: dict) -> str:
    lines = ["| kind | CPU-s | share | processes |", "|---|---|---|---|"]
    total = result["sampled_cpu_s"] or 1.0
    for name, row in result["kinds"].items():
        lines.append(f"| {name} | {row['cpu_s']:,.1f} | {row['cpu_s'] / total:.0%} | {row['processes']} |")
    whose = "the command's" if result.get("scope", "").startswith("the command") else "the machine's busy"
    covered = f"sampled {result['sampled_cpu_s']:,.1f} of {whose} {result['busy_cpu_s']:,.1f} CPU-s"
    lines.append(f"\n{covered} in {result['wall_s']:,.1f} s")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cpu_by_process", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the result as JSON here too")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("expected a command after --")
    group = Group.make()
    try:
        result = sample(argv, group=group)
    finally:
        if group:
            group.remove()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return result["returncode"]


if __name__ == "__main__":
    sys.exit(main())

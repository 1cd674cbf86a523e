"""tools/cpu_per_test.py: each test's CPU-seconds, the processes it starts included."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tools.cpu_per_test import summarize

BURN = """
import json, os, resource, subprocess, sys

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "x = 0\\nfor i in range(20_000_000): x += i"], check=True)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.environ["CHILD_CPU_OUT"], "w") as out:
        json.dump(used.ru_utime + used.ru_stime, out)

def test_idle():
    pass
"""


def test_summarize_sums_per_file_and_lists_the_costliest_first():
    rows = [
        {"test": "tests/test_a.py::test_1", "cpu_s": 1.5, "wall_s": 2.0},
        {"test": "tests/test_b.py::test_1", "cpu_s": 4.0, "wall_s": 9.0},
        {"test": "tests/test_a.py::test_2", "cpu_s": 3.0, "wall_s": 1.0},
    ]
    lines = summarize(rows, top=2)
    assert lines[0] == "3 tests, 8 CPU-s, 12 s of wall summed"
    files = lines[lines.index("| file | CPU-s | wall s |") + 2 :][:2]
    assert files == ["| tests/test_a.py | 4.5 | 3.0 |", "| tests/test_b.py | 4.0 | 9.0 |"]
    assert lines[-2:] == ["| tests/test_b.py::test_1 | 4.0 | 9.0 |", "| tests/test_a.py::test_2 | 3.0 | 1.0 |"]


def test_a_tests_row_counts_the_cpu_of_the_processes_it_started(tmp_path):
    probe = "from tools.cpu_per_test import Group; Group('cpu_per_test_probe').leave()"  # in a process of its own
    joined = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    if "UsageError" in joined.stderr:
        pytest.skip(f"no cgroup to join here: {joined.stderr.strip().splitlines()[-1]}")
    assert joined.returncode == 0, joined.stderr[-2000:]
    (tmp_path / "test_burn.py").write_text(BURN)
    out = tmp_path / "rows.jsonl"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "tools.cpu_per_test"]
    command += ["-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path / "test_burn.py")]  # not this project's addopts
    env = {"CPU_PER_TEST_OUT": str(out), "CHILD_CPU_OUT": str(tmp_path / "child.json"), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {row["test"].split("::")[1]: row for row in map(json.loads, out.read_text().splitlines())}
    child = json.loads((tmp_path / "child.json").read_text())  # the child's own CPU, from the kernel's rusage
    assert rows["test_burns_in_a_child"]["cpu_s"] >= child * 0.95
    assert rows["test_idle"]["cpu_s"] < child

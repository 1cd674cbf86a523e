"""tools/cpu_by_process.py: a command's CPU-seconds by kind of process."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from tests.conftest import ROOT
from tools.cpu_by_process import kind, markdown

# a child that burns at least 1.5 CPU-seconds of its own (so the half-second samples see it); the sampler must find
# it, by the marker in its command line, among whatever else the machine runs, with what the kernel counted for it
CHILD = "import time  # cpu-by-process-test\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"


def test_kinds_follow_the_command_lines_of_ray_study_and_pytest_processes():
    venv = "/v/.venv/bin/python"
    assert kind(f"{venv} /v/site-packages/ray/_private/workers/setup_worker.py /v/default_worker.py --node-ip-address=x") == "ray workers"
    assert kind("ray::ImplicitFunc.train") == "ray workers"
    assert kind("/v/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/x") == "ray daemons"
    assert kind(f"{venv} -u /v/site-packages/ray/dashboard/agent.py --node-id=1") == "ray daemons"
    assert kind(f"{venv} -m study.launch --space smoke") == "study drivers (python -m study.*)"
    assert kind(f"{venv} -m pytest -q") == "pytest"
    assert kind("/usr/bin/bash -c true") == "other"


def test_a_childs_cpu_seconds_are_counted_under_its_kind(tmp_path):
    out = tmp_path / "cpu.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    argv = [sys.executable, "-m", "tools.cpu_by_process", "--out", str(out), "--", sys.executable, "-c", CHILD]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.read_text())
    mine = [cpu for cpu, command in result["processes"] if "cpu-by-process-test" in command]
    assert len(mine) == 1 and mine[0] >= 1.0  # at most the last half second unseen
    both = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the sampler and its child
    assert mine[0] <= both + 0.05
    assert result["kinds"]["python -c (pytest-xdist workers, test helpers)"]["cpu_s"] >= mine[0] - 0.05  # under its kind
    assert markdown(result) in done.stdout

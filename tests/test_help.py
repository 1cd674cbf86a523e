"""Every command answers ``--help`` and a bad flag before it loads a heavy library: each command line parses its flags
first and imports what runs the command after them (study/launch/run.py, study/final/run.py, inside report's and
sync's main). Checked in a fresh interpreter per command: which libraries a ``--help`` and a refused flag loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("torch", "torchvision", "ray", "mlflow", "optuna", "sklearn", "matplotlib")
COMMANDS = ("study.launch", "study.final", "study.report", "study.sync", "study.relocate", "study.serve")

PROBE = """
import contextlib, io, json, runpy, sys
command, argv, heavy = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.argv = [command, *argv]
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        runpy.run_module(command, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(), "loaded": [m for m in heavy if m in sys.modules]}))
"""


def probe(command: str, argv: list[str]) -> dict:
    """``python -m command argv`` in a fresh interpreter: its exit status, its output and the HEAVY libraries it loaded."""
    args = [sys.executable, "-c", PROBE, command, json.dumps(argv), json.dumps(HEAVY)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", COMMANDS)
def test_help_loads_no_heavy_library(command):
    result = probe(command, ["--help"])
    assert result["code"] == 0 and f"python -m {command}" in result["out"]
    assert result["loaded"] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_flag_is_refused_before_a_heavy_library_loads(command):
    result = probe(command, ["--study", "s", "--no-such-flag"])
    assert result["code"] == 2 and "--no-such-flag" in result["err"]
    assert result["loaded"] == []


def test_the_probe_sees_a_library_a_command_loads():
    """The check itself: a module that imports torch at its top is caught."""
    result = probe("trainables.core.engine", [])
    assert "torch" in result["loaded"]

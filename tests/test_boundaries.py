"""Import boundaries: which heavy libraries each module may load, each checked in a fresh interpreter.

The rule each module states in its docstring: the drivers' modules (study.*) never import torch, torchvision,
faiss or scikit-learn (a driver reads configs, spaces and records; the trials' workers train); the modules every
command reads (the study's record, the recorder, the spool, a trial's rules, the YAML inputs) import no Ray, so
study.sync, study.report and the recorder's writer start without it; the study's record, the inputs and a
trial's rules import no MLflow either; trainables.core imports none of Ray, Optuna or MLflow; the surrogate
trainable imports no torch, so a rehearsal fits 64 workers on one machine. tests/test_final.py checks the
drivers' entry points and the trial worker the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TORCH = ("torch", "torchvision", "faiss", "sklearn")
RAY = ("ray",)
MLFLOW = ("mlflow",)
FRAMEWORKS = ("ray", "optuna", "mlflow")

BOUNDARIES = [
    ("study.record", TORCH + RAY + MLFLOW),
    ("study.inputs", TORCH + RAY + MLFLOW),
    ("study.trial", TORCH + RAY + MLFLOW),
    ("study.selection", TORCH + RAY + MLFLOW),
    ("study.lines", TORCH + RAY + MLFLOW),
    ("study.journal", TORCH + RAY + MLFLOW),
    ("study.recorder", TORCH + RAY),
    ("study.records", TORCH + RAY),
    ("study.parent", TORCH + RAY),
    ("study.sync", TORCH + RAY),
    ("study.console", TORCH + RAY),
    ("study.launch", TORCH),
    ("study.callbacks", TORCH),
    ("study.search", TORCH),
    ("trainables.surrogate", TORCH),
    ("trainables.core.config", TORCH + FRAMEWORKS),
    ("trainables.core.schedule", TORCH + FRAMEWORKS),
    ("trainables.core.budgets", TORCH + FRAMEWORKS),
    ("trainables.core.data", TORCH + FRAMEWORKS),
    ("trainables.core.engine", FRAMEWORKS),
]


def loaded(module: str, forbidden: tuple[str, ...]) -> list[str]:
    """Which of ``forbidden`` a fresh interpreter has loaded after ``import module``."""
    script = f"import json, sys, {module}\nprint(json.dumps([m for m in {forbidden!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("module", "forbidden"), BOUNDARIES, ids=[m for m, _ in BOUNDARIES])
def test_a_module_imports_none_of_what_its_boundary_forbids(module, forbidden):
    assert loaded(module, forbidden) == []


def test_the_boundary_check_sees_an_import():
    """The check itself: a module that does import torch is caught."""
    assert loaded("trainables.core.engine", ("torch",)) == ["torch"]

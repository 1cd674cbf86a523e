"""Import boundaries: which heavy libraries each module may load, each checked in a fresh interpreter.

The rule each module states in its docstring: the drivers' modules (study.*) never import torch, torchvision,
faiss or scikit-learn (a driver reads configs, spaces and records; the trials' workers train); the modules every
command reads (the study's record, the recorder, the spool, a trial's rules, the YAML inputs) import no Ray, so
study.sync, study.report and the recorder's writer start without it; the study's record, the inputs and a
trial's rules import no MLflow either; trainables.core imports none of Ray, Optuna or MLflow; the surrogate
trainable imports no torch, so a rehearsal fits 64 workers on one machine; the engine imports no torchvision at import
(trainables.core.transforms and models load it where it is used; characters train without it). tests/test_final.py checks the
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
    ("study.records.study_record", TORCH + RAY + MLFLOW),
    ("study.inputs", TORCH + RAY + MLFLOW),
    ("study.search.trial", TORCH + RAY + MLFLOW),
    ("study.search.race", TORCH + RAY + MLFLOW),
    ("study.lines", TORCH + RAY + MLFLOW),
    ("study.search.journal", TORCH + RAY + MLFLOW),
    ("study.records.store", TORCH + RAY + MLFLOW),
    ("study.records.trials", TORCH + RAY),
    ("study.records.ending", TORCH + RAY),
    ("study.records.parent", TORCH + RAY),
    ("study.records.curves", TORCH + RAY),
    ("study.sync", TORCH + RAY),
    ("study.relocate", TORCH + RAY),
    ("study.serve.cli", TORCH + RAY + MLFLOW),
    ("study.serve.guard", TORCH + RAY + MLFLOW),
    ("study.console", TORCH + RAY),
    ("study.report.cli", TORCH + RAY),
    ("study.launch.cli", TORCH),
    ("study.launch.callbacks", TORCH),
    ("study.ray_session", TORCH),
    ("study.search.searcher", TORCH),
    ("trainables.surrogate", TORCH),
    ("trainables.core.config", TORCH + FRAMEWORKS),
    ("trainables.core.schedule", TORCH + FRAMEWORKS),
    ("trainables.core.budgets", TORCH + FRAMEWORKS),
    ("trainables.core.data", TORCH + FRAMEWORKS),
    ("trainables.core.engine", FRAMEWORKS + ("torchvision",)),  # loaded where an image-by-image path or a pretrained backbone runs
]


# Loaded, where a boundary allows them and what they import, before the modules under test are imported: the libraries
# whose own import takes seconds. The check fails if a preloaded one loads something forbidden, or starts a thread
# (the check forks after them).
PRELOAD = {"torch": (), "torchvision": ("torch",), "optuna": (), "mlflow": (), "ray.tune": ("ray",)}

CHECK = """
import json, os, sys, threading
modules, forbidden, preload = json.loads(sys.argv[1])
for name in preload:
    __import__(name)
early = [m for m in forbidden if m in sys.modules] + [t.name for t in threading.enumerate()][1:]
if early:
    print(json.dumps({"preloaded": early}))
    sys.exit(0)
found = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child imports one module and reports what it loaded
        os.close(read)
        try:
            __import__(module)
            hits = [m for m in forbidden if m in sys.modules]
        except BaseException as error:
            hits = ["import failed: " + repr(error)]
        os.write(write, json.dumps(hits).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        found[module] = json.loads(pipe.read())
    os.waitpid(pid, 0)
print(json.dumps(found))
"""


def loaded(modules: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """Which of ``forbidden`` each module loads: a fresh interpreter loads the PRELOAD libraries ``forbidden`` allows,
    then imports each module in a child of its own (a fork, so one module's imports never hide another's)."""
    preload = [name for name, needs in PRELOAD.items() if not {name, *needs} & set(forbidden)]
    argv = [sys.executable, "-c", CHECK, json.dumps([modules, forbidden, preload])]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert "preloaded" not in found, f"importing {preload} alone loads or starts {found.get('preloaded')}: take it out of PRELOAD"
    return found


@pytest.fixture(scope="module")
def boundaries_loaded() -> dict[str, list[str]]:
    """Each module of BOUNDARIES: the forbidden libraries it loads (one interpreter per distinct boundary)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for module, forbidden in BOUNDARIES:
        groups.setdefault(forbidden, []).append(module)
    return {module: hits for forbidden, modules in groups.items() for module, hits in loaded(modules, forbidden).items()}


@pytest.mark.parametrize(("module", "forbidden"), BOUNDARIES, ids=[m for m, _ in BOUNDARIES])
def test_a_module_imports_none_of_what_its_boundary_forbids(boundaries_loaded, module, forbidden):
    assert boundaries_loaded[module] == []


def test_the_boundary_check_sees_an_import():
    """The check itself: a module that does import torch is caught, and so is one whose import fails."""
    found = loaded(["trainables.core.engine", "study.no_such_module"], ("torch", *FRAMEWORKS))
    assert found["trainables.core.engine"] == ["torch"]
    assert found["study.no_such_module"][0].startswith("import failed: ModuleNotFoundError"), found

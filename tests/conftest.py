"""Shared fixtures: the real Omniglot data root when it is beside the checkout, fresh run folders."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The suite runs three test files at a time on a 2-core machine (pytest-xdist, pyproject's addopts), as study.launch
# runs one trial per CPU with one thread each: so torch, faiss and numpy's BLAS get one thread in the test processes and
# in the drivers and finals they start (set before any of them is imported). With a thread per core in each file, the
# files' threads preempt and spin-wait on each other: the five training-heavy files used 20 % more CPU and 12 % more time.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items) -> None:
    """The longest test files first (tests/file_seconds.json: each file's seconds in a measured run; a file it does not
    name counts 0): pytest-xdist gives each worker the next file when it is done with one (--dist loadfile), so the
    short files fill in at the end instead of a long one starting last while the other worker waits. A stable sort:
    a file's tests stay together and in their order. `python -m tools.suite_time --file-seconds` rewrites the file."""
    path = ROOT / "tests" / "file_seconds.json"
    seconds = json.loads(path.read_text()) if path.is_file() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0))


def omniglot_root() -> Path | None:
    """The data root holding omniglot/ ($DML_DATA_ROOT, else ../shared/data), or None."""
    for candidate in (os.environ.get("DML_DATA_ROOT"), ROOT.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "omniglot" / "images_background_small1.zip").is_file():
            return Path(candidate)
    return None


@pytest.fixture
def one_thread():
    """One torch thread for the test: a tiny CNN on an oversubscribed CPU is many times slower with several intra-op threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def store_template(tmp_path_factory) -> Path:
    """An MLflow sqlite store as MLflow creates it, before any experiment: made once per test process (its schema
    migrations take about 2 CPU-s, which every test's new store would pay again)."""
    import mlflow

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def runs(tmp_path, monkeypatch, store_template) -> Path:
    """A fresh runs folder (MLflow store, Optuna journal, Ray storage) for one test. Its MLflow store exists, empty, as
    a user's store does after its first study (tests/test_locks.py sets up new stores)."""
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copyfile(store_template, folder / "mlflow.db")
    monkeypatch.setenv("DML_RUNS_DIR", str(folder))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return folder


class Payload:
    """Unpickling this runs ``touch <target>``: a code-executing pickle."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def write_malicious_pickle(path: Path, target: Path, writer: str = "pickle.dump", key: str = "model", extra: dict | None = None) -> Path:
    """A file whose unpickling would create ``target``, written with torch.save or pickle.dump."""
    import pickle

    import torch

    payload = {**(extra or {}), key: Payload(str(target))}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(payload, fh)
    return path


def recorded_params(**values) -> dict[str, str]:
    """A study's parent-run params as study.launch records them (study.records.study_record.StudyRecord), with ``values`` changed;
    a value of None leaves its param out, as a study recorded before that param existed."""
    from study.records.study_record import StudyRecord

    record = StudyRecord(
        space="smoke", epochs=4, num_samples=4, scheduler="budget", grace_period=1, reduction_factor=4.0, sampler="tpe",
        seed=0, metric="val_recall_at_1", confirm_top=3, confirm_budget=0.25, max_concurrent=2, cpus_per_trial=1.0,
        gpus_per_trial=0.0, mode="max", budgets=(1, 4), stratify_by=None, reuse_actors=True, final_epochs=4,
        optuna_storage="journal:journal.log", storage_path="ray", fit_classes=8, val_folds=5, race_folds="trial", data_root=None,
        rehearse=None,
    )  # fmt: skip
    params = record.to_params()
    for key, value in values.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = str(value)
    return params


def wait_for(predicate, timeout: float, what: str, process=None, every_s: float = 0.5) -> None:
    """Poll ``predicate()`` every ``every_s`` until it holds (an event, with a generous limit, never a timing): fails
    after ``timeout`` seconds, or as soon as ``process`` (a Popen, when given) has exited, with its error output. The
    suite's one polling loop: the test processes and the scripts they run on the test's hosts use it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            error = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"the process exited ({process.returncode}) before {what}: {error}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every_s)


def epochs_recorded(epochs_trained: int, tags: dict[str, str]) -> list[int]:
    """The steps a trial's MLflow run holds, each once: 1 to the epochs its last attempt trained, or on to the last
    epoch of an attempt cut short (a kill before a checkpoint) when the run's tag says so, right after them."""
    from study.records.trials import LOST_EPOCHS_TAG

    if LOST_EPOCHS_TAG not in tags:
        return list(range(1, epochs_trained + 1))
    first, last = (int(x) for x in tags[LOST_EPOCHS_TAG].split("-"))
    assert first == epochs_trained + 1 <= last, (epochs_trained, tags[LOST_EPOCHS_TAG])
    return list(range(1, last + 1))

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


# Each test file's tier. "default": README's `python -m pytest` runs it. "faults": `python -m pytest --all` (CI) runs
# it too: every test that kills, partitions or fills a disk, or starts a cluster of hosts, a server, a driver or a
# study (a local Ray with its trials) of its own, except the default tier's one end-to-end smoke study
# (tests/test_launch.py's budget_study). "mixed": the file's fault tests carry @pytest.mark.faults, the rest are in the
# default tier. tests/test_tiers.py checks that every test file is named here once and that each names one.
TIERS = {
    "default": (
        "test_artifacts.py", "test_boundaries.py", "test_budgets.py", "test_cache_checksums.py", "test_cadence.py",
        "test_checkpoint.py", "test_help.py", "test_input_ranges.py", "test_packing.py", "test_report_finals.py",
        "test_cluster_yaml.py", "test_config.py", "test_cpu_by_process.py", "test_cpu_per_test.py", "test_data.py",
        "test_dml.py", "test_docs.py", "test_engine.py", "test_final_seed.py", "test_final_space.py",
        "test_gpu_path_bench.py", "test_gpu_study_bench.py", "test_heap.py", "test_inputs.py", "test_ladder_records.py", "test_layout.py",
        "test_local_ray.py", "test_losses.py", "test_metrics.py", "test_models.py", "test_names.py", "test_naming.py",
        "test_one_shot.py", "test_optimizers.py", "test_pca.py", "test_photo_data.py", "test_precision.py",
        "test_progress.py", "test_ranges.py", "test_report_html.py", "test_report_scale.py", "test_resume_settings.py",
        "test_sampler.py", "test_sampler_choice.py", "test_schedule.py", "test_search.py", "test_selection.py",
        "test_spaces.py", "test_suite_order.py", "test_tiers.py", "test_tunestate.py", "test_utilization.py",
        "test_verdicts_bench.py",
    ),
    "faults": (
        "test_browser.py", "test_cluster_hosts.py", "test_data_root.py", "test_disk_full.py", "test_final_outage.py", "test_postgres.py",
        "test_rehearsal.py", "test_resume.py",
    ),
    "mixed": (
        "test_cache.py", "test_credentials.py", "test_final.py", "test_gpu_check.py", "test_interrupts.py", "test_journal.py",
        "test_launch.py", "test_presets.py", "test_locks.py", "test_records.py", "test_relocate.py", "test_reliability.py",
        "test_report.py", "test_serve_limits.py", "test_serving.py", "test_surrogate.py", "test_winner.py",
    ),
}  # fmt: skip
FAULT_FILES = frozenset(TIERS["faults"])
TIER_DESELECTED = pytest.StashKey[int]()  # how many fault tests a run left out


def pytest_addoption(parser) -> None:
    parser.addoption("--all", action="store_true", dest="all_tiers", help="run both tiers, the default one and the fault tests, as CI does")


def tier(item) -> str:
    """The tier of a test: "faults" or "default"."""
    return "faults" if item.path.name in FAULT_FILES or item.get_closest_marker("faults") else "default"


def pytest_itemcollected(item) -> None:
    """The fault tier's tests of a "faults" file get the marker too (before ``-m`` reads it)."""
    if tier(item) == "faults":
        item.add_marker(pytest.mark.faults)
        item.user_properties.append(("tier", "faults"))  # for tools.suite_time --file-seconds, from the junit report


def named_files(config) -> set[Path]:
    """The test files the command line names, alone or with a test (``tests/test_x.py``, ``tests/test_x.py::test_y``);
    a folder (testpaths' ``tests``) names none."""
    found = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        if path.is_file():
            found.add(path.resolve())
    return found


@pytest.hookimpl(trylast=True)  # after -m and -k: a run of fault tests alone is told apart from one of no tests
def pytest_collection_modifyitems(config, items) -> None:
    """The fault tier is deselected unless --all is given, ``-m`` names it (``-m faults``: that tier alone) or the test
    file is named on the command line (``pytest tests/test_resume.py`` runs it); then the longest files first."""
    if not config.getoption("all_tiers") and "faults" not in (config.getoption("markexpr") or ""):
        named = named_files(config)
        deselected = [item for item in items if tier(item) == "faults" and item.path.resolve() not in named]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            left = set(map(id, deselected))
            items[:] = [item for item in items if id(item) not in left]
            config.stash[TIER_DESELECTED] = len(deselected)
            if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller reports the count
                config.workeroutput["tier_deselected"] = len(deselected)
    longest_files_first(items)


def longest_files_first(items, seconds: dict[str, dict[str, float]] | None = None) -> None:
    """The longest test files first (tests/file_seconds.json: each file's seconds in a measured run of both tiers, by
    tier; a file it does not name counts 0): pytest-xdist gives each worker the next file when it is done with one
    (--dist loadfile), so the short files fill in at the end instead of a long one starting last while the other
    worker waits. A file counts the seconds of the tiers of its tests that run. A stable sort: a file's tests stay
    together and in their order. `python -m tools.suite_time --file-seconds` rewrites the file."""
    if seconds is None:
        path = ROOT / "tests" / "file_seconds.json"
        seconds = json.loads(path.read_text()) if path.is_file() else {}
    tiers: dict[str, set[str]] = {}
    for item in items:
        tiers.setdefault(item.nodeid.split("::")[0], set()).add(tier(item))
    total = {file: sum(seconds.get(t, {}).get(file, 0) for t in found) for file, found in tiers.items()}
    items.sort(key=lambda item: -total[item.nodeid.split("::")[0]])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: how many fault tests its workers left out (each collects them all)."""
    count = getattr(node, "workeroutput", {}).get("tier_deselected")
    if count:
        node.config.stash[TIER_DESELECTED] = count


def pytest_sessionfinish(session, exitstatus) -> None:
    """A run whose selected tests are all in the fault tier, left out, is no error (not pytest's 5, "no tests ran"):
    the summary says how to run them."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and session.config.stash.get(TIER_DESELECTED, 0):
        session.exitstatus = pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    count = config.stash.get(TIER_DESELECTED, 0)
    if count:
        tests = "test" if count == 1 else "tests"
        terminalreporter.write_line(f"{count} {tests} of the fault tier left out: `python -m pytest --all` runs both tiers")


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


def assert_epochs_recorded(steps: list[int], attrs: dict, tags: dict[str, str], what: object = "") -> None:
    """A trial's MLflow run holds ``steps`` (of its train_loss), each once: 1 to the epoch of its schedule its last
    attempt reached (Optuna's ``epochs``; ``epochs_trained`` where a study recorded none), or on to the last epoch of an
    attempt cut short (a kill before a checkpoint) when the run's tag says so (in epochs trained, right after them)."""
    from study.records.trials import LOST_EPOCHS_TAG

    trained = int(attrs["epochs_trained"])
    epochs = int(attrs.get("epochs", trained))
    if LOST_EPOCHS_TAG not in tags:
        assert steps == list(range(1, epochs + 1)), (what, steps, attrs)
        return
    first, last = (int(x) for x in tags[LOST_EPOCHS_TAG].split("-"))
    assert first == trained + 1 <= last, (what, trained, tags[LOST_EPOCHS_TAG])
    if epochs == trained:  # every epoch trained once: the steps are the epochs trained
        assert steps == list(range(1, last + 1)), (what, steps, tags[LOST_EPOCHS_TAG])
    else:  # on a ladder the lost epochs may be a retrained tail, at steps the run holds already
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= epochs, (what, steps, attrs)

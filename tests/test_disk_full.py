"""A disk that fills up mid-study, on a real small filesystem the test mounts (tmpfs): the driver ends with one line
naming the full disk and the file, says it is resumable only when it is, and once space is freed one ``--resume``
finishes the study with every trial recorded once.

The tests run as root (they mount); where mounting is refused they are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from study import inputs
from study.launch import tunestate
from tests.conftest import wait_for
from tests.test_rehearsal import assert_recorded_once
from tests.test_resume import epochs_logged, run_driver, start_driver
from trainables import surrogate

STUDY = ["--rehearse", "0.3", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "4", "--epochs", "6", "--confirm-budget", "0"]
SIZE = "24m"  # the MLflow store (about 1.2 MB), the launch's 1 MiB probe of the storage path, a study's files (under 1 MB)


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = SIZE) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block, unmounted after it (lazily when a process still holds it)."""
    path.mkdir(parents=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)]
    try:
        mounted = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:  # no mount command
        mounted = subprocess.CompletedProcess(command, 127, "", "mount: command not found")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the disk-full tests need root and mount")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> Path:
    """Writes a filler file in ``folder`` until the filesystem refuses (ENOSPC); returns it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        chunk = b"\0" * (1 << 16)
        while True:
            os.write(fd, chunk)
    except OSError as error:
        assert error.errno == errno.ENOSPC, error
    finally:
        os.close(fd)
    return filler


def test_a_full_filesystem_is_told_apart_and_named(tmp_path):
    """The watch of the study's folders (study.launch.tunestate.check_space) and the driver's one line for it, on a real
    full filesystem: the OSError is found inside the TuneError Ray Tune raises for an error in a callback."""
    with small_filesystem(tmp_path / "small", size="2m") as small:
        (small / "ray").mkdir()
        tunestate.check_space([str(small)])  # 2 MiB free: not full
        fill(small)
        with pytest.raises(tunestate.DiskFull) as full:
            tunestate.check_space([str(tmp_path), str(small / "ray")])
        try:
            try:
                raise full.value
            except OSError:
                raise RuntimeError("TuneError: Traceback ...") from None  # as Tune raises it: the cause only as context
        except RuntimeError as wrapped:
            found = inputs.disk_error(wrapped)
        assert found is full.value
        line = inputs.disk_error_line(found, [str(tmp_path)])
        assert line == f"{small / 'ray'}: No space left on device (0 bytes free on its filesystem)"
        assert inputs.disk_error(ValueError("x")) is None


def study_env(runs: Path) -> dict[str, str]:
    env = {**os.environ, "DML_RUNS_DIR": str(runs)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def second_epoch(runs: Path, name: str) -> bool:
    """A trial of the study has logged 2 epochs in MLflow (mid-study)."""
    return any(e >= 2 for e in epochs_logged(runs, name))


def journal_made(runs: Path, name: str) -> bool:
    """The study's Optuna journal exists: its records are being created, Tune has not started (before the first trial)."""
    return (runs / "optuna" / "journal.log").exists()


def run_until_the_disk_fills(argv: list[str], env: dict, runs: Path, name: str, full: Path, output: Path, moment=second_epoch):
    """Starts the study, fills ``full`` once ``moment(runs, name)`` holds, and waits for the driver's end: (exit, output).
    Its trials hold after their second epoch until the disk is full (``surrogate.HOLD_ENV``): under load, MLflow's
    records of epoch 2 can arrive after a rehearsal's last epoch, and the disk would fill only after the study."""
    hold = output.with_name("hold")
    hold.touch()
    with open(output, "w") as out:
        driver = start_driver([*argv, "--study-name", name], {**env, surrogate.HOLD_ENV: str(hold)}, output=out)
    try:
        wait_for(lambda: moment(runs, name), 300, moment.__doc__, process=driver, every_s=0.05)
        fill(full)
        driver.wait(timeout=300)  # a generous limit: the driver must end by itself
    finally:
        hold.unlink()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    return driver.returncode, output.read_text()


def assert_one_disk_full_line(code: int, text: str, where: Path) -> None:
    """Exit non-zero, one error line naming the full disk and a file under ``where``, no logging tracebacks."""
    assert code != 0, text[-3000:]
    assert "--- Logging error ---" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    assert "No space left on device" in errors[0] and str(where) in errors[0], errors


@pytest.mark.slow
def test_runs_folder_fills_mid_study_then_resume_finishes_it(tmp_path):
    """DML_RUNS_DIR (MLflow's store, the Optuna journal, Tune's state and checkpoints, logs, spool) on a small disk."""
    with small_filesystem(tmp_path / "small") as small:
        runs = small / "runs"
        runs.mkdir()
        env, name = study_env(runs), "full-runs"
        code, text = run_until_the_disk_fills(STUDY, env, runs, name, small, tmp_path / "driver.out")
        assert_one_disk_full_line(code, text, runs)
        assert "--resume" in text, text[-2000:]  # said resumable: the resume below holds it to that
        (small / "filler").unlink()
        out = run_driver(["--study-name", name, "--resume"], env, timeout=300)
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
        assert_recorded_once(runs, name, 4)


@pytest.mark.slow
@pytest.mark.parametrize("moment", [second_epoch, journal_made], ids=["mid-study", "before-the-first-trial"])
def test_storage_path_fills_then_resume_finishes_the_study(tmp_path, moment):
    """--storage-path (Tune's state and the trials' checkpoints) on a small disk, the runs folder on the normal one;
    the disk fills mid-study, or before Tune has saved anything (a resume then starts the trials afresh)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    with small_filesystem(tmp_path / "small") as small:
        storage = small / "ray"
        env, name = study_env(runs), "full-storage"
        argv = [*STUDY, "--storage-path", str(storage)]
        code, text = run_until_the_disk_fills(argv, env, runs, name, small, tmp_path / "driver.out", moment)
        assert_one_disk_full_line(code, text, storage)
        assert "--resume" in text, text[-2000:]
        (small / "filler").unlink()
        out = run_driver(["--study-name", name, "--resume"], env, timeout=300)
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
        assert_recorded_once(runs, name, 4)


@pytest.mark.slow
def test_a_report_on_a_full_disk_ends_in_one_line_and_leaves_no_partial_file(tmp_path):
    """study.report --out on a full disk: exit 1, one line naming the folder and ENOSPC, no report file and no staging
    folder left there, nothing uploaded to the study's run (before: an OSError traceback)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env, name = study_env(runs), "full-report"
    done = run_driver([*STUDY, "--study-name", name], env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with small_filesystem(tmp_path / "small", "1m") as small:
        fill(small)
        out = small / "report"
        report = subprocess.run(
            [sys.executable, "-m", "study.report", "--study", name, "--out", str(out)], env=env, capture_output=True, text=True, timeout=600
        )
        assert report.returncode == 1, report.stderr[-3000:]
        lines = report.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "No space left on device" in lines[0], report.stderr[-3000:]
        assert str(small) in lines[0] and "no report was written" in lines[0]
        assert not out.exists() or not any(out.iterdir())  # nothing half-written in --out
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("dml-studies").experiment_id], filter_string=f"tags.study_name = '{name}' and tags.kind = 'study'"
    )
    assert not [a.path for a in client.list_artifacts(parent.info.run_id, "report")]  # nothing uploaded


def test_a_final_whose_runs_folder_fills_ends_in_one_line(tmp_path):
    """study.final with its runs folder (the MLflow store, spool, logs, locks) on a disk that fills after its first
    epoch: exit 1, one line naming the file and the full disk; with space again, the next study.final ends the runs it
    left and trains. Before: a traceback ending in the spool's OSError."""
    import mlflow

    from tests.test_final import TINY, logged_epochs, write_config

    config = write_config(tmp_path / "long.yaml", **{**TINY, "epochs": 500})
    with small_filesystem(tmp_path / "small") as small:
        env = study_env(small / "runs")
        argv = [sys.executable, "-m", "study.final", "--config", str(config), "--seeds", "1"]
        final = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
        try:
            wait_for(lambda: logged_epochs(small / "runs" / "mlflow.db") > 0, 600, "study.final's first epoch", process=final)
            fill(small)
            out, err = final.communicate(timeout=600)
        finally:
            final.kill()
        assert final.returncode == 1, err[-3000:]
        assert_one_disk_full_line(final.returncode, err, small)  # beside it, one warning: the log file cannot be written
        assert "study.final stopped" in err
        (small / "filler").unlink()  # space again: the next final ends what this one left RUNNING, and trains
        short = write_config(tmp_path / "short.yaml", **{**TINY, "epochs": 1})
        argv[argv.index(str(config))] = str(short)
        after = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1])
        assert after.returncode == 0, after.stderr[-3000:]
        client = mlflow.MlflowClient(f"sqlite:///{small / 'runs' / 'mlflow.db'}")
        found = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert len(found) == 4 and "RUNNING" not in [r.info.status for r in found]  # two parents, two seeds


# attach the SOP set under argv[1] at crop size argv[2] to a cache folder whose free space looked ample when it was
# checked (another writer filled the disk between the check and the build, as two studies on one node can)
FILLED_AFTER_THE_CHECK = """
import collections, shutil, sys
from trainables.core import cache, data
Usage = collections.namedtuple("Usage", "total used free")
shutil.disk_usage = lambda path: Usage(1 << 40, 0, 1 << 40)
splits = data.load_dataset("sop", sys.argv[1])
print("cached" if cache.attach_cache(splits, int(sys.argv[2]), sys.argv[1]) else "streaming", splits.train.decoded is None)
"""


def test_a_disk_that_fills_during_the_cache_build_leaves_the_images_streaming(tmp_path):
    """The decoded cache's build (trainables.core.cache) on a 1 MiB disk that cannot hold its pixels: the trial goes on
    streaming the images from their files, one line names the folder and the error, and no file of the build is left
    for a later run to read or to count against the disk. (A sparse pixel file filled through a memmap killed the
    process with SIGBUS, and nothing said why.)"""
    from tests.photo_data import make_sop
    from trainables.core import cache

    make_sop(tmp_path / "data", scale=0.0004, size_scale=0.15)  # about 50 images: 10 MB of pixels at 256 px
    with small_filesystem(tmp_path / "disk", size="1m") as disk:
        env = {**os.environ, cache.CACHE_DIR_ENV: str(disk), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        env.pop(cache.CACHE_MAX_GB_ENV, None)
        done = subprocess.run(
            [sys.executable, "-c", FILLED_AFTER_THE_CHECK, str(tmp_path / "data"), "224"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
        assert done.stdout.split() == ["streaming", "True"], done.stdout
        said = [line for line in done.stderr.splitlines() if "decoded cache off" in line]
        assert len(said) == 1 and str(disk) in said[0] and "No space left on device" in said[0], done.stderr[-3000:]
        assert [p.suffix for p in disk.iterdir()] == [".lock"]  # the build's lock only: no pixels, shapes or manifest

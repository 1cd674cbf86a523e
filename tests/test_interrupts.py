"""A study's driver stopped by a signal: it says so, exits 128 + the signal, and --resume completes the study.

The unit tests send real signals to this process; the study tests stop a real driver once a trial has a
checkpoint (an event on disk, never a fixed delay) and resume it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys

import pytest

from study.interrupts import StopSignals, StudyInterrupted, exit_code, signal_name
from study.launch import cli as launch
from study.launch import run as launch_run
from tests.conftest import ROOT, wait_for
from tests.test_launch import study_records
from tests.test_resume import start_driver


def test_first_signal_while_fitting_asks_ray_tune_to_stop_gracefully():
    asked = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: asked.append(True))  # stands in for Ray Tune's graceful stop
    try:
        with StopSignals().installed() as stops:
            with pytest.raises(StudyInterrupted) as raised:
                with stops.graceful():
                    os.kill(os.getpid(), signal.SIGTERM)
                    wait_for(lambda: asked, 30, "the graceful stop")  # the body goes on: fit() returns by itself
            assert raised.value.exit_code == 128 + signal.SIGTERM and raised.value.name == "SIGTERM"
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_handled_signal_outside_a_fit_raises_naming_itself(signum):
    """study.final trains its seeds outside any graceful or deferred block: each of the three signals raises there,
    named, with exit status 128 + its number (tests/test_final.py stops a real study.final with two of them)."""
    with pytest.raises(StudyInterrupted) as raised:
        with StopSignals().installed():
            signal.raise_signal(signum)
    assert (signal_name(raised.value), exit_code(raised.value)) == (signal.Signals(signum).name, 128 + signum)


def test_second_signal_raises_at_once():
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        with StopSignals().installed() as stops:
            with pytest.raises(StudyInterrupted) as raised:
                with stops.graceful():
                    os.kill(os.getpid(), signal.SIGINT)
                    os.kill(os.getpid(), signal.SIGHUP)
                    wait_for(lambda: False, 30, "the second signal")  # never reached: the second signal raises here
            assert raised.value.name == "SIGINT"  # the signal that stopped the study
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_signal_in_a_deferred_block_waits_for_its_end():
    done = []
    with StopSignals().installed() as stops:
        with pytest.raises(StudyInterrupted):
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGHUP)
                done.append("the block ran to its end")
    assert done


class HalfWrites:
    """A seed recorder whose every write is hit by a signal halfway: what study.final's MLflow writes met in CI, where
    SIGTERM landed inside a sqlite commit of ``log_batch``; the cut transaction kept the store's write lock, so the
    KILLED marks after it failed with "database is locked" and the driver exited 1."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def write(self, what: str) -> None:
        signal.raise_signal(signal.SIGTERM)
        self.written.append(what)  # the second half of the write

    def start(self, job) -> None:
        self.write(f"start {job.index}")

    def epoch(self, report) -> None:
        self.write(f"epoch {report.epoch}")

    def done(self, output) -> None:
        self.write(f"done {output.index}")


@pytest.mark.parametrize("writes", ["start", "epoch", "done"])
def test_a_signal_never_cuts_a_seed_recorders_write_in_half(writes):
    """study.final's seeds in the driver: a signal during one of the recorder's writes lets the write end, then stops
    the training (StudyInterrupted, naming the signal) before anything else is written."""
    from study.final import placement as seeds

    recorder = HalfWrites()
    for other in {"start", "epoch", "done"} - {writes}:
        setattr(recorder, other, lambda *args: None)
    job = seeds.SeedJob(0, None, "cpu", 0, 1, None)

    def train(job, splits, on_epoch):
        on_epoch(seeds.EpochReport(job.index, 1, {}))
        on_epoch(seeds.EpochReport(job.index, 2, {}))
        return seeds.SeedOutput(job.index, {}, {}, 0.0, {}, {}, "here")

    with pytest.raises(StudyInterrupted) as raised:
        with StopSignals().installed():
            seeds.train_seeds([job], seeds.Placement(parallel=False), None, recorder, train)
    assert raised.value.name == "SIGTERM"
    assert recorder.written == [{"start": "start 0", "epoch": "epoch 1", "done": "done 0"}[writes]]


def test_handlers_are_restored_and_plain_keyboard_interrupt_exits_130():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with StopSignals().installed():
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
    assert {s: signal.getsignal(s) for s in before} == before
    assert exit_code(KeyboardInterrupt()) == 130


def test_a_library_that_raises_its_own_keyboard_interrupt_for_the_signal_still_names_the_signal():
    """A library that catches the handler's StudyInterrupted and raises a plain KeyboardInterrupt (Ray's waits did:
    study.final's seeds stopped by SIGTERM exited 130, "stopped by SIGINT") still names SIGTERM, inside the handlers'
    block (where the runs are marked stopped) and out of it (the exit)."""
    stops = StopSignals()
    inside = None
    with pytest.raises(StudyInterrupted) as left:
        with stops.installed():
            try:
                try:
                    signal.raise_signal(signal.SIGTERM)
                except StudyInterrupted:
                    raise KeyboardInterrupt from None  # what the library does
            except KeyboardInterrupt as error:
                inside = (signal_name(error), exit_code(error))
                raise
    assert inside == ("SIGTERM", 143)
    assert (left.value.name, exit_code(left.value)) == ("SIGTERM", 143)
    assert (signal_name(KeyboardInterrupt()), exit_code(KeyboardInterrupt())) == ("SIGINT", 130)  # a Ctrl-C, no handlers


def assert_resumed_to_the_end(runs, env: dict, name: str) -> None:
    """``--resume`` of the stopped two-trial study ends it: exit 0, the parent FINISHED with no failure reason, both
    trials COMPLETE, each one FINISHED run."""
    resumed = subprocess.run(
        [sys.executable, "-m", "study.launch", "--study-name", name, "--resume"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, start_new_session=True,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, parent, children, study = study_records(runs, name)
    assert parent[0].info.status == "FINISHED" and "failure_reason" not in parent[0].data.tags
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE"]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize(("signum", "whole_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_signal_stops_the_study_resumably_and_resume_completes_it(runs, signum, whole_group):
    """Ctrl-C reaches the whole process group (the driver and its Ray); SIGTERM only the driver. A rehearsal: the
    driver's stop and resume are under test (train_dml's own checkpoints and resume: tests/test_resume.py)."""
    env = {**os.environ, "DML_RUNS_DIR": str(runs)}
    name = "stopped"
    argv = ["--rehearse", "0.5", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "2", "--epochs", "6", "--grace-period", "6"]
    argv += ["--confirm-budget", "0", "--study-name", name]
    argv += ["--checkpoint-every", "0"]  # a checkpoint every epoch: the signal comes once the first is on disk
    driver = start_driver(argv, env)
    try:
        wait_for(lambda: any((runs / "ray" / name).glob("*/checkpoint_*")), 600, "a trial's first checkpoint", process=driver)
    except AssertionError:
        driver.kill()
        raise
    os.killpg(driver.pid, signum) if whole_group else driver.send_signal(signum)
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 128 + signum, err[-3000:]
    assert f"stopped by {signal.Signals(signum).name}" in err and f"--study-name {name} --resume" in err
    client, parent, children, study = study_records(runs, name)
    assert parent[0].info.status == "KILLED"
    assert all(r.info.status != "RUNNING" for r in children)  # nothing left RUNNING
    assert not any(t.state.name == "FAIL" for t in study.trials)  # interrupted trials stay open for the resume

    assert_resumed_to_the_end(runs, env, name)


@pytest.mark.faults
@pytest.mark.slow
def test_a_driver_killed_by_a_fatal_signal_says_so_in_one_line_and_the_log_holds_its_stack(runs):
    """SIGSEGV to the driver (a crash in native code, as a library's bug gives it): faulthandler writes every thread's
    stack to the study's log, one line on the terminal names the signal and the log, and --resume ends the study as
    after a SIGKILL."""
    env = {**os.environ, "DML_RUNS_DIR": str(runs)}
    name = "crashed"
    argv = ["--rehearse", "0.5", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "2", "--epochs", "6", "--grace-period", "6"]
    argv += ["--confirm-budget", "0", "--study-name", name, "--checkpoint-every", "0"]
    driver = start_driver(argv, env)
    try:
        wait_for(lambda: any((runs / "ray" / name).glob("*/checkpoint_*")), 600, "a trial's first checkpoint", process=driver)
        driver.send_signal(signal.SIGSEGV)
        driver.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # the local Ray the dead driver started
    _, err = driver.communicate(timeout=300)  # the watcher's line comes once the driver is gone
    assert driver.returncode == -signal.SIGSEGV, err[-3000:]
    log = runs / "logs" / f"{name}.log"
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: study.launch died: Segmentation fault; every thread's stack is in {log}"
    ], err[-3000:]
    # every thread's stack in the log, none on the terminal; which frames depends on where the signal found each thread
    # (a deep one is cut at faulthandler's 100 frames), so only that there are frames is checked
    stack = log.read_text().split("Fatal Python error: Segmentation fault", 1)[1]
    assert "most recent call first" in stack and 'File "' in stack, stack[:3000]
    assert "most recent call first" not in err, err[-3000:]

    assert_resumed_to_the_end(runs, env, name)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_disk_mid_study_ends_in_one_line_naming_the_file_and_the_resume(runs, capsys, monkeypatch, code):
    def full_disk(settings, experiment_id):
        os.makedirs(settings.experiment_dir)  # mid-study: Tune's experiment folder exists (none: --resume refuses the study)
        raise OSError(code, os.strerror(code), str(runs / "optuna" / "journal.log"))

    monkeypatch.setattr(launch_run, "run_study", full_disk)
    assert launch.main(["--space", "smoke", "--study-name", "full"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"journal.log: {os.strerror(code)}" in err and "--study-name full --resume" in err

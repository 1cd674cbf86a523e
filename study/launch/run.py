"""A study run from its parsed flags to its exit status: settings, the MLflow experiment (set up once), the Ray
session, the Tuner, the summary; the closing lines and what a signal, a full disk or bad input print."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import mlflow
import optuna

from study import console, inputs, interrupts
from study.inputs import UsageError
from study.interrupts import StopSignals, env_set
from study.launch import heap, tunestate
from study.launch.settings import StudySettings, study_settings
from study.launch.tuner import new_tuner, open_study, replay_race, restored_tuner
from study.ray_session import AUTO_LOGGERS_FLAG, cluster_resources, local_ray_env, ray_session
from study.records import ending, locks, parent, tracking
from study.records.tracking import DEFAULT_EXPERIMENT
from study.records.trials import TrialRecorder, spool_path
from study.search.schedulers import describe
from study.search.spaces import SpaceError
from trainables.core.config import ConfigError
from trainables.core.data import (
    DatasetError,
)

INPUT_ERRORS = (UsageError, ConfigError, DatasetError, SpaceError)


class NothingToRun(Exception):
    """--resume of a study that has finished."""


def print_header(s: StudySettings) -> None:
    import ray

    ray_address = ray.get_runtime_context().gcs_address
    reruns = (
        f", then a race of the top {s.record.confirm_top} over up to {s.record.val_folds - 1} more validation folds "
        f"{'of whole alphabets ' if s.record.race_folds == 'alphabets' else ''}"
        f"(budget {s.confirm_budget:g} x the search's epochs)"
        if s.reruns
        else ""
    )
    rehearsal = f"rehearsal ({s.record.rehearse:g} s per surrogate epoch, no training) of " if s.record.rehearse is not None else ""
    print(
        f"{rehearsal}study {s.name}: {s.record.num_samples} trials of up to {s.max_epochs} epochs{reruns}, space {s.space.path}, "
        f"{s.record.metric} ({s.record.mode}), {s.slots} at once, {describe(s.early_stopping)}; Ray at {ray_address}",
        flush=True,
    )


def run_study(settings: StudySettings, experiment_id: str) -> ending.StudySummary:
    """Run the study to its end in MLflow experiment ``experiment_id`` (``tracking.setup``'s, once per command); returns
    what ``console.print_study_summary`` prints.

    Whatever stops it early leaves its MLflow runs marked stopped (``parent.stopped_on_failure``) and no Ray running;
    a signal stops it as ``study.interrupts`` says, resumable. A second driver of the same study fails at once (``study.records.locks``).
    """
    s = settings
    client = mlflow.MlflowClient(s.tracking_uri)
    with locks.study_lock(locks.lock_folder(s.record.optuna_storage, tracking.runs_dir()), s.name):
        parent_id = parent.existing_parent(client, experiment_id, s.name, resume=s.resume, experiment=s.experiment)
        if s.resume and client.get_run(parent_id).info.status == "FINISHED":
            raise NothingToRun(s.name)
        ray_started = time.time()
        with ray_session(s.address, s.local_resources), StopSignals().installed() as stops:
            s = s.with_slots(cluster_resources())
            with stops.deferred():  # no half-created study
                study, parent_id = open_study(s, client, experiment_id, parent_id)
                ending.describe_optuna_study(study, parent_id, s.space.path, s.record.metric)
            started = time.time()
            usage = {"slots": s.slots, "startup_s": started - ray_started, "since": started}  # Ray's start-up apart
            with parent.stopped_on_failure(client, experiment_id, parent_id):
                recorder = TrialRecorder(
                    s.tracking_uri, experiment_id, parent_id, s.name, spool_path(s.name), optuna_storage=s.record.optuna_storage
                )
                tuner = restored_tuner(s, study, recorder) if s.resume else new_tuner(s, recorder)
                print_header(s)
                recorder.start_writer()  # the driver's one writer of the trial records (the callbacks' copies append)
                try:
                    with stops.graceful(), env_set(AUTO_LOGGERS_FLAG, "1"):
                        results = tuner.fit()
                finally:  # no record lands after the study marks its runs
                    recorder.close_writer()
                selection = replay_race(s, study, results)
                # Tune's result grid, which the Tuner keeps too, holds a frame of every trial's results, much of a long
                # study's driver memory (docs/performance.md, measurements behind the code); the end of the study reads
                # none of it
                del results, tuner
                heap.release_freed()
                with stops.deferred():
                    wall_s = time.time() - started
                    named = {"experiment": s.experiment, "final_epochs": s.record.final_epochs}
                    return ending.finish_study(study, recorder, s.record.metric, s.record.mode, wall_s, selection, usage, **named)


def launch(args: argparse.Namespace) -> int:
    """The study of ``args`` (``cli.parse_args``) run to its end; the command's exit status."""
    tracking.configure_mlflow()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = None
    try:
        with locks.store_setup_lock(tracking.resolve_tracking_uri(args.tracking_uri)):  # one driver migrates a new store
            settings = study_settings(args)
            experiment_id = tracking.setup(settings.tracking_uri, settings.experiment)
        local_ray_env(settings.address)
        import ray  # noqa: F401  (its import installs the console handler that library_output_to replaces)

        log = console.log_path(settings.name)
        with console.fatal_errors_to(log, "study.launch"), console.library_output_to(log):
            inputs.redact_logs()
            outcome = run_study(settings, experiment_id)
    except INPUT_ERRORS as error:
        return inputs.print_error(error)
    except NothingToRun:
        print(f"study {settings.name} has finished: nothing left to run, nothing written. {next_steps(settings)}")
        return 0
    except KeyboardInterrupt as error:
        print(inputs.redacted(interrupted_message(error, settings)), file=sys.stderr)
        return interrupts.exit_code(error)
    except Exception as error:  # a full or read-only disk, also inside the TuneError Ray Tune makes of it: one line
        folders = [str(tracking.runs_dir())] + ([settings.record.storage_path] if settings is not None else [])
        return inputs.disk_full_exit(error, folders, resume_hint(settings))
    console.print_study_summary(dataclasses.replace(outcome, uri=inputs.redacted(outcome.uri)), settings.record.metric)
    if settings.record.rehearse is not None:
        print("this was a rehearsal: every curve is the surrogate's (trainables/surrogate.py); its pick is not a model to retrain")
    if outcome.metrics["n_complete"]:
        return 0
    # no trial completed: the study failed (its parent run FAILED), and why is said here, each reason once
    reasons = tracking.fail_study(outcome.uri, outcome.parent_run_id) if outcome.mlflow_synced else []
    m = outcome.metrics
    failed = f"{m['n_failed']} failed" + (f", {m['n_pruned']} stopped early" if m["n_pruned"] else "")
    lines = [f"  {count} trial{'s' * (count > 1)}: {reason}" for reason, count in reasons]
    inputs.print_error("\n".join([f"study {settings.name}: no trial completed ({failed})" + ("; the reasons:" if lines else ""), *lines]))
    return 1


def next_steps(settings: StudySettings) -> str:
    report, final = console.python_command("study.report"), console.python_command("study.final")
    return f"Its report: {report} --study {settings.name}; its best config retrained: {final} --study {settings.name}"


def resume_hint(settings: StudySettings | None) -> str:
    if settings is None:
        return "nothing was started"
    where = f" --experiment {settings.experiment}" if settings.experiment != DEFAULT_EXPERIMENT else ""
    if settings.tracking_uri != tracking.resolve_tracking_uri(None):  # MLflow is found where the study recorded its stores
        where += f" --tracking-uri {settings.tracking_uri}"
    command = f"{console.python_command('study.launch')} --study-name {settings.name} --resume{where}"
    if "://" not in settings.experiment_dir and not tunestate.resumable(settings.experiment_dir):  # checked, not promised
        return (
            f"its Tune state under {settings.experiment_dir} is missing or could not be saved whole (a full disk?), and no "
            "good copy of it exists: the trials kept so far are in MLflow and the Optuna storage; free space and start the "
            "study again under a new --study-name"
        )
    return f"its state is saved: continue it with  {command}"


def interrupted_message(error: KeyboardInterrupt, settings: StudySettings | None) -> str:
    """What the driver says when a signal stops it."""
    what = f"study {settings.name}" if settings is not None else "study.launch"
    return f"{what} stopped by {interrupts.signal_name(error)}; {resume_hint(settings)}"

"""What the study commands show in the terminal, and where library noise goes instead.

- Commands a summary prints name this environment's interpreter and tools
  (``python_command``, ``env_tool``), so they run as printed without
  activating the environment.
- ``print_study_summary`` says how a study ended and what to run next.
- ``library_output_to`` sends Python warnings and the log records of Ray,
  Optuna, MLflow and their helpers to a log file (``log_path``), and turns off
  Ray Tune's own console output (its configuration table and TensorBoard hint),
  so the terminal shows the commands' own lines. The file keeps everything.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from study.records import store
from study.records.tracking import runs_dir, study_view_page
from study.records.trials import spool_path
from study.search.race import standing, tie_member
from trainables.core.config import TrainConfig, applicable_keys

if TYPE_CHECKING:
    from study.records.ending import StudySummary
    from study.search.race import Selection

# Libraries whose log records go to the log file; "py.warnings" carries warnings.warn (logging.captureWarnings).
LIBRARY_LOGGERS = ("ray", "optuna", "mlflow", "alembic", "urllib3", "filelock", "matplotlib", "PIL", "py.warnings")


def log_path(name: str) -> Path:
    """The log file of the study (or final training) ``name``: ``<runs dir>/logs/NAME.log``."""
    return runs_dir() / "logs" / f"{name}.log"


@contextlib.contextmanager
def library_output_to(path: Path, loggers: tuple[str, ...] = LIBRARY_LOGGERS) -> Iterator[Path]:
    """Within the block, warnings and the libraries' log records (INFO and up) go to ``path`` (appended), not to the terminal.

    Enter it after importing Ray (its import installs its console handler on the "ray" logger, replaced here).
    On exit the loggers, the warnings machinery and the environment are as they were. Yields ``path``.
    """
    import optuna

    optuna.logging.get_logger("optuna")  # installs Optuna's console handler now, so that it is replaced here
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = QuietFileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = {
        name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate, logging.getLogger(name).level) for name in loggers
    }
    new_output = os.environ.get("RAY_AIR_NEW_OUTPUT")
    for name in loggers:
        logger = logging.getLogger(name)
        logger.handlers[:] = [h for h in logger.handlers if not _is_console(h)] + [handler]
        logger.propagate = False
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    # Ray Tune's console reporter prints its table and TensorBoard hint even with verbose=0; the
    # classic reporter (RAY_AIR_NEW_OUTPUT=0) prints nothing at verbose=0.
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # every distinct warning once per place, into the file
            yield path
    finally:
        logging.captureWarnings(False)
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(level)
        handler.close()
        if new_output is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = new_output


# The watcher of fatal_errors_to: waits until its command's process closes the pipe (at its end, or at its death),
# then, if faulthandler wrote a fatal error into the log past the offset it was given, says so in one line.
_WATCHER = """
import sys
sys.stdin.buffer.read()
path, offset, command = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    with open(path, "rb") as log:
        log.seek(offset)
        for line in log:
            if line.startswith(b"Fatal Python error: "):
                what = line.decode(errors="replace").split(": ", 1)[1].strip()
                print(f"error: {command} died: {what}; every thread's stack is in {path}", file=sys.stderr)
                break
except OSError:
    pass
"""


@contextlib.contextmanager
def fatal_errors_to(path: Path, command: str) -> Iterator[None]:
    """Within the block, a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL: a crash in native code, or a kill
    with one of them) writes every thread's Python stack to ``path`` (``faulthandler``), and one line to the terminal
    names ``command``, what killed it and ``path``.

    A dying process can print nothing more, so the line comes from a small watcher process that outlives it; its own
    session keeps the terminal's Ctrl-C from it. The runs the dead command left are ended by the next command, as after
    a SIGKILL. On exit faulthandler is back as it was (to stderr, where it was on).
    """
    import faulthandler
    import subprocess

    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "ab")  # held open for the block: faulthandler writes to its descriptor
    offset = log.seek(0, os.SEEK_END)
    watcher = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _WATCHER, str(path), str(offset), command], stdin=subprocess.PIPE, start_new_session=True
    )
    was_on = faulthandler.is_enabled()
    faulthandler.enable(file=log, all_threads=True)
    try:
        yield
    finally:
        faulthandler.disable()
        if was_on:
            faulthandler.enable(file=sys.__stderr__, all_threads=True)
        watcher.stdin.close()
        watcher.wait()
        log.close()


class QuietFileHandler(logging.FileHandler):
    """The log file's handler: a record it cannot write (a full disk) is said once on stderr, in one line, not with
    logging's traceback per record; the study goes on without its library logs."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            print(f"warning: {self.baseFilename}: cannot be written ({error}); library logs are dropped from now on", file=sys.stderr)


def keep_in_log_file(name: str = "ray") -> None:
    """Inside :func:`library_output_to`, the console handlers a library installed on logger ``name`` after the block began
    (Ray's first import, in study.final only when its seeds train side by side) removed: its records go to the file
    alone. Outside such a block nothing changes."""
    logger = logging.getLogger(name)
    if any(isinstance(h, QuietFileHandler) for h in logger.handlers):
        logger.handlers[:] = [h for h in logger.handlers if not _is_console(h)]


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def env_tool(name: str) -> str:
    """``name`` as this environment runs it, shell-quoted: the interpreter for "python", else the tool
    beside it in the environment's bin folder (bare ``name`` when it is not there).

    Paths under the working folder are given relative to it (``.venv/bin/python``).
    """
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a link out of its bin folder
    path = Path(sys.executable) if name == "python" else bin_dir / name
    if not path.is_file():
        return name
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def python_command(module: str) -> str:
    """``<this interpreter> -m module``."""
    return f"{env_tool('python')} -m {module}"


# MLflow 3.17's UI opens an experiment in its GenAI views whatever the experiment's tags say (a toggle kept in the
# browser decides); this parameter of the page's address opens its runs table instead
RUNS_PAGE = "#/experiments/{}/runs?workflowType=machine_learning"


def ui_address(uri: str, experiment_id: str | None = None, study_name: str | None = None) -> tuple[str, str | None]:
    """The MLflow UI's address for the store ``uri``: at the runs of ``experiment_id`` when given; with ``study_name``,
    at that study's runs, the pick first (``study.records.tracking.study_view``). With it, the command that serves the
    UI for a local store (None for a server, which serves its own)."""
    if experiment_id and study_name:
        page = study_view_page(experiment_id, study_name)
    else:
        page = RUNS_PAGE.format(experiment_id) if experiment_id else ""
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}", None
    return f"http://127.0.0.1:5000/{page}", f"{env_tool('mlflow')} ui --backend-store-uri {shlex.quote(uri)}"


def ui_command(uri: str, experiment_id: str | None = None, study_name: str | None = None) -> str:
    """How to open the MLflow UI on ``uri`` with this environment's mlflow (``ui_address``)."""
    address, command = ui_address(uri, experiment_id, study_name)
    if command is None:
        return f"open {address} in a browser"
    return f"{command}, then open {address}" if experiment_id else command


def print_selection(selection: Selection, metric: str) -> None:
    """The race of the top trials over validation folds (or an older study's seed re-runs) and the pick, one line each."""
    folds = bool(selection.winner.folds)
    what = "raced over validation folds (the trial's own fold 0, then each re-run's)" if folds else "re-run with extra seeds"
    print(f"the top trials {what}, {metric}:")
    for c in selection.ranking:
        sem = f" +- {c.sem:.4f}" if math.isfinite(c.sem) else ""
        scores = ", ".join(f"{v:.4f}" for v in c.scores)
        status = f"; {standing(c)}" if folds else ""
        print(f"  Optuna #{c.key}: mean {c.mean:.4f}{sem} over {len(c.scores)} ({scores}){status}")
    print(f"pick: Optuna #{selection.winner.key}, {selection.verdict()}")


def study_flags(study_name: str, experiment: str, uri: str) -> str:
    """The flags that name a study to study.final, study.report and study.sync (the tracking URI unless the default's)."""
    flags = f"--study {study_name} --experiment {experiment}"
    return flags if store.is_local_sqlite(uri) else f"{flags} --tracking-uri {uri}"


def sync_command(study_name: str, experiment: str, uri: str) -> str:
    """The ``study.sync`` command that writes the study's kept records to its MLflow store."""
    return f"{python_command('study.sync')} {study_flags(study_name, experiment, uri)}"


def print_study_summary(outcome: StudySummary, metric: str) -> None:
    """The human summary of a finished (or synced) study: counts, outages, the best trial and what to run next.

    The commands it prints name this environment's interpreter and tools (``study.console``), so they run as printed.
    """
    m, study_name = outcome.metrics, outcome.study_name
    flags = study_flags(study_name, outcome.experiment, outcome.uri)
    if outcome.outages:
        print(
            f"\nMLflow was unreachable {outcome.outages} time(s) during the study; training went on"
            + ("; the records kept meanwhile were written when it returned." if outcome.mlflow_synced else ".")
        )
    if not outcome.mlflow_synced:
        print(
            f"\nwarning: MLflow at {outcome.uri} could not be written at the end ({outcome.mlflow_error}). Nothing is lost: "
            f"trial records are kept in {spool_path(study_name)} and the trials in the Optuna storage.\n"
            f"write them when MLflow is back:  {sync_command(study_name, outcome.experiment, outcome.uri)}"
        )
    print(
        f"\nstudy {study_name} finished in {m['wall_time_s']:.0f} s: {m['n_trials']} trials, "
        f"{m['n_complete']} complete, {m['n_pruned']} pruned early, {m['n_failed']} failed, {m['epochs_spent']:.0f} epochs trained"
    )
    if outcome.utilization is not None:
        print(outcome.utilization.describe())
    best = outcome.best
    if best is None:
        print("no trial completed; nothing to retrain")
    else:
        if outcome.selection is not None:
            print_selection(outcome.selection, metric)
        config = TrainConfig.from_dict(outcome.best_config or {}, source="best trial")
        print(f"best trial {best.user_attrs.get('tune_trial_id')} (Optuna #{best.number}): {metric} = {best.value:.4f}")
        print(f"its config (best_config.yaml: the keys that apply to loss {config.loss}; every key: resolved_config.yaml):")
        for key in applicable_keys(config):
            print(f"  {key}: {getattr(config, key)}")
        epochs = f"{outcome.final_epochs} epochs, " if outcome.final_epochs else ""
        seeds = (config.seed, config.seed + 1, config.seed + 2)
        tied = outcome.selection.tied if outcome.selection is not None else ()
        trains = f"seeds {', '.join(map(str, seeds))}; the three"
        if len(tied) > 1:  # study.final --members tied: seed k trains the k-th tied candidate
            trains = ", ".join(f"#{tie_member(tied, k)} with seed {seed}" for k, seed in enumerate(seeds)) + ", the race's tie; the three"
        print(
            f"\nretrain it on all training classes and test it:  {python_command('study.final')} {flags}\n"
            f"  ({epochs}{trains} as one model, their embeddings side by side, is registered as {study_name}-embedding; "
            "no seed is chosen by its test score, which would tune on the test classes)"
        )
    shows = "the trials and their curves" if best is None else "top trials, the pick, importances, curves; once retrained, its test results"
    print(f"the report ({shows}; report.md and report.html):  {python_command('study.report')} {flags}")
    print(f"open the MLflow UI at the study's runs, the pick first:  {ui_command(outcome.uri, outcome.experiment_id, study_name)}")
    log = log_path(study_name)
    if log.is_file():
        print(f"warnings and library logs: {log}")

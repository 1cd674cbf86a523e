"""study.final from its parsed flags to its exit status: the store checked, the training run with the library logs
in the log file, and the summary, the serving commands and the next steps printed; what a signal or bad input prints."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys

from study import console, inputs
from study.final.results import ConfigurationResult, FinalResult
from study.final.serving import print_serving
from study.final.train import StoppedUnmarked, StoppedWhenDone, run_final
from study.inputs import UsageError
from study.interrupts import StopSignals, exit_code, signal_name
from study.records import store, tracking
from trainables.core.checkpoint import CheckpointError
from trainables.core.config import ConfigError
from trainables.core.data import (
    DatasetError,
)
from trainables.core.engine import TrainingDiverged
from trainables.core.models import WeightsError

log = logging.getLogger(__name__)


INPUT_ERRORS = (UsageError, ConfigError, DatasetError, WeightsError, CheckpointError)


def print_grid_summary(result: FinalResult) -> None:
    keys = ("test_nmi", "test_recall_at_1", "test_recall_at_2", "test_recall_at_4", "test_recall_at_8", "test_map_at_r")
    print(f"\n{result.name}: test metrics over {len(result.configurations[0].seeds)} seed(s), mean +- std")
    print(f"  {'configuration':<28}" + "".join(f"{k.removeprefix('test_'):>18}" for k in keys))
    for c in result.configurations:
        cells = "".join(f"{c.summary[k + '_mean']:>10.4f} +-{c.summary[k + '_std']:.3f}" for k in keys)
        print(f"  {c.name:<28}{cells}")
    print(f"\nparent run: {result.parent_run_id}")
    print_next(result)


def report_command(result: FinalResult) -> str:
    """``python -m study.report --study NAME`` for the study or grid this command trained (with a remote store's URI)."""
    command = f"{console.python_command('study.report')} --study {result.report}"
    return command if store.is_local_sqlite(result.uri) else f"{command} --tracking-uri {shlex.quote(inputs.redacted(result.uri))}"


def print_next(result: FinalResult) -> None:
    """The MLflow UI command with the address of the experiment's runs table, the report command (a study's or a grid's),
    the serve commands and where library warnings went."""
    ui = console.ui_command(inputs.redacted(result.uri), result.experiment_id or None, result.study)
    what = "at the study's runs, the pick first (the final runs after the trials)" if result.study else "at the experiment's runs"
    print(f"\nopen the MLflow UI {what}:  {ui}")
    if result.report:
        print(f"write the report (tables, curves, retrieval grids, t-SNE maps):  {report_command(result)}")
    print_serving(result)
    if result.log:
        print(f"\nwarnings and library logs: {result.log}")


def print_summary(result: FinalResult) -> None:
    if result.grid:
        print_grid_summary(result)
        return
    (only,) = result.configurations
    summary = only.summary
    keys = [k.removesuffix("_mean") for k in summary if k.endswith("_mean") and k.startswith("test_")]
    print(f"\n{result.name}: test metrics over {len(only.seeds)} seed(s) (mean +- std)")
    for key in keys:
        print(f"  {key:<24} {summary[key + '_mean']:.4f} +- {summary[key + '_std']:.4f}")
    print(f"  {'time per seed':<24} {summary['time_per_seed_s_mean']:.0f} s")
    print(f"\nparent run: {result.parent_run_id}")
    for seed in only.seeds:
        print(f"  model: {seed.model_uri}  (run {seed.run_id})")
        if seed.registered_uri:
            print(
                f"  registered as: {seed.registered_uri}: the first seed's model, seed {seed.seed} (the config's own); "
                "picking the seed by its test score would tune on the test classes"
            )
    if only.ensemble:
        print_ensemble(only)
    print_next(result)


def print_ensemble(outcome: ConfigurationResult) -> None:
    """The seeds (or a study's tied candidates) as one model: its test metrics beside the members' mean, and its model."""
    ensemble, n = outcome.ensemble, len(outcome.seeds)
    what = f"the {n} seeds" if not ensemble.trials else f"the study's tied candidates ({', '.join(f'#{t}' for t in ensemble.trials)})"
    wide = f"{ensemble.width} wide" if ensemble.trials else f"{n} x {outcome.config.embedding_dim} wide"
    print(f"\n{what} as one model (their embeddings side by side, {wide}; {n} x the cost to embed):")
    for key, value in ensemble.test.items():
        print(f"  {key:<24} {value:.4f}  ({'members' if ensemble.trials else 'seeds'}' mean {outcome.summary[key + '_mean']:.4f})")
    print(f"  model: {ensemble.model_uri}  (run {ensemble.run_id})")
    if ensemble.registered_uri:
        print(f"  registered as: {ensemble.registered_uri}: {what} as one model")


def run(args: argparse.Namespace) -> int:
    """study.final for ``args`` (``cli.parse_args``); the command's exit status."""
    try:
        tracking.check_store(tracking.resolve_tracking_uri(args.tracking_uri), "study.final")  # before its log file
        log_file = console.log_path("study.final")
        with StopSignals().installed(), console.fatal_errors_to(log_file, "study.final"), console.library_output_to(log_file) as log:
            inputs.redact_logs()
            result = dataclasses.replace(run_final(args), log=log)  # SIGTERM and SIGHUP raise as SIGINT does: the runs end KILLED
    except INPUT_ERRORS as error:
        return inputs.print_error(error)
    except StoppedUnmarked as error:
        print(
            f"study.final stopped by {error.name} while MLflow did not answer: its runs stay RUNNING and its records wait in "
            f"{error.spool}; the next study.final on this machine writes them and ends the runs KILLED",
            file=sys.stderr,
        )
        return error.exit_code
    except StoppedWhenDone as error:
        print(f"study.final stopped by {error.name} as it ended: its runs had ended FINISHED, every result recorded", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as error:
        print(
            f"study.final stopped by {signal_name(error)}: its runs are marked KILLED (nothing to resume; run the command again)",
            file=sys.stderr,
        )
        return exit_code(error)
    except TrainingDiverged as error:
        print(f"error: training diverged: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # a full or read-only disk (the runs folder, the store): one line
        advice = "study.final stopped: free space there and run it again (it ends the runs this one left RUNNING)"
        return inputs.disk_full_exit(error, [str(tracking.runs_dir())], advice)
    print_summary(result)
    return 0

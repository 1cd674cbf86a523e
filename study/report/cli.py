"""python -m study.report: a Markdown report with plots of a study or of a grid of final runs, from MLflow.

``python -m study.report --study NAME [--out DIR]`` reads the MLflow records of
a study (``study.launch``) or of a grid of final runs (``study.final --space``)
and writes ``report.md`` with PNGs: the top trials and the best config,
parameter importances, the validation metric against epoch, the Spearman rank
correlation between each ASHA rung's metric and the final one, the papers'
table (one row per metric, one column per configuration, mean and spread over
seeds) and embedding diagnostics of the final models (positive/negative pair
cosine similarities on the test classes, the mean-proxy norm over training).
``report.html`` is the same report in one file, its PNGs embedded. Both are
rendered from one list of blocks (headings, paragraphs, tables, images), and
the text the report reads from MLflow and Optuna is shown as text in both.
The same files are logged to the parent run under ``report/``, but for the
plots the study ended with at the run's root (``logged_files``).

The files a study itself ends with (``best_config.yaml``, ``trials.csv``, its
plots, drawn as the report draws them) are written by ``study.records.artifacts``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from pathlib import Path

from study import inputs, names
from study.records import tracking

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m study.report",
        description="Write a Markdown report with plots of a study (study.launch) or of a grid of final runs (study.final --space) "
        "from its MLflow records, and log it to the study's parent run under report/.",
    )
    parser.add_argument(
        "--study", required=True, help="the study's name (study.launch --study-name, or the name of a study.final --space run)"
    )
    parser.add_argument(
        "--out",
        help="output folder: new, empty, or one a previous report wrote (default: runs/reports/NAME); "
        "only the files the report writes go there and to MLflow",
    )
    tracking.add_tracking_flags(parser.add_argument, "MLflow experiment to look in (default: all)", None)
    parser.add_argument("--top", type=int, default=10, help="trials in the top-trials table (default 10)")
    parser.add_argument("--no-log", action="store_true", help="only write the files; do not log them to the parent run")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top {args.top}: expected an integer >= 1")
    names.check_names({"--study": args.study, "--experiment": args.experiment})
    return args


def logged_files(client, parent, folder: Path) -> list[Path]:
    """The report's files that go to the parent run's ``report/``: all but the plots the study ended with at the run's
    root (``study.records.artifacts``: the same drawings, from the same records), so that the run holds each plot once.
    ``report.html`` embeds every picture; ``report.md`` names them as files beside it, as in the report's folder."""
    held = {a.path for a in client.list_artifacts(parent.info.run_id) if not a.is_dir}
    return [path for path in sorted(folder.iterdir()) if path.is_file() and not (path.suffix == ".png" and path.name in held)]


MARKER = ".study-report"  # in a folder the report wrote: the files it wrote there, one a line


def out_folder(flag: str | None, study: str) -> Path:
    """The report's folder: --out, else runs/reports/STUDY; refused where the report could clobber what it did not write.

    An --out that exists must be a folder that is empty or holds a previous report (its MARKER); the default folder
    is the report's own. A study name that would leave runs/reports/ asks for --out.
    """
    if flag is None:
        base = tracking.runs_dir() / "reports"
        out = (base / study).resolve()
        if out.parent != base.resolve():
            raise inputs.UsageError(f"--study {study!r}: not usable as a folder name under {base}; pass --out DIR")
        return out
    out = Path(flag).expanduser()
    if out.exists() and not out.is_dir():
        raise inputs.UsageError(f"--out {out}: exists and is not a folder; expected a folder (or a path to create)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise inputs.UsageError(
            f"--out {out}: a non-empty folder that study.report did not write; expected a new or empty folder, or a previous report's"
        )
    return out


def publish(staging: Path, out: Path) -> list[str]:
    """Move the files of ``staging`` (a fresh folder inside ``out``) up into ``out``, replacing a previous report's; list them in MARKER."""
    names = sorted(p.name for p in staging.iterdir())
    for name in names:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        staging.joinpath(name).replace(target)  # a rename: a link at the target is replaced, never followed
    (out / MARKER).write_text("".join(f"{name}\n" for name in names))
    return names


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    inputs.redact_logs()
    tracking.configure_mlflow()
    try:
        args = parse_args(argv)
        # MLflow, Optuna and matplotlib load after the flags: --help and a bad flag answer at once
        import mlflow

        from study.report.finals import write_report
        from study.report.sections import find_parent

        uri = tracking.resolve_tracking_uri(args.tracking_uri)
        tracking.check_store(uri, "study.report")
        client = mlflow.MlflowClient(uri)
        parent = find_parent(client, args.study, args.experiment)
        out = out_folder(args.out, args.study)
        out.mkdir(parents=True, exist_ok=True)
    except inputs.UsageError as error:
        return inputs.print_error(error)
    # The report is written into a fresh folder of its own, so its clean-up and the upload below see only its files.
    staging = Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    try:
        write_report(client, parent, staging, args.top)
        if not args.no_log:
            for path in logged_files(client, parent, staging):
                client.log_artifact(parent.info.run_id, str(path), artifact_path="report")
        publish(staging, out)
    except inputs.UsageError as error:  # a parent run that holds no study's record
        return inputs.print_error(error)
    except OSError as error:  # a full or read-only disk: one line; the staging folder, all that was written, goes
        return inputs.disk_full_exit(error, [str(out)], "no report was written: free space there or pass --out elsewhere")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"report: {out / 'report.md'}, in one file with its pictures: {out / 'report.html'}")
    if not args.no_log:
        print(f"  also in MLflow run {parent.info.run_id}, artifacts report/ (report.html opens in the run's Artifacts tab)")
    return 0

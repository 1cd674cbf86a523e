"""python -m study.sync: write a study's kept records to MLflow after an outage.

While the MLflow tracking server is unreachable, study.launch keeps trial
records in a local spool file (./runs/spool/NAME.jsonl) and the trials
themselves in the Optuna storage. This command writes both to MLflow once it
is back: the trial runs with every epoch, then the study's best config,
trials table, plots and summary metrics on the parent run. A study whose
records are complete (its parent run FINISHED, no records kept) is left as it
is, and the command says so: running it twice writes nothing twice.

Example:
  python -m study.sync --study default-20261121-120000 --tracking-uri http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from study import inputs, names
from study.inputs import UsageError
from study.records import tracking
from study.records.study_record import StudyRecord


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.sync", description=doc[1], epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--study", required=True, help="the study's name (its --study-name)")
    tracking.add_tracking_flags(parser.add_argument, f"MLflow experiment of the study (default {tracking.DEFAULT_EXPERIMENT})")
    args = parser.parse_args(argv)
    # Optuna and MLflow load after the flags: --help and a bad flag answer at once
    import optuna

    from study import console
    from study.records import ending, locks
    from study.records.parent import study_parent
    from study.records.trials import TrialRecorder, spool_path
    from study.search.journal import open_storage

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    inputs.redact_logs()  # the recorder names the tracking URI when MLflow is away, MLflow its requests' URLs
    tracking.configure_mlflow()
    try:
        names.check_names({"--study": args.study, "--experiment": args.experiment})
        uri = tracking.resolve_tracking_uri(args.tracking_uri)
        tracking.check_store(uri, "study.sync")
        with locks.store_setup_lock(uri):  # one driver at a time creates or migrates a new local store
            experiment_id = tracking.setup(uri, args.experiment)
        run = study_parent(uri, args.experiment, args.study, "--study")
        record = StudyRecord.from_params(run.data.params, where=f"study {args.study!r}")
        # a study whose driver still runs (its search, or its race) writes its own records: the study's lock says so
        advice = f"expected a study whose driver has ended (a running one writes its records itself); follow it: {console.ui_command(uri)}"
        with locks.study_lock(locks.lock_folder(record.optuna_storage, tracking.runs_dir()), args.study, advice):
            study = optuna.load_study(study_name=args.study, storage=open_storage(record.optuna_storage))
            storage = record.optuna_storage
            recorder = TrialRecorder(uri, experiment_id, run.info.run_id, args.study, spool_path(args.study), optuna_storage=storage)
            if run.info.status == "FINISHED" and recorder.queued() == 0:
                print(f"study {args.study}: nothing to sync; its MLflow records are complete (parent run FINISHED, no records kept)")
                return 0
            wall_s = float(run.data.metrics.get("wall_time_s", 0.0))
            named = {"experiment": args.experiment, "final_epochs": record.final_epochs}
            summary = ending.finish_study(study, recorder, record.metric, record.mode, wall_s, **named)
    except UsageError as error:
        return inputs.print_error(error)
    console.print_study_summary(dataclasses.replace(summary, uri=inputs.redacted(summary.uri)), record.metric)
    return 0 if summary.mlflow_synced else 1


if __name__ == "__main__":
    sys.exit(main())

"""python -m study.launch: a hyperparameter study with Optuna TPE + ASHA on Ray, recorded in MLflow.

Every trial trains the training core on the fit classes and is scored on the
validation classes (never on the test classes). Optuna's TPE (seeded)
proposes configs from a YAML search space; ASHA stops weak trials at rungs
measured in epochs, and those trials reach Optuna as PRUNED. The driver writes
one MLflow parent run per study and one child run per trial; at the end the
parent gets best_config.yaml, a CSV of all trials and plots. Then
`python -m study.final --study NAME` retrains the best config and tests it.

Examples:
  python -m study.launch                                   # default space, Omniglot, local Ray/MLflow/Optuna
  python -m study.launch --space smoke --num-samples 4     # a quick check of a set-up (generated data)
  python -m study.launch --space search_spaces/ice.yaml --num-samples 40 --epochs 20 --address auto
  python -m study.launch --study-name NAME --resume        # continue an interrupted study
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
import optuna

from study import tracking
from study.spaces import Space, SpaceError, load_space, parse_space
from study.tracking import UsageError
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import DATA_ROOT_ENV, DatasetError, load_dataset, split_classes

log = logging.getLogger(__name__)

METRICS = {"val_recall_at_1": "max", "val_map_at_r": "max", "val_nmi": "max", "val_r_precision": "max"}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
INPUT_ERRORS = (UsageError, ConfigError, DatasetError)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m study.launch", description=doc[1], epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    a = parser.add_argument
    a(
        "--space",
        help="search space: a YAML file, or the name of a shipped one in search_spaces/ "
        "(default, heated_softmax, ice, paper_ablation, smoke, and the repro_* grids of docs/results.md); "
        "default: default (with --resume: the study's own)",
    )
    a("--dataset", help="override the space's dataset (omniglot, cub200, cars196, sop, inshop, folder, synthetic)")
    a("--data-root", help=f"folder holding the datasets (default: ${DATA_ROOT_ENV}); every node of a cluster needs it at this path")
    a("--num-samples", type=int, help="number of trials (default: 16; a grid space runs each grid point once)")
    a("--max-concurrent", type=int, default=2, help="trials running at once (default 2); each needs --cpus-per-trial CPUs")
    a("--cpus-per-trial", type=float, default=1.0, help="CPUs reserved per trial (default 1); torch uses that many threads")
    a("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial; fractions pack several trials on one GPU (default 0)")
    a("--epochs", type=int, help="epochs per trial, the ASHA max_t (default: the space's epochs)")
    a("--grace-period", type=int, default=2, help="ASHA: epochs every trial runs before it can be stopped (default 2)")
    a("--reduction-factor", type=float, default=3.0, help="ASHA: keep the top 1/factor at each rung (default 3)")
    a("--metric", default="val_recall_at_1", help=f"validation metric to maximize: {', '.join(METRICS)} (default val_recall_at_1)")
    a("--address", help="join a running Ray cluster (e.g. 'auto' on a node of a `ray up` cluster); default: a local Ray")
    a("--storage-path", help="where Ray keeps trial checkpoints; on a cluster a shared path or s3:// URI (default: ./runs/ray)")
    a("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else a local sqlite store under ./runs)")
    a("--optuna-storage", help="Optuna storage: journal:PATH or a database URL (default: journal:./runs/optuna/journal.log)")
    a("--experiment", default="dml-studies", help="MLflow experiment name (default dml-studies)")
    a("--study-name", help="name of the study (letters, digits, _ . -); default: <space>-<date>-<time>")
    a(
        "--resume",
        action="store_true",
        help="continue the interrupted study --study-name: finished trials are kept, interrupted ones continue from their checkpoints",
    )
    a(
        "--sampler",
        choices=("tpe", "random"),
        default="tpe",
        help="how a searched space is sampled: tpe (default; ASHA-stopped trials told as PRUNED) or random (a baseline); "
        "grid spaces always use the grid",
    )
    a("--seed", type=int, default=0, help="seed of the sampler (trials keep their config's seed)")
    a("--max-failures", type=int, default=1, help="retries of a failed trial from its last checkpoint (default 1)")
    args = parser.parse_args(argv)

    def bad(flag: str, value: Any, expected: str) -> None:
        parser.error(f"{flag} {value}: expected {expected}")

    if args.num_samples is not None and args.num_samples < 1:
        bad("--num-samples", args.num_samples, "an integer >= 1")
    if args.max_concurrent < 1:
        bad("--max-concurrent", args.max_concurrent, "an integer >= 1")
    if not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        bad("--cpus-per-trial", args.cpus_per_trial, "a finite number > 0")
    if not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        bad("--gpus-per-trial", args.gpus_per_trial, "a finite number >= 0")
    if args.epochs is not None and args.epochs < 1:
        bad("--epochs", args.epochs, "an integer >= 1")
    if args.grace_period < 1:
        bad("--grace-period", args.grace_period, "an integer >= 1")
    if not (math.isfinite(args.reduction_factor) and args.reduction_factor > 1):
        bad("--reduction-factor", args.reduction_factor, "a finite number > 1")
    if args.metric not in METRICS:
        bad("--metric", args.metric, f"one of {', '.join(METRICS)}")
    if args.max_failures < 0:
        bad("--max-failures", args.max_failures, "an integer >= 0")
    if args.study_name is not None and (not NAME_PATTERN.match(args.study_name) or ".." in args.study_name):
        bad("--study-name", repr(args.study_name), "letters, digits, '_', '.', '-' (no path separators or '..'), at most 100")
    if args.resume and not args.study_name:
        parser.error("--resume needs --study-name NAME (the study to continue)")
    return args


# ----------------------------------------------------------------------------- validation
def resumed_settings(args: argparse.Namespace) -> None:
    """With --resume, the space and epochs default to those the study was started with (its MLflow parent's params)."""
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    tracking.check_reachable(uri)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(args.experiment)
    parent = tracking.find_study_run(client, experiment.experiment_id, args.study_name) if experiment else None
    if parent is None:
        raise UsageError(
            f"--resume: no study {args.study_name!r} in MLflow experiment {args.experiment!r} at {uri}; "
            "expected the --study-name of an interrupted study"
        )
    params = parent.data.params
    args.space = args.space or params.get("space")
    if args.epochs is None and "epochs" in params:
        args.epochs = int(params["epochs"])


def prepare_space(args: argparse.Namespace) -> Space:
    """The space with --dataset / --epochs applied, validated as a whole."""
    space = load_space(args.space)
    overrides = {k: v for k, v in (("dataset", args.dataset), ("epochs", args.epochs)) if v is not None}
    if not overrides:
        return space
    searched = {p.name for p in space.params} | set(space.grid) | {k for v in space.variants.values() for k in v}
    clash = sorted(searched & set(overrides))
    if clash:
        raise SpaceError(f"{space.path}: {clash[0]} is set by the space's params, grid or variants; drop --{clash[0]}")
    data = tracking.read_yaml(space.path, "a search space")
    data["fixed"] = {**(data.get("fixed") or {}), **overrides}
    return parse_space(data, space.path)


def base_config(space: Space) -> TrainConfig:
    """The config of the space's fixed values (first variant for a variants space): dataset, epochs, ..."""
    first = {"variant": next(iter(space.variants))} if space.variants else {}
    return TrainConfig.from_dict(space.to_config(first), source=space.path)


def max_classes_per_batch(space: Space) -> int:
    """The largest classes_per_batch any trial of ``space`` can get."""
    default = int(space.fixed.get("classes_per_batch", TrainConfig().classes_per_batch))
    values = [int(v.get("classes_per_batch", default)) for v in space.variants.values()]
    values += [int(v) for v in space.grid.get("classes_per_batch", [])]
    searched = [p for p in space.params if p.name == "classes_per_batch"]
    for p in searched:
        if p.choices:
            values.append(max(int(c) for c in p.choices))
        elif isinstance(p.high, dict) or isinstance(p.low, dict):
            values.append(10**9)  # bounded by another parameter: checked trial by trial by the sampler's draws
        else:
            step = p.step or 1
            values.append(int(p.low + ((p.high - p.low) // step) * step))
        if p.when:
            values.append(default)  # inactive in some trials: the default applies there
    if not values:
        values.append(default)
    return max(values)


def check_dataset(space: Space, data_root: str | None) -> int:
    """Load the dataset once on the driver: the space must be able to fill its batches. Returns #fit classes."""
    config = base_config(space)
    splits = load_dataset(config.dataset, data_root, config.image_size)
    fit_classes, _ = split_classes(splits.train.labels, config.val_fraction)
    largest = max_classes_per_batch(space)
    if largest > len(fit_classes):
        raise SpaceError(
            f"{space.path}: classes_per_batch reaches {largest}, but {config.dataset!r} has {len(fit_classes)} fit classes "
            f"(val_fraction {config.val_fraction}); expected classes_per_batch <= {len(fit_classes)}"
        )
    return len(fit_classes)


def absolute_data_root(flag: str | None) -> str | None:
    """The data root as an absolute path: Tune runs each trial in its own working directory."""
    value = flag or os.environ.get(DATA_ROOT_ENV)
    return str(Path(value).expanduser().resolve()) if value else None


def check_storage(path: str) -> str:
    """A local storage path must be a writable folder; URIs (s3://, gs://) are left to Ray."""
    if "://" in path:
        return path
    folder = Path(path).expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-") as f:
            f.write(b"0" * 1024 * 1024)  # a full disk fails here, not mid-study
            f.flush()
            os.fsync(f.fileno())
    except OSError as error:
        raise UsageError(f"--storage-path {folder}: not writable ({error.strerror or error}); expected a writable folder") from None
    return str(folder)


# ----------------------------------------------------------------------------- the study
def open_optuna(args, storage_url: str, study_name: str, mode: str) -> optuna.Study:
    from study.search import open_storage

    storage = open_storage(storage_url)
    names = {s.study_name for s in optuna.study.get_all_study_summaries(storage)}
    if args.resume:
        if study_name not in names:
            raise UsageError(f"--resume: no Optuna study {study_name!r} in {storage_url}; expected an existing study name")
        return optuna.load_study(study_name=study_name, storage=storage)
    if study_name in names:
        raise UsageError(
            f"--study-name {study_name}: a study of that name exists in {storage_url}; pass --resume to continue it or choose another name"
        )
    return optuna.create_study(study_name=study_name, storage=storage, direction="maximize" if mode == "max" else "minimize")


def run_study(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter

    from study.callbacks import MlflowTrials, Progress, TrialRecorder
    from study.search import OptunaSearcher
    from trainables.dml import train_dml

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.resume:
        resumed_settings(args)
    args.space = args.space or "default"
    space = prepare_space(args)
    max_epochs = base_config(space).epochs
    metric, mode = args.metric, METRICS[args.metric]
    if args.grace_period > max_epochs:
        raise UsageError(f"--grace-period {args.grace_period}: larger than the {max_epochs} epochs per trial; expected <= {max_epochs}")
    n_fit = check_dataset(space, args.data_root)
    num_samples = args.num_samples or (space.grid_size() if space.is_grid else 16)
    study_name = args.study_name or f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = tracking.runs_dir()
    storage_path = check_storage(args.storage_path or str(runs / "ray"))
    optuna_url = args.optuna_storage or f"journal:{runs / 'optuna' / 'journal.log'}"
    if optuna_url.startswith("journal:"):
        Path(optuna_url.removeprefix("journal:")).parent.mkdir(parents=True, exist_ok=True)
    experiment_dir = os.path.join(storage_path, study_name)
    if args.resume and "://" not in storage_path and not Path(experiment_dir).is_dir():
        raise UsageError(f"--resume: no study {study_name!r} under {storage_path}; expected the --study-name of an interrupted study")

    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    tracking.check_reachable(uri)
    experiment_id = tracking.setup(uri, args.experiment)
    client = mlflow.MlflowClient(uri)
    parent = tracking.find_study_run(client, experiment_id, study_name)
    if args.resume and parent is None:
        raise UsageError(f"--resume: no MLflow parent run for study {study_name!r} in experiment {args.experiment!r} at {uri}")
    if not args.resume and parent is not None:
        raise UsageError(f"--study-name {study_name}: MLflow already has this study; pass --resume or choose another name")
    # without --address always a fresh local Ray, never one that happens to run on this machine
    ray.init(
        address=args.address or "local",
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
        runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}} if args.address is None else None,
    )
    try:
        if args.gpus_per_trial > 0 and ray.cluster_resources().get("GPU", 0) <= 0:
            raise UsageError(f"--gpus-per-trial {args.gpus_per_trial}: the Ray cluster has no GPUs; pass --gpus-per-trial 0")
        # from here on the study exists: its Optuna study and MLflow parent run are created together
        study = open_optuna(args, optuna_url, study_name, mode)
        extra = {
            "metric": metric,
            "mode": mode,
            "num_samples": num_samples,
            "epochs": max_epochs,
            "optuna_storage": optuna_url,
            "storage_path": storage_path,
            "fit_classes": n_fit,
        }
        try:
            parent = parent or create_parent(client, experiment_id, study_name, space, args, extra)
        except BaseException:
            if not args.resume:  # no half-created study: the Optuna study goes with the parent run
                optuna.delete_study(study_name=study_name, storage=study._storage)
            raise
    except BaseException:
        ray.shutdown()
        raise
    if args.resume:
        client.update_run(parent.info.run_id, status="RUNNING")
    parent_id = parent.info.run_id
    started = time.time()
    try:
        trainable = tune.with_resources(
            tune.with_parameters(train_dml, data_root=absolute_data_root(args.data_root)),
            {"cpu": args.cpus_per_trial, "gpu": args.gpus_per_trial},
        )
        recorder = TrialRecorder(uri, experiment_id, parent_id, study_name, max_epochs, spool_path(study_name))
        if args.resume:
            recorder.flush(force=True)  # records an interrupted study kept while MLflow was away
            reconcile_before_resume(study, client, experiment_id, parent_id, experiment_dir)
            tuner = tune.Tuner.restore(experiment_dir, trainable, resume_unfinished=True, resume_errored=False)
        else:
            searcher = OptunaSearcher(
                space, optuna_url, study_name, metric=metric, mode=mode, max_epochs=max_epochs, seed=args.seed, sampler=args.sampler
            )
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(
                    metric=metric,
                    mode=mode,
                    num_samples=num_samples,
                    search_alg=ConcurrencyLimiter(searcher, max_concurrent=args.max_concurrent),
                    scheduler=ASHAScheduler(
                        time_attr="training_iteration",
                        max_t=max_epochs,
                        grace_period=args.grace_period,
                        reduction_factor=args.reduction_factor,
                    ),
                ),
                run_config=tune.RunConfig(
                    name=study_name,
                    storage_path=storage_path,
                    verbose=0,
                    callbacks=[
                        MlflowTrials(recorder),
                        Progress(metric, mode, max_epochs, num_samples),
                    ],
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    failure_config=tune.FailureConfig(max_failures=args.max_failures),
                ),
            )
        print(
            f"study {study_name}: {num_samples} trials of up to {max_epochs} epochs, space {space.path}, "
            f"{metric} ({mode}), {args.max_concurrent} at once; Ray at {ray.get_runtime_context().gcs_address}",
            flush=True,
        )
        tuner.fit()
        summary = finish_study(study, recorder, metric, mode, time.time() - started)
    except BaseException as error:
        reason = "interrupted" if isinstance(error, KeyboardInterrupt) else tracking.first_error_line(str(error)) or type(error).__name__
        try:
            ids = [r.info.run_id for r in tracking.child_runs(client, experiment_id, parent_id)]
            tracking.fail_orphans(client, ids, f"study stopped: {reason}")
            client.set_tag(parent_id, "failure_reason", reason)
            client.set_terminated(parent_id, status="KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        except Exception as mlflow_error:  # MLflow itself may be what failed
            detail = tracking.first_error_line(str(mlflow_error))
            print(f"warning: could not mark the study's MLflow runs as stopped ({detail})", file=sys.stderr)
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return {"study_name": study_name, "uri": uri, "parent_run_id": parent_id, "experiment": args.experiment, **summary}


def create_parent(client, experiment_id: str, study_name: str, space: Space, args: argparse.Namespace, extra: dict[str, Any]):
    """The study's MLflow parent run, with the study's settings as params and its space as an artifact."""
    tags = {**tracking.reproducibility_tags(), "kind": "study", "study_name": study_name, "space": space.path}
    parent = client.create_run(experiment_id, run_name=study_name, tags=tags)
    params = {
        "space": space.path,
        "grace_period": args.grace_period,
        "reduction_factor": args.reduction_factor,
        "max_concurrent": args.max_concurrent,
        "cpus_per_trial": args.cpus_per_trial,
        "gpus_per_trial": args.gpus_per_trial,
        "seed": args.seed,
        "sampler": "grid" if space.is_grid else args.sampler,
        **extra,
        **{f"fixed.{k}": v for k, v in space.fixed.items()},
    }
    client.log_batch(parent.info.run_id, params=[mlflow.entities.Param(k, str(v)) for k, v in params.items()])
    client.log_artifact(parent.info.run_id, space.path)
    return parent


def reconcile_before_resume(study: optuna.Study, client, experiment_id: str, parent_id: str, experiment_dir: str) -> None:
    """Before a resume: Optuna trials left RUNNING with no Tune trial to continue them are marked FAIL."""
    known = set()
    for path in Path(experiment_dir).glob("searcher-state-*.pkl"):
        try:
            import json

            known |= set(json.loads(path.read_text()).get("numbers", {}).values())
        except (OSError, ValueError):
            continue
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.number not in known:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def spool_path(study_name: str) -> str:
    return str(tracking.runs_dir() / "spool" / f"{study_name}.jsonl")


def summarize_study(study: optuna.Study, mode: str, wall_s: float) -> dict[str, Any]:
    """Counts, the best complete trial and its config, from the Optuna storage (the study's record of truth)."""
    trials = study.get_trials(deepcopy=False)
    counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value)]
    best = None
    if complete:
        best = max(complete, key=lambda t: t.value) if mode == "max" else min(complete, key=lambda t: t.value)
    metrics = {
        "n_trials": len(trials),
        "n_complete": counts["COMPLETE"],
        "n_pruned": counts["PRUNED"],
        "n_failed": counts["FAIL"],
        "wall_time_s": wall_s,
        "epochs_spent": float(sum(len(t.intermediate_values) for t in trials)),
    }
    return {"metrics": metrics, "best": best, "best_config": (best.user_attrs.get("config") if best else None)}


def finish_study(study: optuna.Study, recorder, metric: str, mode: str, wall_s: float) -> dict[str, Any]:
    """Writes the kept trial records, best config, trials table, plots and summary metrics to the parent run.

    When MLflow cannot be reached, nothing is lost: the trial records stay in the spool and the Optuna
    storage holds the rest; ``python -m study.sync --study NAME`` writes them later.
    """
    # the study is over: a trial still RUNNING was orphaned by a killed driver and never continued
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    summary = summarize_study(study, mode, wall_s)
    summary["mlflow_synced"] = False
    try:
        if not recorder.flush(force=True):
            raise ConnectionError("the kept trial records could not be written")
        write_study_records(study, recorder, metric, summary)
        summary["mlflow_synced"] = True
    except Exception as error:  # any MLflow failure: report, keep, and let the user sync
        summary["mlflow_error"] = tracking.first_error_line(str(error)) or type(error).__name__
    summary["outages"] = sum(e["event"] == "unreachable" for e in recorder.events())
    return summary


def write_study_records(study: optuna.Study, recorder, metric: str, summary: dict[str, Any]) -> None:
    from study.report import study_artifacts

    client, parent_id = recorder.client, recorder.parent_run_id
    children = {r.data.tags.get("trial_id"): r for r in tracking.child_runs(client, recorder.experiment_id, parent_id)}
    for t in study.get_trials(deepcopy=False):
        run = children.get(t.user_attrs.get("tune_trial_id"))
        if run is not None:
            client.set_tag(run.info.run_id, "optuna_trial_number", str(t.number))
            client.set_tag(run.info.run_id, "optuna_state", t.state.name)
    orphans = [run.info.run_id for run in children.values() if run.info.status == "RUNNING"]
    tracking.fail_orphans(client, orphans, "orphaned: its trial was interrupted with the driver and not continued")
    best = summary["best"]
    with tempfile.TemporaryDirectory() as tmp:
        for path in study_artifacts(study, children, Path(tmp), metric, best):
            client.log_artifact(parent_id, str(path))
    metrics = dict(summary["metrics"])
    if best is not None:
        metrics[f"best_{metric}"] = float(best.value)
        client.set_tag(parent_id, "best_trial", best.user_attrs.get("tune_trial_id", str(best.number)))
    for key, value in metrics.items():
        client.log_metric(parent_id, key, float(value))
    client.set_terminated(parent_id, status="FINISHED")


def print_summary(outcome: dict[str, Any], metric: str) -> None:
    m = outcome["metrics"]
    if outcome.get("outages"):
        print(
            f"\nMLflow was unreachable {outcome['outages']} time(s) during the study; training went on"
            + ("; the records kept meanwhile were written when it returned." if outcome.get("mlflow_synced", True) else ".")
        )
    if not outcome.get("mlflow_synced", True):
        print(
            f"\nwarning: MLflow at {outcome['uri']} could not be written at the end ({outcome.get('mlflow_error')}). Nothing is lost: "
            f"trial records are kept in {spool_path(outcome['study_name'])} and the trials in the Optuna storage.\n"
            f"write them when MLflow is back:  python -m study.sync --study {outcome['study_name']} --experiment {outcome['experiment']}"
            + (f" --tracking-uri {outcome['uri']}" if not tracking.is_local_sqlite(outcome["uri"]) else "")
        )
    print(
        f"\nstudy {outcome['study_name']} finished in {m['wall_time_s']:.0f} s: {m['n_trials']} trials, "
        f"{m['n_complete']} complete, {m['n_pruned']} pruned by ASHA, {m['n_failed']} failed, {m['epochs_spent']:.0f} epochs trained"
    )
    best = outcome["best"]
    if best is None:
        print("no trial completed; nothing to retrain")
    else:
        print(f"best trial {best.user_attrs.get('tune_trial_id')} (Optuna #{best.number}): {metric} = {best.value:.4f}")
        for key, value in sorted((outcome["best_config"] or {}).items()):
            print(f"  {key}: {value}")
        print(
            f"\nretrain it and test it:  python -m study.final --study {outcome['study_name']} --experiment {outcome['experiment']}"
            + (f" --tracking-uri {outcome['uri']}" if not tracking.is_local_sqlite(outcome["uri"]) else "")
        )
    print(f"open the MLflow UI:       {tracking.ui_command(outcome['uri'])}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        outcome = run_study(args)
    except INPUT_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; continue with --resume --study-name NAME", file=sys.stderr)
        return 130
    print_summary(outcome, args.metric)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m study.final: retrain a fixed config on all training classes and test it.

Trains the config on the fit + validation classes (all of the dataset's
training classes) once per seed, evaluates on the unseen test classes, and
records everything in MLflow: params, per-epoch metrics, test metrics per seed
and their mean and spread, positive/negative pair similarity histograms, the
resolved config and the model as a pyfunc model (uint8 images in, l2-normalized
embeddings out).

Examples:
  python -m study.final --data-root ../shared/data              # HBN on Omniglot (embedded default)
  python -m study.final --config configs/omniglot_sm.yaml --seeds 3
  python -m study.final --space paper_ablation --seeds 3      # every variant of a grid space, 3 seeds each
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import mlflow
import numpy as np

from study import tracking
from study.plots import pair_similarities, similarity_histogram
from study.tracking import UsageError
from trainables.core.checkpoint import CheckpointError
from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import DATA_ROOT_ENV, DatasetError, load_dataset
from trainables.core.engine import Run, TrainingDiverged, build_run, default_device, embed, fit
from trainables.core.models import WeightsError

log = logging.getLogger(__name__)
DEFAULT_CONFIG = "omniglot_hbn.yaml"
INPUT_ERRORS = (UsageError, ConfigError, DatasetError, WeightsError, CheckpointError)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m study.final",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument(
        "--config",
        help=f"YAML file of config keys (see DESIGN.md); default: the embedded {DEFAULT_CONFIG}, "
        "heated-up softmax with BN features, alpha 16 -> 4, on Omniglot",
    )
    parser.add_argument(
        "--space",
        help="a grid or variants search space (file or shipped name): train every configuration of it with --seeds seeds, "
        "as children of one parent run named after the space (tag study_name), for a table with python -m study.report",
    )
    parser.add_argument(
        "--data-root", help=f"folder holding the datasets (default: ${DATA_ROOT_ENV}); Omniglot is looked up in <root>/omniglot/"
    )
    parser.add_argument("--download", action="store_true", help="download Omniglot into the data root when it is missing (needs internet)")
    parser.add_argument(
        "--seeds", type=int, default=3, help="train this many seeds (config seed, +1, ...); report mean and spread (default 3)"
    )
    parser.add_argument("--epochs", type=int, help="override the config's epochs (e.g. 2 for a smoke run)")
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else a local sqlite store under ./runs)"
    )
    parser.add_argument(
        "--study",
        help="retrain the best config of this study (its parent run's best_config.yaml); "
        "the seed runs become children of the study's parent run and the model is registered as NAME-embedding",
    )
    parser.add_argument("--experiment", help="MLflow experiment (default: final; with --study: dml-studies, as study.launch)")
    parser.add_argument("--run-name", help="name of the parent MLflow run (default: the config file's name)")
    parser.add_argument("--register", metavar="NAME", help="register the first seed's model in the MLflow model registry under NAME")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument(
        "--num-workers", type=int, default=0, help="data-loading worker processes (photos benefit; in-memory Omniglot does not)"
    )
    args = parser.parse_args(argv)
    if sum(bool(x) for x in (args.study, args.config, args.space)) > 1:
        parser.error("--study, --config and --space exclude each other: retrain a study's best config, a config file or a grid space")
    if args.experiment is None:
        args.experiment = "dml-studies" if args.study else "final"
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected an integer >= 1")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs {args.epochs}: expected an integer >= 1")
    if args.num_workers < 0:
        parser.error(f"--num-workers {args.num_workers}: expected an integer >= 0")
    return args


def load_config(path: str | None, epochs: int | None = None) -> tuple[TrainConfig, str]:
    """The config of ``path`` (or the embedded default) and a name for it."""
    if path is None:
        text = resources.files("configs").joinpath(DEFAULT_CONFIG).read_text()
        import yaml

        values, source, name = yaml.safe_load(text), f"configs/{DEFAULT_CONFIG} (embedded)", Path(DEFAULT_CONFIG).stem
    else:
        values, source, name = tracking.read_yaml(path, "a mapping of config keys"), path, Path(path).stem
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise UsageError(f"{source}: expected a mapping of config keys, got {type(values).__name__}")
    if epochs is not None:
        values = {**values, "epochs": epochs}
    return TrainConfig.from_dict(values, source=source), name


def summarize(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Mean and (sample) standard deviation of every test metric across seeds."""
    out: dict[str, float] = {}
    for key in per_seed[0]:
        values = np.array([m[key] for m in per_seed], dtype=float)
        out[f"{key}_mean"] = float(values.mean())
        out[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return out


def train_seed(config: TrainConfig, splits, device, num_workers: int, workdir: Path, register: str | None) -> dict[str, Any]:
    """One child run: train, test, histograms, model. Returns test metrics and the model URI."""
    started = time.perf_counter()

    def on_epoch(epoch: int, metrics: dict[str, float], run: Run) -> None:
        mlflow.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=epoch)
        shown = f"loss {metrics['train_loss']:.4f}  acc {metrics['train_accuracy']:.3f}"
        if "alpha" in metrics:
            shown += f"  alpha {metrics['alpha']:.2f}"
        if "test_recall_at_1" in metrics:
            shown += f"  test R@1 {metrics['test_recall_at_1']:.4f}"
        print(
            f"  seed {config.seed}  epoch {epoch:3d}/{config.epochs}  {shown}  lr {metrics['lr']:.2e}  ({metrics['time_epoch_s']:.1f} s)",
            flush=True,
        )

    run = fit(config, on_epoch, mode="final", splits=splits, device=device, eval_every=config.epochs, num_workers=num_workers)
    elapsed = time.perf_counter() - started
    test = {k: v for k, v in run.metrics.items() if k.startswith("test_")}
    embeddings = embed(run.model, run.eval_set, run.image_size, run.device).numpy()
    positive, negative = pair_similarities(embeddings, run.eval_set.labels, seed=config.seed)
    histogram = similarity_histogram(
        positive, negative, workdir / f"similarity_histogram_seed{config.seed}.png", title=f"test pair similarities, seed {config.seed}"
    )
    mlflow.log_artifact(str(histogram))
    mlflow.log_metrics(
        {
            "time_total_s": elapsed,
            "test_positive_similarity_mean": float(positive.mean()),
            "test_negative_similarity_mean": float(negative.mean()),
        }
    )
    from study.pyfunc import log_embedding_model

    info = log_embedding_model(run, workdir, registered_model_name=register)
    return {"test": test, "time_s": elapsed, "model_uri": info.model_uri, "run_id": mlflow.active_run().info.run_id}


def study_config(args: argparse.Namespace, uri: str) -> tuple[TrainConfig, str, str, str]:
    """The best config of study ``args.study``: (config, name, experiment id, parent run id)."""
    tracking.setup(uri, args.experiment)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(args.experiment)
    parent = tracking.find_study_run(client, experiment.experiment_id, args.study)
    if parent is None:
        raise UsageError(
            f"--study {args.study}: no study of that name in MLflow experiment {args.experiment!r} at {uri}; "
            "expected the --study-name of a study.launch run (and its --experiment)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(
                run_id=parent.info.run_id, artifact_path="best_config.yaml", dst_path=tmp, tracking_uri=uri
            )
        except mlflow.exceptions.MlflowException:
            raise UsageError(
                f"--study {args.study}: the study has no best_config.yaml (no trial completed); "
                "expected a finished study with at least one complete trial"
            ) from None
        values = tracking.read_yaml(path, "the study's best config")
    if args.epochs is not None:
        values = {**values, "epochs": args.epochs}
    config = TrainConfig.from_dict(values, source=f"best_config.yaml of study {args.study}")
    return config, args.study, experiment.experiment_id, parent.info.run_id


def space_configs(path: str, epochs: int | None) -> tuple[list[tuple[str, TrainConfig]], str]:
    """Every configuration of a grid or variants space, named, validated: ([(name, config)], space name)."""
    from study.spaces import VARIANT, load_space

    space = load_space(path)
    if not space.is_grid:
        raise UsageError(f"--space {path}: a searched space (params); expected a grid or variants space, whose configurations are fixed")
    names = list(space.grid_search_space())
    configs = []
    for combo in itertools.product(*space.grid_search_space().values()):
        point = dict(zip(names, combo))
        name = str(point[VARIANT]) if VARIANT in point else ",".join(f"{k}={v}" for k, v in point.items())
        overrides = {"epochs": epochs} if epochs is not None else None
        configs.append((name, TrainConfig.from_dict(space.to_config(point, overrides), source=f"{space.path} ({name})")))
    return configs, space.name


def run_final(args: argparse.Namespace) -> dict[str, Any]:
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    study_parent = None
    if args.study:
        config, name, experiment_id, study_parent = study_config(args, uri)
        configurations, source = [(name, config)], f"best_config.yaml of study {args.study}"
    elif args.space:
        configurations, name = space_configs(args.space, args.epochs)
        source = args.space
    else:
        config, name = load_config(args.config, args.epochs)
        configurations, source = [(name, config)], args.config or f"configs/{DEFAULT_CONFIG}"
    grid = bool(args.space)
    # everything that can be wrong with the input is checked before a run is created
    device = default_device() if args.device is None else __import__("torch").device(args.device)
    splits_by_key: dict[tuple, Any] = {}
    for conf_name, config in configurations:
        key = (config.dataset, config.image_size)
        if key not in splits_by_key:
            splits_by_key[key] = load_dataset(config.dataset, args.data_root, config.image_size, download=args.download)
        build_run(config, mode="final", splits=splits_by_key[key], device=device, source=source if not grid else f"{source} ({conf_name})")
    if study_parent is None:
        experiment_id = tracking.setup(uri, args.experiment)
    client = mlflow.MlflowClient(uri)
    register = args.register or (f"{name}-embedding" if args.study else None)
    first = configurations[0][1]
    seeds = [first.seed + i for i in range(args.seeds)]
    what = f"{len(configurations)} configurations of {name}" if grid else f"{name}: {first.loss}"
    print(f"final training of {what} on {first.dataset}, {first.epochs} epochs, seeds {seeds}, device {device}")
    if study_parent is None:
        run_name = args.run_name or (name if grid else f"final-{name}")
        tags = {**tracking.reproducibility_tags(), "kind": "final_grid" if grid else "final"}
        if grid:
            tags.update({"study_name": run_name, "space": str(args.space), "configurations": str(len(configurations))})
        parent_id = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        params = [mlflow.entities.Param("seeds", ",".join(map(str, seeds)))]
        if not grid:
            params += [mlflow.entities.Param(k, str(v)) for k, v in first.to_dict().items() if k != "seed"]
        client.log_batch(parent_id, params=params)
    else:
        parent_id = study_parent
    prefix = "final_" if study_parent else ""
    outcomes: dict[str, dict[str, Any]] = {}
    seed_runs: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            if grid:
                client.log_dict(parent_id, {n: c.to_dict() for n, c in configurations}, "configurations.yaml")
            else:
                client.log_artifact(parent_id, str(tracking.write_yaml(workdir / f"{prefix}config.yaml", first.to_dict())))
            for conf_name, config in configurations:
                splits = splits_by_key[(config.dataset, config.image_size)]
                if grid:
                    print(f"\n[{len(outcomes) + 1}/{len(configurations)}] {conf_name}", flush=True)
                results: list[dict[str, Any]] = []
                for i in range(len(seeds)):
                    seed_config = config.replace(seed=config.seed + i)
                    tags = {
                        **tracking.reproducibility_tags(),
                        "kind": "final_seed",
                        "seed": str(seed_config.seed),
                        "mlflow.parentRunId": parent_id,
                    }
                    if args.study:
                        tags["study_name"] = args.study
                    if grid:
                        tags["configuration"] = conf_name
                    run_name = f"{conf_name}-seed{seed_config.seed}" if grid else f"final-{name}-seed{seed_config.seed}"
                    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
                        seed_runs.append(run.info.run_id)
                        mlflow.log_params(seed_config.to_dict())
                        first_seed = i == 0 and len(outcomes) == 0
                        results.append(train_seed(seed_config, splits, device, args.num_workers, workdir, register if first_seed else None))
                summary = summarize([r["test"] for r in results])
                summary["time_per_seed_s_mean"] = float(np.mean([r["time_s"] for r in results]))
                outcomes[conf_name] = {"config": config, "results": results, "summary": summary}
                if not grid:
                    for key, value in summary.items():
                        client.log_metric(parent_id, prefix + key, value)
                    client.log_dict(parent_id, {"per_seed": results, "summary": summary}, f"{prefix}results.json")
                else:
                    client.log_dict(
                        parent_id,
                        {n: {"per_seed": o["results"], "summary": o["summary"]} for n, o in outcomes.items()},
                        "results.json",
                    )
    except BaseException as error:
        reason = "interrupted" if isinstance(error, KeyboardInterrupt) else tracking.first_error_line(str(error))
        tracking.fail_orphans(client, seed_runs, reason)
        if study_parent is None:
            client.set_tag(parent_id, "failure_reason", reason)
            client.set_terminated(parent_id, status="KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        raise
    if study_parent is None:
        client.set_terminated(parent_id, status="FINISHED")
    only = outcomes[configurations[0][0]]
    return {
        "name": name,
        "config": first,
        "uri": uri,
        "parent_run_id": parent_id,
        "outcomes": outcomes,
        "results": only["results"],
        "summary": only["summary"],
        "registered": register,
    }


def print_summary(outcome: dict[str, Any]) -> None:
    outcomes = outcome["outcomes"]
    if len(outcomes) > 1:
        keys = ("test_nmi", "test_recall_at_1", "test_recall_at_2", "test_recall_at_4", "test_recall_at_8", "test_map_at_r")
        seeds = len(outcome["results"])
        print(f"\n{outcome['name']}: test metrics over {seeds} seed(s), mean +- std")
        print(f"  {'configuration':<28}" + "".join(f"{k.removeprefix('test_'):>18}" for k in keys))
        for conf_name, o in outcomes.items():
            cells = "".join(f"{o['summary'][k + '_mean']:>10.4f} +-{o['summary'][k + '_std']:.3f}" for k in keys)
            print(f"  {conf_name:<28}{cells}")
        print(f"\nparent run: {outcome['parent_run_id']}  (report: python -m study.report --study {outcome['name']})")
        print(f"open the MLflow UI:  {tracking.ui_command(outcome['uri'])}")
        return
    summary = outcome["summary"]
    keys = [k.removesuffix("_mean") for k in summary if k.endswith("_mean") and k.startswith("test_")]
    print(f"\n{outcome['name']}: test metrics over {len(outcome['results'])} seed(s) (mean +- std)")
    for key in keys:
        print(f"  {key:<24} {summary[key + '_mean']:.4f} +- {summary[key + '_std']:.4f}")
    print(f"  {'time per seed':<24} {summary['time_per_seed_s_mean']:.0f} s")
    print(f"\nparent run: {outcome['parent_run_id']}")
    for r in outcome["results"]:
        print(f"  model: {r['model_uri']}  (run {r['run_id']})")
    if outcome["registered"]:
        print(f"  registered as: models:/{outcome['registered']}/latest")
    print(f"\nopen the MLflow UI:  {tracking.ui_command(outcome['uri'])}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        outcome = run_final(args)
    except INPUT_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingDiverged as error:
        print(f"error: training diverged: {error}", file=sys.stderr)
        return 1
    print_summary(outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A final's seeds as one model: do the concatenated embeddings of several seeds retrieve better than one seed?

``study.final --seeds N`` trains the pick N times; each seed is a model of its own. An ensemble of them embeds an
image with each and concatenates the l2-normalized embeddings (N x d), so its cosine similarity is the mean of the
seeds' similarities. This bench measures what that gains, and decides on the validation classes first:

``val``: each pick of a ``bench/verdicts.py`` run (its JSON's ``results[*].config``) trains on the fit classes of its
study's validation split with ``--seeds``, to ``--epochs`` (default: 2 x the trials' epochs, the final budget of the
default space), and is scored on the validation classes alone and as the ensemble of its seeds. Each run's
validation embeddings go to ``--work`` (``pick<S>_seed<k>.npz``; runs already there are skipped, so it resumes).

``test``: the models ``study.final --study`` trained for each pick (kept by ``bench/verdicts.py --keep``), each seed
alone and as their ensemble, on the test classes: R@1, MAP@R and the 20-way one-shot error. Only for the report.

  DML_DATA_ROOT=../shared/data python bench/seed_ensemble.py val --verdicts docs/bench/verdicts_val30.json \\
      --work /tmp/ens --out docs/bench/seed_ensemble_val.json
  DML_DATA_ROOT=../shared/data python bench/seed_ensemble.py test --verdicts docs/bench/verdicts_val30.json \\
      --keep /work/verdict_runs_vf --out docs/bench/seed_ensemble_test.json

Training runs use one torch thread each, ``--parallel`` at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

RETRIEVAL = ("recall_at_1", "map_at_r")


def ensemble(parts: list[np.ndarray]) -> np.ndarray:
    """(N, sum of d_i): the parts (N, d_i) as study.final joins its seeds (``engine.concatenated``)."""
    import torch

    from trainables.core.engine import Embeddings, concatenated

    return concatenated([Embeddings(torch.from_numpy(np.asarray(part, np.float32))) for part in parts]).queries.numpy()


def scores(embeddings: np.ndarray, labels: np.ndarray, groups: dict | None = None, seed: int = 0) -> dict[str, float]:
    """R@1 and MAP@R of ``embeddings`` (N, D) on ``labels`` (N,); with ``groups`` (class -> alphabet) the 20-way one-shot error."""
    from trainables.core.engine import ONE_SHOT_WAYS
    from trainables.core.metrics import evaluate_embeddings, one_shot_error

    found = evaluate_embeddings(embeddings, labels, ks=(1,), seed=seed)
    out = {key: float(found[key]) for key in RETRIEVAL}
    if groups is not None:
        out["one_shot_error"] = one_shot_error(embeddings, labels, groups, ways=ONE_SHOT_WAYS, seed=seed)
    return out


def val_job(config: dict, seed: int, epochs: int, path: Path) -> dict:
    """Train ``config`` with ``seed`` on the fit classes to ``epochs``; its validation embeddings go to ``path``."""
    return train_job({**config, "seed": seed}, "study", epochs, path)


def train_job(config: dict, mode: str, epochs: int, path: Path) -> dict:
    """Train ``config`` to ``epochs`` with one torch thread (``mode`` study: on the fit classes, scored on the validation
    classes; final: on all training classes, scored on the test classes); its evaluation embeddings and labels go to
    ``path``, whole or not at all."""
    import torch

    from trainables.core.config import TrainConfig
    from trainables.core.engine import fit

    torch.set_num_threads(1)
    train_config = TrainConfig.from_dict({**config, "epochs": epochs}, source="bench")
    started = time.perf_counter()
    run = fit(train_config, mode=mode, data_root=os.environ.get("DML_DATA_ROOT"), eval_every=epochs, num_workers=0)
    seconds = time.perf_counter() - started
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, embeddings=run.embeddings.queries.numpy(), labels=np.asarray(run.eval_set.labels), seconds=seconds)
    partial.replace(path)  # whole or absent: a killed run leaves no file the report would read
    return {"path": str(path), "seconds": seconds}


def compare(per_seed: list[dict[str, float]], joint: dict[str, float]) -> dict:
    """Each seed's scores, their mean, the ensemble's, and the ensemble minus the mean."""
    mean = {key: float(np.mean([s[key] for s in per_seed])) for key in joint}
    return {"per_seed": per_seed, "mean": mean, "ensemble": joint, "gain": {key: joint[key] - mean[key] for key in joint}}


def run_val(args: argparse.Namespace, results: list[dict]) -> list[dict]:
    args.work.mkdir(parents=True, exist_ok=True)
    jobs = []
    for result in results:
        epochs = args.epochs or 2 * int(result["config"]["epochs"])
        for seed in args.seeds:
            path = args.work / f"pick{result['seed']}_seed{seed}.npz"
            if not path.exists():
                jobs.append((result["config"], seed, epochs, path))
    with ProcessPoolExecutor(args.parallel) as pool:
        for done in pool.map(val_job, *zip(*jobs)) if jobs else ():
            print(json.dumps(done), flush=True)
    rows = []
    for result in results:
        loaded = [np.load(args.work / f"pick{result['seed']}_seed{seed}.npz") for seed in args.seeds]
        labels = loaded[0]["labels"]
        per_seed = [scores(f["embeddings"], labels) for f in loaded]
        row = compare(per_seed, scores(ensemble([f["embeddings"] for f in loaded]), labels))
        seconds = [float(f["seconds"]) for f in loaded]
        rows.append({"sampler_seed": result["seed"], "pick": result["picked_trial"], "seconds": seconds, **row})
    return rows


def final_models(store: Path) -> list[tuple[int, str]]:
    """(seed, model URI) of every finished final seed run of a kept study, by seed."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("dml-studies")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.kind = 'final_seed' and attributes.status = 'FINISHED'")
    by_run = {m.source_run_id: m.model_uri for m in client.search_logged_models([experiment.experiment_id])}
    return sorted((int(run.data.params["seed"]), by_run[run.info.run_id]) for run in runs)


def test_embeddings(model_uri: str, images, store: Path) -> np.ndarray:
    """The test images' embeddings by the logged model, as study.final's evaluation computed them."""
    import mlflow
    import torch

    from trainables.core.engine import embed

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    model = mlflow.pyfunc.load_model(model_uri).unwrap_python_model()  # one seed's: its model and image size
    return embed(model.model, images, model.image_size, torch.device("cpu")).numpy()


def run_test(args: argparse.Namespace, results: list[dict]) -> list[dict]:
    from trainables.core.data import alphabets, load_dataset

    rows = []
    for result in results:
        store = args.keep / result["study"] / "mlflow.db"
        models = final_models(store)
        config = result["config"]
        test = load_dataset(config["dataset"], os.environ.get("DML_DATA_ROOT"), config["image_size"]).test
        labels, groups = np.asarray(test.labels), alphabets(test)
        parts = [test_embeddings(uri, test, store) for _, uri in models]
        per_seed = [scores(part, labels, groups, seed) for part, (seed, _) in zip(parts, models)]
        row = compare(per_seed, scores(ensemble(parts), labels, groups, models[0][0]))
        rows.append({"sampler_seed": result["seed"], "pick": result["picked_trial"], "seeds": [s for s, _ in models], **row})
        print(json.dumps(rows[-1]["gain"]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    keys = list(rows[0]["ensemble"])
    head = " | ".join(f"{key}: seeds' mean / ensemble" for key in keys)
    lines = [f"| sampler seed | pick | {head} |", "|---|---|" + "---|" * len(keys)]
    for row in rows:
        cells = " | ".join(f"{row['mean'][k]:.4f} / {row['ensemble'][k]:.4f} ({row['gain'][k]:+.4f})" for k in keys)
        lines.append(f"| {row['sampler_seed']} | #{row['pick']} | {cells} |")
    means = " | ".join(
        f"{np.mean([r['mean'][k] for r in rows]):.4f} / {np.mean([r['ensemble'][k] for r in rows]):.4f} "
        f"({np.mean([r['gain'][k] for r in rows]):+.4f})"
        for k in keys
    )
    lines.append(f"| mean of {len(rows)} | | {means} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("val", "test"))
    parser.add_argument("--verdicts", type=Path, required=True, help="the JSON of a bench/verdicts.py run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="val: the seeds each pick trains with")
    parser.add_argument("--epochs", type=int, default=None, help="val: epochs of each run (default 2 x the trials')")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seed_ensemble"), help="val: where the embeddings go")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="test: the folder bench/verdicts.py --keep kept the studies in")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.stage == "test" and args.keep is None:
        parser.error("test needs --keep DIR, the folder bench/verdicts.py --keep kept the studies in")
    results = json.loads(args.verdicts.read_text())["results"]
    rows = run_val(args, results) if args.stage == "val" else run_test(args, results)
    if args.out:
        args.out.write_text(json.dumps({"stage": args.stage, "verdicts": str(args.verdicts), "rows": rows}, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()

"""The picks of a verdicts bench trained again at another backbone width: does a wider final model score better?

``bench/verdicts.py`` keeps each study of its bench (``--keep``) with the finals ``study.final --study`` trained for
its pick, one MLflow run per seed. This script trains each pick again with ``study.final --config``: the same
configuration, final epochs and first seed as that seed's run, with ``backbone_width`` changed, and then sets the two
side by side, pick by pick (the same seed, so the width is the only difference). The test classes score the
procedure, as in ``bench/verdicts.py``; no study reads them.

  DML_DATA_ROOT=../shared/data python bench/final_width.py --verdicts docs/bench/verdicts_val30.json \\
      --keep /work/verdict_runs_vf --width 128 --store /tmp/wfinal/mlflow.db --out docs/bench/final_width.json
  python bench/final_width.py ... --report      # only the table, from the runs recorded in --store

Each pick trains with one torch thread, ``--parallel`` picks at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import yaml

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("test_recall_at_1", "test_map_at_r", "test_one_shot_error_20way")


def first_seed_run(keep: Path, study: str):
    """The kept study's final run of its pick's first seed (the lowest ``seed`` param)."""
    client = mlflow.MlflowClient(f"sqlite:///{keep / study / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dml-studies")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.kind = 'final_seed'")
    return min(runs, key=lambda run: int(run.data.params["seed"]))


def pick_config(result: dict, base, width: int) -> dict:
    """The pick's configuration as its first seed's final trained it, at ``width``."""
    return {**result["config"], "epochs": int(base.data.params["epochs"]), "seed": int(base.data.params["seed"]), "backbone_width": width}


def names(seed: int, width: int) -> tuple[str, str]:
    """(the config file's stem, which names the seed runs ``final-STEM-seedN``; the parent run's name)."""
    return f"w{width}_pick{seed}", f"pick{seed}"


def train(seed: int, config: dict, folder: Path, store: str) -> int:
    stem, run_name = names(seed, config["backbone_width"])
    path = folder / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "study.final", "--config", str(path), "--seeds", "1", "--tracking-uri", store]
    argv += ["--experiment", f"width{config['backbone_width']}", "--run-name", run_name, "--device", "cpu"]
    with (folder / f"{run_name}.log").open("w") as log:
        return subprocess.run(argv, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT).returncode


def trained(store: str, seed: int, width: int, first_seed: int) -> dict[str, float] | None:
    """The test metrics of the pick of sampler seed ``seed`` trained at ``width``; None until its run has finished."""
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name(f"width{width}")
    if experiment is None:
        return None
    name = f"final-{names(seed, width)[0]}-seed{first_seed}"
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.kind = 'final_seed' and tags.`mlflow.runName` = '{name}'")
    finished = [run for run in runs if run.info.status == "FINISHED"]
    return {m: finished[0].data.metrics[m] for m in METRICS} if finished else None


def table(rows: list[dict], width: int) -> str:
    lines = [
        f"| sampler seed | pick | width 64: R@1 / MAP@R / one-shot error | width {width} | difference (R@1, MAP@R, one-shot error) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        base, wide = row["width_64"], row[f"width_{width}"]
        cells = [" / ".join(f"{values[m]:.4f}" for m in METRICS) if values else "not trained" for values in (base, wide)]
        diff = ", ".join(f"{wide[m] - base[m]:+.4f}" for m in METRICS) if wide else ""
        lines.append(f"| {row['seed']} | #{row['pick']} ({row['family']}) | {cells[0]} | {cells[1]} | {diff} |")
    done = [row for row in rows if row[f"width_{width}"]]
    if done:
        means = [sum(row[f"width_{width}"][m] - row["width_64"][m] for row in done) / len(done) for m in METRICS]
        lines.append(f"| mean of {len(done)} | | | | {', '.join(f'{v:+.4f}' for v in means)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdicts", type=Path, required=True, help="the JSON of a bench/verdicts.py run")
    parser.add_argument("--keep", type=Path, required=True, help="the folder its --keep kept the studies in")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--store", required=True, help="a local sqlite file for the new finals' MLflow runs")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", action="store_true", help="only the table, from the runs in --store")
    args = parser.parse_args()
    store = f"sqlite:///{Path(args.store).resolve()}"
    results = json.loads(args.verdicts.read_text())["results"]
    bases = [first_seed_run(args.keep, result["study"]) for result in results]
    firsts = [int(base.data.params["seed"]) for base in bases]
    if not args.report:
        folder = Path(args.store).resolve().parent
        todo = [(r["seed"], pick_config(r, b, args.width)) for r, b in zip(results, bases)]
        todo = [(seed, config) for (seed, config), first in zip(todo, firsts) if trained(store, seed, args.width, first) is None]
        with ThreadPoolExecutor(args.parallel) as pool:  # each start waits for the store's setup lock (study.locks)
            list(pool.map(lambda job: train(*job, folder, store), todo))
    rows = [
        {
            "seed": result["seed"], "pick": result["picked_trial"],
            "family": f"{result['config']['loss']}, {result['config'].get('normalization')}",
            "first_seed": first, "width_64": {m: base.data.metrics[m] for m in METRICS},
            f"width_{args.width}": trained(store, result["seed"], args.width, first),
        }
        for result, base, first in zip(results, bases, firsts)
    ]  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"verdicts": str(args.verdicts), "width": args.width, "rows": rows}, indent=1) + "\n")
    print(table(rows, args.width))


if __name__ == "__main__":
    main()

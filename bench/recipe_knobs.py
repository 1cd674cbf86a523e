"""One knob of the recipe on the validation classes: what do the default space's best configurations want?

Takes the best configuration of each loss family in the rung-fidelity ground
truth (docs/bench/rung_fidelity.jsonl: 24 configurations of the default space
trained to its 16-epoch budget, ranked by validation MAP@R), trains each on the
fit classes with config key ``--key`` at every value of ``--values`` and every
``--seeds`` seed, and scores it on the validation classes once, at the end of
its budget. The test classes are never read.

Each finished run is appended to docs/bench/recipe_knobs.jsonl, and runs
already there are skipped, so several processes (for example one per seed)
can fill it side by side; ``--report`` writes the table of means to
docs/bench/recipe_knobs.md.

  DML_DATA_ROOT=../shared/data OMP_NUM_THREADS=1 python bench/recipe_knobs.py --key augment --values 0 0.5 1 2 3 --seeds 0
  DML_DATA_ROOT=../shared/data OMP_NUM_THREADS=1 python bench/recipe_knobs.py --key image_size --values 32 48 --seeds 1
  python bench/recipe_knobs.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import yaml
from rung_fidelity import value_at  # bench/ is the script's folder, so its sibling imports

ROOT = Path(__file__).resolve().parents[1]
GROUND_TRUTH = ROOT / "docs" / "bench" / "rung_fidelity.jsonl"
OUT = ROOT / "docs" / "bench" / "recipe_knobs"
METRICS = ("val_recall_at_1", "val_map_at_r")


def family_bests(path: Path = GROUND_TRUTH) -> dict[str, dict]:
    """{loss: config} of the ground truth's best full-budget validation MAP@R per loss family."""
    best: dict[str, tuple[float, dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        budget = max(record["budget"] for record in row["records"])
        final = value_at(row, budget, budget, "val_map_at_r")
        loss = row["config"]["loss"]
        if loss not in best or final > best[loss][0]:
            best[loss] = (final, {**row["config"], "ground_truth_index": row["index"]})
    return {loss: config for loss, (_, config) in sorted(best.items())}


def recorded(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def train(config: dict, key: str, value, seed: int) -> dict:
    from trainables.core.config import TrainConfig
    from trainables.core.engine import fit

    values = {k: v for k, v in config.items() if k != "ground_truth_index"}
    train_config = TrainConfig.from_dict({**values, key: value, "seed": seed}, source="bench")
    started = time.perf_counter()
    run = fit(train_config, mode="study", data_root=os.environ.get("DML_DATA_ROOT"), eval_every=train_config.epochs)
    row = {"loss": config["loss"], "ground_truth_index": config["ground_truth_index"], "key": key, "value": value, "seed": seed}
    return {**row, **{k: float(run.metrics[k]) for k in METRICS}, "seconds": round(time.perf_counter() - started, 1)}


def report(rows: list[dict]) -> str:
    lines = ["| loss (ground-truth index) | key = value | seeds | val R@1 | val MAP@R | s per run |", "|---|---|---|---|---|---|"]
    groups = sorted({(r["key"], r["loss"], r["value"]) for r in rows}, key=lambda g: (g[0], g[1], float(g[2])))
    for key, loss, value in groups:
        group = sorted((r for r in rows if (r["key"], r["loss"], r["value"]) == (key, loss, value)), key=lambda r: r["seed"])
        cells = []
        for metric in METRICS:
            values = np.array([r[metric] for r in group])
            spread = f" +- {values.std(ddof=1):.4f}" if len(values) > 1 else " (n = 1)"
            cells.append(f"{values.mean():.4f}{spread}")
        seeds = ", ".join(str(r["seed"]) for r in group)
        seconds = np.mean([r["seconds"] for r in group])
        name = f"{loss} ({group[0]['ground_truth_index']})"
        lines.append(f"| {name} | {key} = {value:g} | {seeds} | {cells[0]} | {cells[1]} | {seconds:.0f} |")
    host = f"{platform.node()}, {os.cpu_count()} CPUs"
    return "\n".join(lines) + f"\n\nmean +- sample standard deviation over seeds; written on {host}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="augment", help="a config key (trainables/core/config.py)")
    parser.add_argument("--values", nargs="+", default=["0", "1", "2"], help="its values, read as YAML scalars")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--report", action="store_true", help="only write the table from the runs recorded")
    args = parser.parse_args()
    jsonl = OUT.with_suffix(".jsonl")
    if not args.report:
        for config in family_bests().values():
            for seed in args.seeds:
                for value in (yaml.safe_load(v) for v in args.values):
                    done = {(r["loss"], r["key"], r["value"], r["seed"]) for r in recorded(jsonl)}
                    if (config["loss"], args.key, value, seed) in done:
                        continue
                    row = train(config, args.key, value, seed)
                    print(json.dumps(row), flush=True)
                    with jsonl.open("a") as out:
                        out.write(json.dumps(row) + "\n")
    table = report(recorded(jsonl))
    OUT.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

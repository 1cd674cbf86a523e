"""The race's tied candidates as one model: does an undecided race's final do better as its survivors together?

When the race over validation folds cannot tell its candidates apart (``undecided``), ``study.final --seeds 3``
trains the best mean three times and joins the seeds into one model (``engine.concatenated``). This bench
measures the alternative: the same three trainings, member k being the race's k-th survivor (best mean first,
cycling when fewer survive than members) with seed k, joined the same way. It costs what the seeds cost; the
members differ in configuration as well as seed.

Both ways are trained and scored here, from the same runs: per study, the pick with seeds 0, 1, 2 (as study.final
trains it) and the candidates (survivor k with seed k); member 0 is the same run both ways.

``val`` (the decision): each member of each ``bench/verdicts.py`` study (its JSON's ``results[*]``: the pick's
``config``, every trial's ``proposals``, the race's ``selection``) trains on the fit classes of its study's
validation split to ``--epochs`` (default 2 x the trials', the default space's final budget) and is scored on
the validation classes (fold 0) alone and as one model.

``test`` (the report): the same members trained as ``study.final`` trains them (all training classes,
``mode=final``, the same budget), scored on the test classes: R@1, MAP@R and the 20-way one-shot error.

Embeddings go to ``--work`` (``<stage>_study<S>_trial<T>_seed<k>.npz``); runs already there are skipped, so it
resumes. Training runs use one torch thread each, ``--parallel`` at a time.

  DML_DATA_ROOT=../shared/data python bench/candidate_ensemble.py val --verdicts docs/bench/verdicts_val30.json \\
      --work /tmp/cand --out docs/bench/candidate_ensemble_val.json
  DML_DATA_ROOT=../shared/data python bench/candidate_ensemble.py test --verdicts docs/bench/verdicts_val30.json \\
      --work /tmp/cand --out docs/bench/candidate_ensemble_test.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.seed_ensemble import compare, ensemble, scores, train_job  # noqa: E402
from study.search.race import tie_member  # noqa: E402


def survivors(result: dict) -> list[int]:
    """The race's candidates that were not dropped, best mean first (``selection.ranking`` is in that order)."""
    return [row["trial"] for row in result["selection"]["ranking"] if row["dropped_after_folds"] is None]


def trial_config(result: dict, trial: int) -> dict:
    """Trial ``trial``'s full config: the study's fixed keys (the pick's config less its searched params) and its own."""
    pick = json.loads(result["proposals"][result["picked_trial"]])
    fixed = {key: value for key, value in result["config"].items() if key not in pick}
    return {**fixed, **json.loads(result["proposals"][trial])}


def members(result: dict, count: int, candidates: bool) -> list[tuple[int, dict]]:
    """(trial, config with seed k) of member k = 0 .. count - 1: the k-th survivor, cycling (``candidates``), else the
    pick (as study.final trains it today)."""
    alive = survivors(result) if candidates else [result["picked_trial"]]
    return [(tie_member(alive, k), {**trial_config(result, tie_member(alive, k)), "seed": k}) for k in range(count)]


def test_groups(config: dict):
    """class -> alphabet of the test classes, for the one-shot error."""
    from trainables.core.data import alphabets, load_dataset

    return alphabets(load_dataset(config["dataset"], os.environ.get("DML_DATA_ROOT"), config["image_size"]).test)


def plan(args: argparse.Namespace, result: dict, candidates: bool) -> list[tuple[int, dict, int, Path]]:
    """(trial, config, epochs, embeddings file) of each member; a (trial, seed) both ways share one run and file."""
    epochs = args.epochs or 2 * int(result["config"]["epochs"])
    name = "{}_study{}_trial{}_seed{}.npz"
    return [(trial, config, epochs, args.work / name.format(args.stage, result["seed"], trial, config["seed"]))
            for trial, config in members(result, args.members, candidates)]  # fmt: skip


def one_model(planned: list, groups) -> dict:
    """Each member's scores, their mean, the members as one model's, and that minus the mean."""
    loaded = [np.load(path) for *_, path in planned]
    labels = loaded[0]["labels"]
    per_member = [scores(f["embeddings"], labels, groups, k) for k, f in enumerate(loaded)]
    row = compare(per_member, scores(ensemble([f["embeddings"] for f in loaded]), labels, groups, 0))
    return {"members": [trial for trial, *_ in planned], "seconds": [float(f["seconds"]) for f in loaded], **row}


def run_stage(args: argparse.Namespace, results: list[dict]) -> list[dict]:
    args.work.mkdir(parents=True, exist_ok=True)
    mode = "study" if args.stage == "val" else "final"
    plans = {(r["seed"], way): plan(args, r, way == "candidates") for r in results for way in ("seeds", "candidates")}
    jobs = {path: (config, mode, epochs, path) for planned in plans.values() for _, config, epochs, path in planned}
    todo = [job for path, job in jobs.items() if not path.exists()]
    with ProcessPoolExecutor(args.parallel) as pool:
        for done in pool.map(train_job, *zip(*todo)) if todo else ():
            print(json.dumps(done), flush=True)
    groups = test_groups(results[0]["config"]) if args.stage == "test" else None
    rows = []
    for result in results:
        ways = {way: one_model(plans[(result["seed"], way)], groups) for way in ("seeds", "candidates")}
        keys = list(ways["seeds"]["ensemble"])
        difference = {k: ways["candidates"]["ensemble"][k] - ways["seeds"]["ensemble"][k] for k in keys}
        rows.append({"sampler_seed": result["seed"], "pick": result["picked_trial"], **ways, "difference": difference})
    return rows


def table(rows: list[dict]) -> str:
    keys = list(rows[0]["seeds"]["ensemble"])
    lines = ["| sampler seed | members (candidates) | " + " | ".join(f"{k}: pick's seeds / candidates (difference)" for k in keys) + " |"]
    lines.append("|---|---|" + "---|" * len(keys))
    for row in rows:
        trios = ((row["seeds"]["ensemble"][k], row["candidates"]["ensemble"][k], row["difference"][k]) for k in keys)
        cells = " | ".join(f"{a:.4f} / {b:.4f} ({d:+.4f})" for a, b, d in trios)
        lines.append(f"| {row['sampler_seed']} | {', '.join(f'#{t}' for t in row['candidates']['members'])} | {cells} |")
    for k in keys:
        diffs = np.array([row["difference"][k] for row in rows])
        sd = diffs.std(ddof=1) if len(diffs) > 1 else 0.0
        t = diffs.mean() / (sd / np.sqrt(len(diffs))) if sd > 0 else float("nan")
        means = [np.mean([row[way]["ensemble"][k] for row in rows]) for way in ("seeds", "candidates")]
        spreads = [np.ptp([row[way]["ensemble"][k] for row in rows]) for way in ("seeds", "candidates")]
        lines.append(
            f"\n{k}: mean {means[0]:.4f} (pick's seeds) against {means[1]:.4f} (candidates), difference {diffs.mean():+.4f} "
            f"(paired t {t:.2f}, {len(diffs) - 1} df); spread over studies {spreads[0]:.4f} against {spreads[1]:.4f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("val", "test"))
    parser.add_argument("--verdicts", type=Path, required=True, help="the JSON of a bench/verdicts.py run")
    parser.add_argument("--members", type=int, default=3, help="trainings per study, as study.final --seeds (default 3)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs of each run (default 2 x the trials')")
    parser.add_argument("--work", type=Path, default=Path("/tmp/candidate_ensemble"), help="where the embeddings go")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = json.loads(args.verdicts.read_text())["results"]
    rows = run_stage(args, results)
    if args.out:
        args.out.write_text(json.dumps({"stage": args.stage, "verdicts": str(args.verdicts), "rows": rows}, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()

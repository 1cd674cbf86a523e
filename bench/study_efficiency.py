"""Study efficiency on Omniglot: the exhaustive grid against searches with the budget scheduler and with stock ASHA.

Workload: the space bench/efficiency_search.yaml, 56 configurations of both loss families (heated-up softmax with and
without heating, ICE) of 8 epochs each, run with ``python -m study.launch``: the grid (every configuration to the full
budget, nothing stopped: the space enumerated by Optuna's BruteForceSampler into a ``variants`` space), then for each
sampler seed (default 0, 1, 2) four searches of the same number of trials, {budget scheduler, stock ASHA} x {TPE,
random search}, grace period a quarter of the budget, reduction factor 4, no race, 2 trials at a time. For each
search: the best validation Recall@1 of a trial trained to the full budget, its gap to the grid's best, the epochs
spent as a share of the grid's, and the epochs spent until the best found came within 1 point of the grid's best
(the anytime curve, in the order trials finished); the median over the seeds per variant. Also how well each
scheduler's first rung ranks configurations by their full-budget value from the grid (Spearman).

Question: does a search find what the grid finds, for a fraction of its epochs?

Bound (issue 11): every search comes within 1 point of the grid's best validation Recall@1 on at most 30 % of the
grid's epochs (the median over the seeds of the anytime reading).

  DML_DATA_ROOT=../shared/data python -m bench.study_efficiency          # about an hour on 2 idle cores
  python -m bench.study_efficiency --reuse                               # recompute from the stored studies

Results go to docs/bench/study_efficiency.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import yaml
from mlflow import MlflowClient
from scipy.stats import spearmanr

from bench import harness
from bench.harness import ROOT
from study.records import tracking
from study.search.journal import open_storage
from study.search.spaces import VARIANT, load_space
from study.search.trial import epochs_trained

SEARCH = ROOT / "bench" / "efficiency_search.yaml"
SEARCHES = ("budget-tpe", "budget-random", "asha-tpe", "asha-random")  # scheduler-sampler
WITHIN = 0.01  # "within 1 point" of the grid's best validation Recall@1


def grid_points(space_path: Path) -> list[dict]:
    """Every configuration of a space of categorical parameters, conditions honoured (Optuna's BruteForceSampler)."""
    space = load_space(space_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
    points: list[dict] = []
    study.optimize(lambda trial: points.append(space.suggest(trial)) or 0.0, n_trials=10_000)
    return sorted(points, key=point_name)


def point_name(point: dict) -> str:
    return "_".join(f"{key}={point[key]}" for key in sorted(point))


def write_grid_space(points: list[dict], path: Path) -> Path:
    """The grid as a ``variants`` space: the search space's fixed keys, one variant per configuration."""
    fixed = yaml.safe_load(SEARCH.read_text())["fixed"]
    text = {
        "description": f"every configuration of {SEARCH.name} ({len(points)}), written by bench.study_efficiency",
        "fixed": fixed,
        "variants": {point_name(p): p for p in points},
    }
    path.write_text(yaml.safe_dump(text, sort_keys=False))
    return path


def launch(name: str, space: Path, args: argparse.Namespace, extra: list[str]) -> None:
    """Run the study ``name`` to its end: one that an earlier run of the benchmark finished is kept, one it left
    unfinished is resumed (``--resume``)."""
    store = ["--tracking-uri", args.tracking_uri, "--optuna-storage", f"journal:{args.journal}",
             "--storage-path", str(Path(args.workdir) / "ray")]  # fmt: skip
    if study_wall_s(name, args.tracking_uri) is not None:
        print(f"kept: study {name}, finished by an earlier run", flush=True)
        return
    if name in optuna.get_all_study_names(open_storage(f"journal:{args.journal}")):
        command = [sys.executable, "-m", "study.launch", "--study-name", name, "--resume", *store]
    else:
        command = [
            sys.executable, "-m", "study.launch", "--space", str(space), "--study-name", name, *store,
            "--max-concurrent", str(args.max_concurrent), "--cpus-per-trial", "1", "--confirm-budget", "0", *extra,
        ]  # fmt: skip
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def study_wall_s(name: str, tracking_uri: str) -> float | None:
    """The wall time a finished study recorded on its MLflow parent run (Ray's start-up apart); None if not finished."""
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("dml-studies")
    run = tracking.find_study_run(client, experiment.experiment_id, name) if experiment else None
    return run.data.metrics["wall_time_s"] if run and run.info.status == "FINISHED" and "wall_time_s" in run.data.metrics else None


def finished_trials(name: str, journal: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{journal}"))
    finished = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    return sorted(finished, key=lambda t: t.datetime_complete)


def anytime(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[int, float]]:
    """(epochs spent so far, best full-budget value so far) after each finished trial, in finishing order."""
    spent, best, curve = 0, float("-inf"), []
    for t in trials:
        spent += epochs_trained(t)
        if t.state == optuna.trial.TrialState.COMPLETE:
            best = max(best, float(t.value))
        curve.append((spent, best))
    return curve


def summarize(trials, grid_best: float, grid_epochs: int, wall_s: float | None) -> dict:
    curve = anytime(trials)
    within = next((spent for spent, best in curve if best >= grid_best - WITHIN), None)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = max(complete, key=lambda t: t.value) if complete else None
    spent = curve[-1][0] if curve else 0
    return {
        "trials": len(trials),
        "complete": len(complete),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in trials),
        "epochs_spent": spent,
        "share_of_grid_epochs": spent / grid_epochs,
        "best_val_recall_at_1": float(best.value) if best else None,
        "best_params": dict(best.params) if best else None,
        "gap_to_grid_best_points": 100 * (grid_best - float(best.value)) if best else None,
        "epochs_to_within_1_point": within,
        "share_of_grid_epochs_to_within_1_point": (within / grid_epochs) if within else None,
        "target_met": bool(best and grid_best - float(best.value) <= WITHIN and spent <= 0.3 * grid_epochs),
        "curve": curve,
        "wall_s": wall_s,
    }


def median_row(runs: list[dict]) -> dict:
    """The median over the seeds of each figure; a search that never came within 1 point counts as the grid's whole cost."""
    keys = ("epochs_spent", "share_of_grid_epochs", "best_val_recall_at_1", "gap_to_grid_best_points", "wall_s")
    row = {key: statistics.median(r[key] for r in runs if r[key] is not None) for key in keys}
    row["share_of_grid_epochs_to_within_1_point"] = statistics.median(r["share_of_grid_epochs_to_within_1_point"] or 1.0 for r in runs)
    row["seeds_within_1_point"] = sum(r["gap_to_grid_best_points"] <= 100 * WITHIN for r in runs)
    row["seeds_target_met"] = sum(r["target_met"] for r in runs)
    row["seeds"] = len(runs)
    return row


def first_rung_fidelity(grid_trials, searches: dict[str, list], final_map: dict[str, float], grace: int, max_epochs: int) -> dict:
    """Spearman between each scheduler's first-rung val R@1 and the grid's full-budget val R@1 and val MAP@R of the
    same configuration (``final_map``: configuration -> final val MAP@R)."""
    final = {t.params[VARIANT]: float(t.value) for t in grid_trials}  # a variant's name is its point_name
    asha = {t.params[VARIANT]: t.intermediate_values[grace] for t in grid_trials}
    budget: dict[str, float] = {}
    for key, trials in searches.items():
        if key.startswith("budget"):
            budget.update({point_name(t.params): t.intermediate_values[grace] for t in trials if grace in t.intermediate_values})

    def rho(early: dict[str, float], late: dict[str, float]) -> float:
        shared = sorted(set(early) & set(late))
        return float(spearmanr([early[k] for k in shared], [late[k] for k in shared]).statistic) if len(shared) >= 3 else float("nan")

    rungs = {"asha": (f"epoch {grace} of the {max_epochs}-epoch schedule", asha),
             "asha, on the budget rows' configurations": (f"epoch {grace} of the {max_epochs}-epoch schedule",
                                                          {k: v for k, v in asha.items() if k in budget}),
             "budget": (f"end of the schedule scaled to {grace} epochs", budget)}  # fmt: skip
    return {
        key: {
            "rung": rung,
            "spearman": rho(early, final),
            "spearman_vs_final_map_at_r": rho(early, final_map),
            "configurations": len(set(early) & set(final)),
        }  # fmt: skip
        for key, (rung, early) in rungs.items()
    }


def final_map_at_r(grid_trials, tracking_uri: str) -> dict[str, float]:
    """The grid's configurations -> their last val MAP@R, from each trial's MLflow run."""
    client = MlflowClient(tracking_uri)
    return {t.params[VARIANT]: client.get_run(t.user_attrs["mlflow_run_id"]).data.metrics["val_map_at_r"] for t in grid_trials}


def plot(results: dict, grid_best: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"budget-tpe": "tab:blue", "budget-random": "tab:cyan", "asha-tpe": "tab:red", "asha-random": "tab:orange"}
    fig, ax = plt.subplots(figsize=(8, 5))
    curve = [(s, b) for s, b in results["grid"]["curve"] if b > float("-inf")]
    ax.step([s for s, _ in curve], [b for _, b in curve], where="post", color="tab:gray", label="grid")
    for variant, color in ((v, c) for v, c in colors.items() if v in results):
        for i, run in enumerate(results[variant]):
            curve = [(s, b) for s, b in run["curve"] if b > float("-inf")]
            if curve:
                label = variant if i == 0 else None
                ax.step([s for s, _ in curve], [b for _, b in curve], where="post", color=color, label=label, alpha=0.7)
    ax.axhline(grid_best - WITHIN, color="k", lw=0.8, ls=":", label="grid best - 1 point")
    ax.set_xscale("log")
    ax.set_xlabel("epochs spent (log)")
    ax.set_ylabel("best validation Recall@1 (full-budget trials)")
    ax.set_title("Omniglot, 56 configurations of both loss families (one line per sampler seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(payload: dict, command: str) -> str:
    results, machine, grid = payload["results"], payload["machine"], payload["results"]["grid"]
    lines = [
        f"## Study efficiency (Omniglot, {payload['configurations']} configurations of both loss families, "
        f"{payload['max_epochs']} epochs each)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']} ({machine['cores']} cores); {machine['max_concurrent']} trials at a time, 1 CPU each; "
        f"{payload['search_trials']} trials per search, sampler seeds {', '.join(map(str, payload['seeds']))}.",
        "",
        f"Grid: {grid['trials']} trials, {grid['epochs_spent']} epochs, best validation Recall@1 {payload['grid_best']:.4f} "
        f"({grid['best_params']}); wall {grid['wall_s'] or 0:.0f} s.",
        "",
        "Median over the seeds (the last columns count seeds):",
        "",
        "| search | epochs spent (share of grid) | best val R@1 | gap to grid best | share of grid epochs until within 1 point "
        "| seeds within 1 point | seeds within 1 point on <= 30 % of the epochs | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in payload["searches"]:
        row = median_row(results[variant])
        lines.append(
            f"| {variant} | {row['epochs_spent']:.0f} ({100 * row['share_of_grid_epochs']:.0f} %) | {row['best_val_recall_at_1']:.4f} | "
            f"{row['gap_to_grid_best_points']:.2f} points | {100 * row['share_of_grid_epochs_to_within_1_point']:.0f} % | "
            f"{row['seeds_within_1_point']}/{row['seeds']} | {row['seeds_target_met']}/{row['seeds']} | {row['wall_s']:.0f} s |"
        )
    lines += ["", "Per seed:", "", "| search | seed | complete / pruned | epochs spent | best val R@1 | gap | best configuration |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for variant in payload["searches"]:
        for seed, r in zip(payload["seeds"], results[variant]):
            lines.append(
                f"| {variant} | {seed} | {r['complete']} / {r['pruned']} | {r['epochs_spent']} | {r['best_val_recall_at_1']:.4f} | "
                f"{r['gap_to_grid_best_points']:.2f} | {r['best_params']} |"
            )
    lines += ["", "First rung against the grid's full-budget value of the same configuration:", "",
              "| scheduler | first rung (val R@1) | Spearman vs final val R@1 | vs final val MAP@R | configurations |",
              "|---|---|---|---|---|"]  # fmt: skip
    for key, row in payload["first_rung"].items():
        lines.append(
            f"| {key} | {row['rung']} | {row['spearman']:.3f} | {row['spearman_vs_final_map_at_r']:.3f} | {row['configurations']} |"
        )
    lines += ["", "![best validation Recall@1 against epochs spent](study_efficiency.png)", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.study_efficiency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "bench"), help="where the studies are stored (default runs/bench)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench"), help="folder for study_efficiency.{json,md,png}")
    parser.add_argument("--search-trials", type=int, default=24, help="trials of every search (default 24)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampler seeds (default 0 1 2)")
    parser.add_argument(
        "--searches", nargs="+", choices=SEARCHES, default=list(SEARCHES), help="scheduler-sampler pairs to run (default: all four)"
    )
    parser.add_argument("--max-concurrent", type=int, default=2, help="trials at once in every study (default 2)")
    parser.add_argument("--tag", default="", help="suffix of the study names, to run the benchmark again beside earlier runs")
    parser.add_argument("--reuse", action="store_true", help="do not train; recompute the report from the stored studies")
    args = parser.parse_args(argv)
    args.journal = str(Path(args.workdir) / "journal.log")
    args.tracking_uri = f"sqlite:///{Path(args.workdir) / 'mlflow.db'}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    max_epochs = int(load_space(SEARCH).fixed["epochs"])
    grace = max_epochs // 4
    points = grid_points(SEARCH)
    grid_space = write_grid_space(points, workdir / f"efficiency_grid{args.tag}.yaml")
    studies = {"grid": f"efficiency2-grid{args.tag}"}
    for seed in args.seeds:
        studies.update({f"{search}-{seed}": f"efficiency2-{search}-{seed}{args.tag}" for search in args.searches})
    if not args.reuse:
        launch(studies["grid"], grid_space, args, ["--scheduler", "fifo"])
        for key in list(studies)[1:]:  # seed by seed, so that an interrupted run has whole seeds to report
            scheduler, sampler, seed = key.split("-")
            flags = ["--scheduler", scheduler, "--sampler", sampler, "--seed", seed, "--num-samples", str(args.search_trials),
                     "--grace-period", str(grace), "--reduction-factor", "4"]  # fmt: skip
            launch(studies[key], SEARCH, args, flags)
    walls = {key: study_wall_s(name, args.tracking_uri) for key, name in studies.items()}
    trials = {key: finished_trials(name, args.journal) for key, name in studies.items()}
    grid_trials = [t for t in trials["grid"] if t.state == optuna.trial.TrialState.COMPLETE]
    grid_best = max(float(t.value) for t in grid_trials)
    grid_epochs = sum(epochs_trained(t) for t in trials["grid"])
    results: dict = {"grid": summarize(trials["grid"], grid_best, grid_epochs, walls["grid"])}
    for variant in args.searches:
        runs = [f"{variant}-{seed}" for seed in args.seeds]
        results[variant] = [summarize(trials[key], grid_best, grid_epochs, walls[key]) for key in runs]
    searches = {key: value for key, value in trials.items() if key != "grid"}
    machine = {**harness.machine(), "optuna": optuna.__version__, "max_concurrent": args.max_concurrent}
    payload = {
        "machine": machine, "configurations": len(points), "max_epochs": max_epochs, "seeds": args.seeds,
        "search_trials": args.search_trials, "searches": args.searches, "grid_best": grid_best, "grid_epochs": grid_epochs,
        "results": results,
        "first_rung": first_rung_fidelity(grid_trials, searches, final_map_at_r(grid_trials, args.tracking_uri), grace, max_epochs),
    }  # fmt: skip
    command = "DML_DATA_ROOT=../shared/data " + harness.command("study_efficiency", ["--tag", args.tag] if args.tag else [])
    out = Path(args.out)
    harness.write(out / "study_efficiency.json", json.dumps(payload, indent=1, default=str))
    plot(results, grid_best, out / "study_efficiency.png")
    print(harness.write(out / "study_efficiency.md", markdown(payload, command)).read_text())
    shares = {variant: median_row(results[variant])["share_of_grid_epochs_to_within_1_point"] for variant in args.searches}
    measured = ", ".join(f"{variant} {share:.0%}" for variant, share in shares.items())
    statement = f"every search within 1 point of the grid's best on at most 30 % of its epochs ({measured})"
    return harness.bound(all(share <= 0.3 for share in shares.values()), statement)


if __name__ == "__main__":
    sys.exit(main())

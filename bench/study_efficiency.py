"""Study efficiency on Omniglot: an exhaustive grid against TPE + ASHA and random search + ASHA.

Runs three studies with ``python -m study.launch`` on the same 24 ICE
configurations (bench/efficiency_grid.yaml, bench/efficiency_search.yaml):

* grid: every configuration for the full epoch budget (ASHA off: grace period = epochs);
* tpe: TPE with ASHA-stopped trials told to Optuna as PRUNED;
* random: random search with the same ASHA.

It reports the best validation Recall@1 found against the epochs spent (the
anytime curve of each study, in the order its trials finished), the share of
the grid's epochs each search used to come within 1 point of the grid's best,
and the Spearman rank correlation between the metric at each ASHA rung and the
final metric, over the grid's configurations (all of which ran every epoch).

Results go to docs/bench/study_efficiency.{json,md,png}.

  DML_DATA_ROOT=../shared/data python bench/study_efficiency.py            # ~25 min on 2 cores
  python bench/study_efficiency.py --reuse                                 # recompute from the stored studies
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from study.report import rung_rank_correlation  # noqa: E402
from study.search import open_storage  # noqa: E402

GRID, SEARCH = ROOT / "bench" / "efficiency_grid.yaml", ROOT / "bench" / "efficiency_search.yaml"


def launch(name: str, space: Path, args: argparse.Namespace, extra: list[str]) -> float:
    command = [
        sys.executable,
        "-m",
        "study.launch",
        "--space",
        str(space),
        "--study-name",
        name,
        "--tracking-uri",
        args.tracking_uri,
        "--optuna-storage",
        f"journal:{args.journal}",
        "--storage-path",
        str(Path(args.workdir) / "ray"),
        "--max-concurrent",
        str(args.max_concurrent),
        "--cpus-per-trial",
        "1",
        "--seed",
        str(args.seed),
        *extra,
    ]
    print("$", " ".join(command), flush=True)
    started = time.time()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.time() - started


def trials_of(name: str, journal: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{journal}"))
    finished = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    return sorted(finished, key=lambda t: t.datetime_complete)


def anytime(trials: list[optuna.trial.FrozenTrial], max_epochs: int) -> list[tuple[int, float]]:
    """(epochs spent so far, best final-epoch value so far) after each finished trial, in finishing order."""
    spent, best, curve = 0, float("-inf"), []
    for t in trials:
        spent += len(t.intermediate_values)
        if t.state.name == "COMPLETE" and len(t.intermediate_values) == max_epochs:
            best = max(best, float(t.value))
        curve.append((spent, best))
    return curve


def summarize(name: str, trials, max_epochs: int, grid_best: float, grid_epochs: int, wall_s: float | None) -> dict:
    curve = anytime(trials, max_epochs)
    within = next((spent for spent, best in curve if best >= grid_best - 0.01), None)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    best = max(complete, key=lambda t: t.value) if complete else None
    return {
        "study": name,
        "trials": len(trials),
        "complete": len(complete),
        "pruned": sum(t.state.name == "PRUNED" for t in trials),
        "epochs_spent": curve[-1][0] if curve else 0,
        "epochs_share_of_grid": (curve[-1][0] / grid_epochs) if curve else None,
        "best_val_recall_at_1": float(best.value) if best else None,
        "best_params": dict(best.params) if best else None,
        "gap_to_grid_best_points": 100 * (grid_best - float(best.value)) if best else None,
        "epochs_to_within_1_point": within,
        "share_of_grid_epochs_to_within_1_point": (within / grid_epochs) if within else None,
        "curve": curve,
        "wall_s": wall_s,
    }


def plot(results: dict, grid_best: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for key, color in (("grid", "tab:gray"), ("tpe", "tab:blue"), ("random", "tab:orange")):
        curve = [(s, b) for s, b in results[key]["curve"] if b > float("-inf")]
        if curve:
            ax.step([s for s, _ in curve], [b for _, b in curve], where="post", color=color, label=key, marker=".")
    ax.axhline(grid_best, color="k", lw=0.8, ls="--", label="grid best")
    ax.axhline(grid_best - 0.01, color="k", lw=0.8, ls=":", label="grid best - 1 point")
    ax.set_xlabel("epochs spent")
    ax.set_ylabel("best validation Recall@1 (complete trials)")
    ax.set_title("Omniglot, 24 ICE configurations")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(results: dict, correlation: dict, grid_best: float, command: str, machine: dict, max_epochs: int) -> str:
    lines = [
        f"## Study efficiency (Omniglot, 24 ICE configurations, {max_epochs} epochs each)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']} ({machine['cores']} cores); {machine['max_concurrent']} trial(s) at a time, 1 CPU per trial.",
        "",
        "| study | trials | complete / pruned | epochs spent | share of grid epochs | best val R@1 | gap to grid best | "
        "epochs to within 1 point (share) | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in ("grid", "tpe", "random"):
        r = results[key]
        share = (
            f"{r['epochs_to_within_1_point']} ({100 * r['share_of_grid_epochs_to_within_1_point']:.0f} %)"
            if r["epochs_to_within_1_point"]
            else "never"
        )
        wall = f"{r['wall_s']:.0f} s" if r.get("wall_s") else "-"
        lines.append(
            f"| {key} | {r['trials']} | {r['complete']} / {r['pruned']} | {r['epochs_spent']} | {100 * r['epochs_share_of_grid']:.0f} % | "
            f"{r['best_val_recall_at_1']:.4f} | {r['gap_to_grid_best_points']:.2f} points | {share} | {wall} |"
        )
    lines += [
        "",
        f"Grid best validation Recall@1: {grid_best:.4f} ({results['grid']['best_params']}).",
        "",
        "Spearman rank correlation between the validation Recall@1 at an ASHA rung and at the last epoch, "
        "over the grid's 24 configurations:",
        "",
        "| epoch | Spearman rho | configurations |",
        "|---|---|---|",
    ]
    for epoch, row in correlation.items():
        lines.append(f"| {epoch} | {row['spearman']:.3f} | {row['n']} |")
    lines += ["", "![best validation Recall@1 against epochs spent](study_efficiency.png)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "bench"), help="where the studies are stored (default runs/bench)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench"), help="folder for study_efficiency.{json,md,png}")
    parser.add_argument("--search-trials", type=int, default=16, help="trials of the TPE and the random study (default 16)")
    parser.add_argument("--max-concurrent", type=int, default=2, help="trials at once in every study (default 2)")
    parser.add_argument("--grace-period", type=int, default=1, help="ASHA grace period of the searches (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--tag", default="", help="suffix of the study names, to run the benchmark again beside earlier runs")
    parser.add_argument("--reuse", action="store_true", help="do not train; recompute the report from the stored studies")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    args.journal = str(workdir / "journal.log")
    args.tracking_uri = f"sqlite:///{workdir / 'mlflow.db'}"
    names = {key: f"efficiency-{key}{args.tag}" for key in ("grid", "tpe", "random")}
    walls: dict[str, float | None] = dict.fromkeys(names)
    from study.spaces import load_space

    max_epochs = load_space(GRID).fixed["epochs"]
    if not args.reuse:
        walls["grid"] = launch(names["grid"], GRID, args, ["--grace-period", str(max_epochs)])
        asha = ["--num-samples", str(args.search_trials), "--grace-period", str(args.grace_period), "--reduction-factor", "3"]
        walls["tpe"] = launch(names["tpe"], SEARCH, args, [*asha, "--sampler", "tpe"])
        walls["random"] = launch(names["random"], SEARCH, args, [*asha, "--sampler", "random"])
    trials = {key: trials_of(name, args.journal) for key, name in names.items()}
    grid_trials = [t for t in trials["grid"] if t.state.name == "COMPLETE"]
    grid_best = max(float(t.value) for t in grid_trials)
    grid_epochs = sum(len(t.intermediate_values) for t in trials["grid"])
    results = {key: summarize(names[key], trials[key], max_epochs, grid_best, grid_epochs, walls[key]) for key in names}
    curves = [[t.intermediate_values[e] for e in sorted(t.intermediate_values)] for t in grid_trials]
    correlation = rung_rank_correlation(curves, rungs=list(range(1, max_epochs)), final=max_epochs)
    machine = {
        "cpu": next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor()
        ),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "optuna": optuna.__version__,
        "max_concurrent": args.max_concurrent,
    }
    command = "DML_DATA_ROOT=../shared/data python bench/study_efficiency.py" + "".join(
        f" {flag} {value}"
        for flag, value in (("--max-concurrent", args.max_concurrent), ("--search-trials", args.search_trials), ("--tag", args.tag))
        if value
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "grid_best": grid_best, "grid_epochs": grid_epochs, "results": results, "rank_correlation": correlation}
    (out / "study_efficiency.json").write_text(json.dumps(payload, indent=1, default=str))
    plot(results, grid_best, out / "study_efficiency.png")
    (out / "study_efficiency.md").write_text(markdown(results, correlation, grid_best, command, machine, max_epochs))
    print((out / "study_efficiency.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

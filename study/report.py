"""Study reports: the artifacts study.launch ends with, and `python -m study.report`.

``study_artifacts`` is what ``study.launch`` attaches to the parent run at the
end of a study: ``best_config.yaml``, ``trials.csv``, and PNGs of the
optimization history, parameter importances, parallel coordinates and the
validation metric against epoch for every trial.

``python -m study.report --study NAME [--out DIR]`` reads the MLflow records of
a study (``study.launch``) or of a grid of final runs (``study.final --space``)
and writes ``report.md`` with PNGs: the top trials and the best config,
parameter importances, the validation metric against epoch, the Spearman rank
correlation between each ASHA rung's metric and the final one, the papers'
table (one row per metric, one column per configuration, mean and spread over
seeds) and embedding diagnostics of the final models (positive/negative pair
cosine similarities on the test classes, the mean-proxy norm over training).
The same files are logged to the parent run under ``report/``.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402

from study.tracking import write_yaml  # noqa: E402
from trainables.core.config import TrainConfig  # noqa: E402

log = logging.getLogger(__name__)
STATE_COLORS = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red", "RUNNING": "tab:gray"}


def _note(path: Path, title: str, text: str) -> Path:
    """A PNG that says why a plot could not be drawn (e.g. too few complete trials)."""
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _optuna_plot(path: Path, title: str, draw) -> Path:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = draw()
        fig = (result.flat[0] if hasattr(result, "flat") else result).figure
        fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    except Exception as error:  # optuna raises for too few or constant trials
        plt.close("all")
        return _note(path, title, f"not drawn: {str(error).splitlines()[0][:200] if str(error) else type(error).__name__}")


def learning_curves(study: optuna.Study, metric: str, path: Path) -> Path:
    """The validation metric against epoch for every trial, coloured by final state."""
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = set()
    for t in study.get_trials(deepcopy=False):
        if not t.intermediate_values:
            continue
        steps = sorted(t.intermediate_values)
        state = t.state.name
        ax.plot(
            steps,
            [t.intermediate_values[s] for s in steps],
            marker=".",
            color=STATE_COLORS.get(state, "k"),
            alpha=0.7,
            label=state.lower() if state not in drawn else None,
        )
        drawn.add(state)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against epoch, all trials")
    if drawn:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def study_artifacts(study: optuna.Study, children: dict[str, Any], out: Path, metric: str, best) -> list[Path]:
    paths = []
    if best is not None:
        config = TrainConfig.from_dict(best.user_attrs["config"], source="best trial").to_dict()
        paths.append(write_yaml(out / "best_config.yaml", config))
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    frame = frame.drop(columns=[c for c in frame.columns if c == "user_attrs_config"])
    frame["epochs"] = [len(t.intermediate_values) for t in study.get_trials(deepcopy=False)]
    frame["mlflow_run_id"] = [
        children[t.user_attrs["tune_trial_id"]].info.run_id if t.user_attrs.get("tune_trial_id") in children else ""
        for t in study.get_trials(deepcopy=False)
    ]
    frame = frame.rename(columns={"value": metric})
    frame.to_csv(out / "trials.csv", index=False)
    paths.append(out / "trials.csv")
    vis = optuna.visualization.matplotlib
    paths.append(
        _optuna_plot(
            out / "optimization_history.png", "optimization history", lambda: vis.plot_optimization_history(study, target_name=metric)
        )
    )
    paths.append(_optuna_plot(out / "param_importances.png", "parameter importances", lambda: vis.plot_param_importances(study)))
    paths.append(
        _optuna_plot(
            out / "parallel_coordinate.png", "parallel coordinates", lambda: vis.plot_parallel_coordinate(study, target_name=metric)
        )
    )
    paths.append(learning_curves(study, metric, out / "learning_curves.png"))
    return paths


def rung_rank_correlation(curves: list[list[float]], rungs: list[int], final: int) -> dict[int, dict[str, float]]:
    """Spearman's rho between the metric at each rung epoch and at epoch ``final``.

    ``curves`` holds one metric sequence per trial (index 0 = epoch 1); only trials that
    reached ``final`` count. A rho near 1 says stopping trials at that rung keeps the ones
    that would have ended best; near 0 or negative, the rung's ranking is no guide.
    Returns {rung: {"spearman": rho, "n": trials}} for the rungs below ``final``
    (rho is NaN with fewer than 3 trials or a constant ranking).
    """
    from scipy.stats import spearmanr

    full = [c for c in curves if len(c) >= final]
    out: dict[int, dict[str, float]] = {}
    for rung in sorted(set(rungs)):
        if rung >= final or rung < 1:
            continue
        early = [c[rung - 1] for c in full]
        last = [c[final - 1] for c in full]
        rho = float("nan")
        if len(full) >= 3 and len(set(early)) > 1 and len(set(last)) > 1:
            rho = float(spearmanr(early, last).statistic)
        out[rung] = {"spearman": rho, "n": len(full)}
    return out


# -- python -m study.report ------------------------------------------------------------------------------------------

TABLE_METRICS = (
    ("NMI", "test_nmi"),
    ("R@1", "test_recall_at_1"),
    ("R@2", "test_recall_at_2"),
    ("R@4", "test_recall_at_4"),
    ("R@8", "test_recall_at_8"),
    ("MAP@R", "test_map_at_r"),
)


def asha_rungs(grace_period: int, reduction_factor: float, max_epochs: int) -> list[int]:
    """The epochs at which ASHA compares trials: grace * factor^i below ``max_epochs``."""
    rungs, rung = [], float(grace_period)
    while round(rung) < max_epochs:
        rungs.append(int(round(rung)))
        rung *= reduction_factor
    return rungs


def paper_table(columns: dict[str, list[dict[str, float]]], scale: float = 100.0) -> str:
    """The papers' layout: one row per metric, one column per configuration, mean +- sample std over seeds (in %)."""
    names = list(columns)
    lines = ["| metric (%) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key in TABLE_METRICS:
        cells = []
        means = {n: float(np.mean([m[key] for m in columns[n] if key in m])) if any(key in m for m in columns[n]) else None for n in names}
        best = max((v for v in means.values() if v is not None), default=None)
        for n in names:
            values = [m[key] for m in columns[n] if key in m]
            if not values:
                cells.append("-")
                continue
            std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            cell = f"{scale * means[n]:.1f} ± {scale * std:.1f}"
            cells.append(f"**{cell}**" if means[n] == best and len(names) > 1 else cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    seeds = sorted({len(v) for v in columns.values()})
    lines.append("")
    lines.append(f"Mean ± sample standard deviation over {'/'.join(map(str, seeds))} seed(s); the best mean of each row in bold.")
    return "\n".join(lines)


def _history(client, run_id: str, key: str) -> list[float]:
    """A run's metric by step (epoch 1..n), as a list."""
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    by_step = {m.step: m.value for m in points}
    return [by_step[s] for s in sorted(by_step)]


def _curves_plot(series: dict[str, list[float]], colors: dict[str, str], ylabel: str, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    labelled = set()
    for name, values in series.items():
        color = colors.get(name, "tab:blue")
        label = None
        if color not in labelled and len(set(colors.values())) > 1:
            label = next(k for k, v in STATE_COLORS.items() if v == color).lower() if color in STATE_COLORS.values() else name
            labelled.add(color)
        elif len(set(colors.values())) <= 1 and len(series) <= 12:
            label = name
        ax.plot(
            range(1, len(values) + 1), values, marker=".", color=color if len(set(colors.values())) > 1 else None, alpha=0.75, label=label
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(value: Any) -> str:
    """Params as MLflow keeps them (strings), with long floats shortened."""
    text = str(value)
    if "." in text or "e" in text:
        try:
            return f"{float(text):.4g}"
        except ValueError:
            pass
    return text


def _importances(parent, out: Path, client) -> tuple[list[str], Path | None]:
    """Parameter importances from the study's Optuna storage (fANOVA), else the PNG the study ended with."""
    lines: list[str] = []
    storage = parent.data.params.get("optuna_storage")
    name = parent.data.tags.get("study_name")
    try:
        from study.search import open_storage

        study = optuna.load_study(study_name=name, storage=open_storage(storage))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(study)
        lines += ["| parameter | importance |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in importances.items()]
        path = _optuna_plot(
            out / "param_importances.png", "parameter importances", lambda: optuna.visualization.matplotlib.plot_param_importances(study)
        )
        return lines, path
    except Exception as error:  # storage moved or unreachable, or too few trials: fall back to the stored plot
        detail = tracking_first_line(error)
        try:
            path = Path(client.download_artifacts(parent.info.run_id, "param_importances.png", str(out)))
            return [f"(recomputed importances unavailable: {detail}; the plot is the one the study ended with)"], path
        except Exception:
            return [f"(parameter importances unavailable: {detail})"], None


def tracking_first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def find_parent(client, name: str, experiment: str | None):
    """The newest study (study.launch) or grid-final (study.final --space) parent run named ``name``."""
    import re

    from study.tracking import UsageError

    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise UsageError(f"--study {name!r}: expected a study name of letters, digits, _ . -")
    if experiment:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise UsageError(f"--experiment {experiment}: no such MLflow experiment")
        ids = [found.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.study_name = '{name}'", max_results=5000, order_by=["attributes.start_time DESC"])
    parents = [r for r in runs if r.data.tags.get("kind") in ("study", "final_grid")]
    if not parents:
        raise UsageError(
            f"--study {name}: no study or grid of final runs of that name"
            + (f" in experiment {experiment!r}" if experiment else "")
            + "; expected the --study-name of study.launch or the name of a study.final --space run"
        )
    return parents[0]


def _seed_metrics(run) -> dict[str, float]:
    return {k: v for k, v in run.data.metrics.items() if k.startswith("test_")}


def final_diagnostics(client, groups: dict[str, list], out: Path) -> list[str]:
    """Pair-similarity statistics, histograms and the mean-proxy norm over training of final runs, per configuration."""
    lines = [
        "| configuration | positive pair cosine (mean) | negative pair cosine (mean) | gap | final mean-proxy norm | time per seed |",
        "|---|---|---|---|---|---|",
    ]
    proxy: dict[str, list[float]] = {}
    for conf, runs in groups.items():
        m = [r.data.metrics for r in runs]
        pos = np.mean([x["test_positive_similarity_mean"] for x in m if "test_positive_similarity_mean" in x] or [np.nan])
        neg = np.mean([x["test_negative_similarity_mean"] for x in m if "test_negative_similarity_mean" in x] or [np.nan])
        curves = [_history(client, r.info.run_id, "mean_proxy_norm") for r in runs if "mean_proxy_norm" in r.data.metrics]
        curves = [c for c in curves if c]
        norm = "-"
        if curves:
            length = min(len(c) for c in curves)
            proxy[conf] = list(np.mean([c[:length] for c in curves], axis=0))
            norm = f"{proxy[conf][-1]:.3f}"
        seconds = np.mean([x.get("time_total_s", np.nan) for x in m])
        lines.append(f"| {conf} | {pos:.3f} | {neg:.3f} | {pos - neg:.3f} | {norm} | {seconds:.0f} s |")
    lines.append("")
    if proxy:
        path = _curves_plot(
            proxy,
            {},
            "mean-proxy norm ||mean of class weights||",
            "mean-proxy norm over training (mean over seeds)",
            out / "mean_proxy_norm.png",
        )
        lines += [f"![mean-proxy norm]({path.name})", ""]
    else:
        lines += ["(no softmax-family run: the mean-proxy norm is not defined for ICE)", ""]
    for conf, runs in groups.items():
        first = min(runs, key=lambda r: int(r.data.tags.get("seed", 0)))
        names = [a.path for a in client.list_artifacts(first.info.run_id) if a.path.startswith("similarity_histogram")]
        if names:
            target = out / f"similarity_{_slug(conf)}.png"
            local = client.download_artifacts(first.info.run_id, names[0], str(out / "tmp"))
            Path(local).replace(target)
            lines += [f"{conf} (seed {first.data.tags.get('seed')}): ![pair similarities]({target.name})", ""]
    return lines


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def study_report(client, parent, out: Path, top: int) -> list[str]:
    params, tags = parent.data.params, parent.data.tags
    name = tags["study_name"]
    metric, mode = params.get("metric", "val_recall_at_1"), params.get("mode", "max")
    max_epochs = int(params.get("epochs", 0))
    from study.tracking import child_runs

    trials = child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="trial")
    curves = {r.info.run_name or r.data.tags.get("trial_id"): _history(client, r.info.run_id, metric) for r in trials}
    states = {
        r.info.run_name or r.data.tags.get("trial_id"): r.data.tags.get("optuna_state", r.data.tags.get("trial_state", "?")) for r in trials
    }
    m = parent.data.metrics
    lines = [
        f"# Study {name}",
        "",
        f"- space: `{params.get('space')}`, {params.get('num_samples', '?')} trials of up to {max_epochs} epochs, "
        f"sampler {params.get('sampler', 'tpe')}, ASHA grace {params.get('grace_period')} / factor {params.get('reduction_factor')}",
        f"- status: {parent.info.status}; {int(m.get('n_complete', 0))} complete, {int(m.get('n_pruned', 0))} pruned, "
        f"{int(m.get('n_failed', 0))} failed; {int(m.get('epochs_spent', 0))} epochs trained in {m.get('wall_time_s', float('nan')):.0f} s",
        f"- metric: {metric} ({mode}) on the validation classes",
        "",
        f"## Top trials by {metric}",
        "",
    ]
    rows = []
    for r in trials:
        key = r.info.run_name or r.data.tags.get("trial_id")
        values = curves.get(key) or []
        if states.get(key) == "COMPLETE" and values:
            rows.append((values[-1], key, r))
    rows.sort(key=lambda x: x[0], reverse=(mode == "max"))
    varying = (
        sorted(
            k
            for k in set().union(*(r.data.params for r in trials))
            if len({r.data.params.get(k) for r in trials}) > 1 and k not in ("seed",)
        )
        if trials
        else []
    )
    lines += ["| trial | " + metric + " | epochs | " + " | ".join(varying) + " |", "|---|---|---|" + "---|" * len(varying)]
    for value, key, r in rows[:top]:
        lines.append(f"| {key} | {value:.4f} | {len(curves[key])} | " + " | ".join(_fmt(r.data.params.get(k, "")) for k in varying) + " |")
    if not rows:
        lines.append("(no complete trial)")
    lines.append("")
    try:
        best_yaml = Path(client.download_artifacts(parent.info.run_id, "best_config.yaml", str(out / "tmp"))).read_text()
        lines += [
            "The best trial's config (`best_config.yaml`, what `study.final --study` retrains):",
            "",
            "```yaml",
            best_yaml.rstrip(),
            "```",
            "",
        ]
    except Exception:  # no complete trial, or the study has not ended
        pass
    imp_lines, imp_path = _importances(parent, out, client)
    lines += ["## Parameter importances", "", *imp_lines, ""]
    if imp_path is not None:
        lines += [f"![parameter importances]({imp_path.name})", ""]
    colors = {k: STATE_COLORS.get(states.get(k, ""), "k") for k in curves}
    _curves_plot(curves, colors, metric, f"{metric} against epoch, all {len(curves)} trials", out / "learning_curves.png")
    lines += ["## Validation metric against epoch", "", "![learning curves](learning_curves.png)", ""]
    rungs = asha_rungs(int(params.get("grace_period", 1)), float(params.get("reduction_factor", 3)), max_epochs) if max_epochs else []
    correlation = rung_rank_correlation(list(curves.values()), rungs, max_epochs) if max_epochs else {}
    lines += [
        "## Is early stopping trustworthy here?",
        "",
        f"Spearman rank correlation between {metric} at each ASHA rung and at epoch {max_epochs}, over the trials that ran every epoch "
        "(few trials reach the end under ASHA, so read it with its n):",
        "",
        "| rung (epoch) | Spearman rho | trials |",
        "|---|---|---|",
    ]
    lines += [f"| {rung} | {row['spearman']:.3f} | {row['n']} |" for rung, row in correlation.items()] or ["| - | - | - |"]
    lines.append("")
    finals = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.kind = 'final_seed'",
        max_results=1000,
    )
    lines += ["## Final model on the test classes (study.final --study)", ""]
    if finals:
        column = f"best config of {name}"
        lines += [paper_table({column: [_seed_metrics(r) for r in finals]}), ""]
        lines += ["### Embedding diagnostics", "", *final_diagnostics(client, {column: finals}, out)]
    else:
        lines += [f"(none yet: `python -m study.final --study {name}`)", ""]
    return lines


def grid_report(client, parent, out: Path) -> list[str]:
    tags = parent.data.tags
    name = tags["study_name"]
    seeds = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.kind = 'final_seed'",
        max_results=5000,
        order_by=["attributes.start_time ASC"],
    )
    groups: dict[str, list] = {}
    for r in seeds:
        if r.info.status == "FINISHED":
            groups.setdefault(r.data.tags.get("configuration", "?"), []).append(r)
    lines = [
        f"# {name}: final runs on the test classes",
        "",
        f"- space: `{tags.get('space')}`, {tags.get('configurations', len(groups))} configurations, status {parent.info.status}",
        f"- {len(seeds)} seed runs ({sum(r.info.status == 'FINISHED' for r in seeds)} finished); epochs per run: "
        + ", ".join(sorted({r.data.params.get("epochs", "?") for r in seeds})),
        "",
        "## Test metrics (the papers' table layout)",
        "",
        paper_table({conf: [_seed_metrics(r) for r in runs] for conf, runs in groups.items()}),
        "",
        "## Training loss against epoch (mean over seeds)",
        "",
    ]
    losses = {}
    for conf, runs in groups.items():
        curves = [c for c in (_history(client, r.info.run_id, "train_loss") for r in runs) if c]
        if curves:
            length = min(len(c) for c in curves)
            losses[conf] = list(np.mean([c[:length] for c in curves], axis=0))
    _curves_plot(losses, {}, "train loss", "training loss (mean over seeds)", out / "train_loss.png")
    lines += ["![training loss](train_loss.png)", "", "## Embedding diagnostics", ""]
    lines += final_diagnostics(client, groups, out)
    return lines


def write_report(client, parent, out: Path, top: int = 10) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if parent.data.tags.get("kind") == "study":
        lines = study_report(client, parent, out, top)
    else:
        lines = grid_report(client, parent, out)
    import shutil

    shutil.rmtree(out / "tmp", ignore_errors=True)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from study import tracking

    parser = argparse.ArgumentParser(
        prog="python -m study.report",
        description="Write a Markdown report with plots of a study (study.launch) or of a grid of final runs (study.final --space) "
        "from its MLflow records, and log it to the study's parent run under report/.",
    )
    parser.add_argument(
        "--study", required=True, help="the study's name (study.launch --study-name, or the name of a study.final --space run)"
    )
    parser.add_argument("--out", help="output folder (default: runs/reports/NAME)")
    parser.add_argument("--experiment", help="MLflow experiment to look in (default: all)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the local store under ./runs)")
    parser.add_argument("--top", type=int, default=10, help="trials in the top-trials table (default 10)")
    parser.add_argument("--no-log", action="store_true", help="only write the files; do not log them to the parent run")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top {args.top}: expected an integer >= 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        uri = tracking.resolve_tracking_uri(args.tracking_uri)
        tracking.check_reachable(uri)
        client = mlflow.MlflowClient(uri)
        parent = find_parent(client, args.study, args.experiment)
        out = Path(args.out) if args.out else tracking.runs_dir() / "reports" / args.study
        if out.exists() and not out.is_dir():
            raise tracking.UsageError(f"--out {out}: exists and is not a folder; expected a folder (or a path to create)")
        path = write_report(client, parent, out, args.top)
    except tracking.UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.no_log:
        client.log_artifacts(parent.info.run_id, str(out), artifact_path="report")
    print(f"report: {path}" + ("" if args.no_log else f"  (also in MLflow run {parent.info.run_id}, artifacts report/)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

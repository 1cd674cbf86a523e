"""The report of the runs study.final made (a study's seeds, a grid's configurations: the papers' table and the
embedding diagnostics) and the whole report's assembly and writing."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import numpy as np

from study import console, inputs, plots
from study.records import tracking
from study.records.curves import CURVE_KEYS, PrefetchedHistories, metric_history, trial_key, trial_state
from study.records.study_record import StudyRecord
from study.report.document import Block, Bullets, Code, Heading, Image, Link, Paragraph, Table, html_page, markdown
from study.report.sections import (
    TABLE_METRICS,
    best_config,
    early_stopping,
    finished_schedules,
    importance_section,
    paper_table,
    parallel_coordinates_section,
    pick_section,
    recorded_selection,
    study_header,
    study_learning_curves,
    top_trials,
)


def slug(text: str) -> str:
    """A file-name part for ``text``: its letters, digits, _ . - and, where that is not all of it, a hash of ``text``, so
    that two names never share a file ("a|b" and "a_b")."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", text)
    return safe if safe == text and len(safe) <= 80 else safe[:64] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def mean_over_seeds(client, runs: list, key: str) -> dict[int, float]:
    """The mean history of ``key`` over the runs that logged it, up to the shortest one ({} when none did)."""
    histories = [list(h.values()) for h in (metric_history(client, r.info.run_id, key) for r in runs if key in r.data.metrics) if h]
    if not histories:
        return {}
    length = min(len(h) for h in histories)
    return dict(enumerate(np.mean([h[:length] for h in histories], axis=0).tolist(), start=1))


def final_seed_runs(client, parent) -> list:
    """The study.final seed runs under ``parent``, oldest first."""
    seeds = tracking.run_filter({"tags.mlflow.parentRunId": parent.info.run_id, "tags.kind": "final_seed"})
    ids = [parent.info.experiment_id]
    return tracking.all_pages(client.search_runs, experiment_ids=ids, filter_string=seeds, order_by=["attributes.start_time ASC"])


def seed_metrics(run) -> dict[str, float]:
    return {k: v for k, v in run.data.metrics.items() if k.startswith("test_")}


def study_finals(client, parent, out: Path) -> list[Block]:
    """The test metrics and diagnostics of the study's best config retrained by study.final --study."""
    name = parent.data.tags["study_name"]
    finals, earlier = final_groups(final_seed_runs(client, parent))
    heading = Heading(2, "Final model on the test classes (study.final --study)")
    if not finals:
        return [heading, Paragraph(("(none yet: ", Code(f"python -m study.final --study {name}"), ")"))]
    label, model = f"the final of {name}", final_model(client, parent, finals)  # one search of the ensemble runs
    return [
        heading,
        *paper_table(final_columns(name, finals, model)),
        *earlier_finals(earlier),
        *ensemble_line(client, parent),
        Heading(3, "Embedding diagnostics"),
        *final_diagnostics(client, {label: finals}, out, {label: model}),
    ]


def final_model(client, parent, finals: list):
    """The run of the model the final of the seed runs ``finals`` registered, the seeds as one (the latest finished
    ``final_ensemble`` run started after them); None where there is none (one seed, or the final was stopped)."""
    since = min(r.info.start_time for r in finals)
    runs = tracking.child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="final_ensemble")
    done = [r for r in runs if r.info.status == "FINISHED" and r.info.start_time >= since]
    return max(done, key=lambda r: r.info.start_time) if done else None


def final_columns(name: str, finals: list, model) -> dict[str, list[dict[str, float]]]:
    """The test table's columns for the latest final's seed runs ``finals``: the pick over its seeds; or, where the
    seeds trained the race's tie (tag ``optuna_trial``, several candidates), the tie as one model, then each member's
    own model, so that the table says what the registered model is and what each member scored alone. ``model``: the
    final's seeds-as-one-model run (``final_model``), None where there is none."""
    trials = [r.data.tags.get("optuna_trial") for r in finals]
    if len({t for t in trials if t is not None}) < 2:
        return {f"the pick of {name}": [seed_metrics(r) for r in finals]}
    numbers = ", ".join(f"#{t}" for t in trials)
    columns = {f"the race's tie {numbers} as one model": [seed_metrics(model)] if model is not None else []}
    for i, (run, trial) in enumerate(zip(finals, trials, strict=True)):
        columns[f"#{trial} alone{' (the pick)' if i == 0 else ''}"] = [seed_metrics(run)]
    return columns


def final_groups(runs: list) -> tuple[list, list[list]]:
    """The seed runs of the latest study.final (one process wrote them: their ``owner_lock`` tag; runs from before that
    tag count as one final) and the earlier finals' seed runs, each group oldest first; ``runs`` oldest first."""
    groups: dict[str, list] = {}
    for run in runs:
        groups.setdefault(run.data.tags.get("owner_lock", ""), []).append(run)
    ordered = sorted(groups.values(), key=lambda group: group[0].info.start_time)
    return (ordered[-1], ordered[:-1]) if ordered else ([], [])


def earlier_finals(groups: list[list]) -> list[Block]:
    """One line for the finals before the latest: never averaged into its table."""
    if not groups:
        return []

    def described(group: list) -> str:
        epochs = sorted({r.data.params.get("epochs", "?") for r in group})
        recall = [r.data.metrics["test_recall_at_1"] for r in group if "test_recall_at_1" in r.data.metrics]
        shown = f" (R@1 {100 * float(np.mean(recall)):.1f})" if recall else ""
        return f"{len(group)} seed(s) at {'/'.join(epochs)} epochs{shown}"

    return [Paragraph(f"Earlier finals of this study, not in the table: {'; '.join(described(g) for g in groups)}.")]


def ensemble_line(client, parent) -> list[Block]:
    """The latest finished seeds-as-one-model run of study.final under ``parent`` (the final model), in the table's
    metrics (%); nothing when there is none (one seed)."""
    runs = tracking.child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="final_ensemble")
    done = [r for r in runs if r.info.status == "FINISHED"]
    if not done:
        return []
    latest = max(done, key=lambda r: r.info.start_time)
    m = latest.data.metrics
    shown = ", ".join(f"{label} {100 * m[key]:.1f}" for label, key in TABLE_METRICS if key in m)
    seeds, trials = latest.data.tags.get("seeds", "").split(), latest.data.tags.get("trials", "").split()
    members = f"seeds {', '.join(seeds)}"
    if trials:  # study.final --members tied: seed k trained the k-th candidate of the race's tie
        members = "the race's tied candidates " + ", ".join(f"#{t} (seed {s})" for t, s in zip(trials, seeds, strict=True))
    words = f"The final model, {members} as one model (their embeddings side by side), run "
    return [Paragraph((words, Code(latest.info.run_name), f": {shown} (%)."))]


def study_report(client, parent, out: Path, top: int) -> list[str]:
    """The lines of a study's report.md."""
    return markdown(study_sections(client, parent, out, top)).splitlines()


def mlflow_link(uri: str, experiment_id: str, study_name: str) -> Paragraph:
    """The MLflow UI's page of the study's runs (the address its closing lines print), and what serves a local store."""
    address, serve = console.ui_address(inputs.without_userinfo(uri), experiment_id, study_name)
    served = (" (served by ", Code(serve), ")") if serve else ()
    return Paragraph(("The study's runs in MLflow, the pick first: ", Link(address, address), *served))


def study_sections(client, parent, out: Path, top: int) -> list[Block]:
    """The blocks of a study's report, its PNGs written into ``out``; its settings are its record (study.records.study_record)."""
    record = StudyRecord.from_params(parent.data.params, where=f"study {parent.data.tags['study_name']!r}")
    metric = record.metric
    runs_link = mlflow_link(client.tracking_uri, parent.info.experiment_id, parent.data.tags["study_name"])
    trials = tracking.child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="trial")
    client = PrefetchedHistories(client, trials, [metric, *CURVE_KEYS])
    histories = {trial_key(r): metric_history(client, r.info.run_id, metric) for r in trials}
    states = {trial_key(r): trial_state(r) for r in trials}
    budget_rungs = record.scheduler == "budget"
    selection = recorded_selection(client, parent, out)
    numbers = {int(r.data.tags["optuna_trial_number"]): trial_key(r) for r in trials if "optuna_trial_number" in r.data.tags}
    return [
        *study_header(parent, record),
        runs_link,
        *top_trials(trials, histories, states, metric, record.mode, top),
        *pick_section(selection, numbers),
        *best_config(client, parent, out, picked=selection is not None, final_epochs=record.final_epochs),
        *importance_section(client, parent, record, out),
        *parallel_coordinates_section(client, parent, record, trials, histories, out),
        *study_learning_curves(client, record, trials, histories, out),
        *early_stopping(record, histories, finished_schedules(client, trials, histories) if budget_rungs else None),
        *study_finals(client, parent, out),
    ]


# -- sections about final runs ---------------------------------------------------------------------------------------


def pair_similarity_table(groups: dict[str, list], proxy: dict[str, dict[int, float]]) -> list[Block]:
    """Per configuration: mean positive / negative pair cosine, their gap, the last mean-proxy norm, time per seed."""
    header = (
        "configuration",
        "positive pair cosine (mean)",
        "negative pair cosine (mean)",
        "gap",
        "final mean-proxy norm",
        "time per seed",
    )
    rows = []
    for conf, runs in groups.items():
        m = [r.data.metrics for r in runs]
        pos = np.mean([x["test_positive_similarity_mean"] for x in m if "test_positive_similarity_mean" in x] or [np.nan])
        neg = np.mean([x["test_negative_similarity_mean"] for x in m if "test_negative_similarity_mean" in x] or [np.nan])
        norm = f"{list(proxy[conf].values())[-1]:.3f}" if proxy.get(conf) else "-"
        seconds = np.mean([x.get("time/total_s", x.get("time_total_s", np.nan)) for x in m])  # the second: records before the rename
        rows.append((conf, f"{pos:.3f}", f"{neg:.3f}", f"{pos - neg:.3f}", norm, f"{seconds:.0f} s"))
    return [Table(header, tuple(rows))]


def similarity_histograms(client, groups: dict[str, list], out: Path) -> list[Block]:
    """The pair-similarity histogram of each configuration's first seed, as study.final logged it."""
    blocks: list[Block] = []
    for conf, runs in groups.items():
        first = min(runs, key=lambda r: int(r.data.tags.get("seed", 0)))
        names = [a.path for a in client.list_artifacts(first.info.run_id) if a.path.startswith("similarity_histogram")]
        if names:
            target = out / f"similarity_{slug(conf)}.png"
            Path(client.download_artifacts(first.info.run_id, names[0], str(out / "tmp"))).replace(target)
            blocks.append(Image(target, "pair similarities", caption=f"{conf} (seed {first.data.tags.get('seed')}):"))
    return blocks


def final_diagnostics(client, groups: dict[str, list], out: Path, models: dict | None = None) -> list[Block]:
    """Pair-similarity statistics, histograms and the mean-proxy norm over training of final runs, per configuration;
    the pictures of ``models`` (a configuration's seeds-as-one-model run) where given, else of its first seed."""
    proxy = {  # mean_proxy_norm: its name in records written before the train_ prefix
        conf: mean_over_seeds(client, runs, "train_mean_proxy_norm") or mean_over_seeds(client, runs, "mean_proxy_norm")
        for conf, runs in groups.items()
    }
    proxy = {conf: values for conf, values in proxy.items() if values}
    if proxy:
        title = "mean-proxy norm over training (mean over seeds)"
        path = plots.curves(proxy, out / "mean_proxy_norm.png", ylabel="mean-proxy norm ||mean of class weights||", title=title)
        norm: Block = Image(path, "mean-proxy norm")
    else:
        norm = Paragraph("(no softmax-family run: the mean-proxy norm is not defined for ICE)")
    return [
        *pair_similarity_table(groups, proxy),
        norm,
        *similarity_histograms(client, groups, out),
        *embedding_section(client, groups, out, models or {}),
    ]


PICTURES = (  # artifacts of a study.final seed run: (file name prefix, what it shows)
    ("retrieval_grid", "test queries and their 8 nearest neighbours, wrong classes outlined in red"),
    ("tsne", "t-SNE map of the test embeddings, one colour per class"),
)


def embedding_section(client, groups: dict[str, list], out: Path, models: dict) -> list[Block]:
    """The retrieval grid and the t-SNE map that study.final logged for each configuration: of the model it registered
    (``models``: the seeds as one, its run), else of its first seed."""
    blocks: list[Block] = []
    for conf, runs in groups.items():
        model = models.get(conf)
        source = model or min(runs, key=lambda r: int(r.data.tags.get("seed", 0)))
        seeds = model.data.tags.get("seeds", "") if model else ""
        whose = f"the registered model, seeds {seeds} as one" if model else f"seed {source.data.tags.get('seed')}"
        logged = [a.path for a in client.list_artifacts(source.info.run_id)]
        for prefix, caption in PICTURES:
            names = [name for name in logged if name.startswith(prefix) and name.endswith(".png")]
            if names:
                target = out / f"{prefix}_{slug(conf)}.png"
                Path(client.download_artifacts(source.info.run_id, names[0], str(out / "tmp"))).replace(target)
                blocks += [Paragraph(f"{conf} ({whose}), {caption}:"), Image(target, prefix)]
    return blocks


def grid_report(client, parent, out: Path) -> list[Block]:
    tags = parent.data.tags
    seeds = final_seed_runs(client, parent)
    groups: dict[str, list] = {}
    for r in seeds:
        if r.info.status == "FINISHED":
            groups.setdefault(r.data.tags.get("configuration", "?"), []).append(r)
    losses = {conf: mean_over_seeds(client, runs, "train_loss") for conf, runs in groups.items()}
    path = plots.curves(
        {conf: values for conf, values in losses.items() if values},
        out / "train_loss.png",
        ylabel="train loss",
        title="training loss (mean over seeds)",
    )
    finished = sum(r.info.status == "FINISHED" for r in seeds)
    epochs = ", ".join(sorted({r.data.params.get("epochs", "?") for r in seeds}))
    return [
        Heading(1, f"{tags['study_name']}: final runs on the test classes"),
        Bullets(
            (
                (
                    "space: ",
                    Code(f"{tags.get('space')}"),
                    f", {tags.get('configurations', len(groups))} configurations, status {parent.info.status}",
                ),
                f"{len(seeds)} seed runs ({finished} finished); epochs per run: {epochs}",
            )
        ),
        Heading(2, "Test metrics (the papers' table layout)"),
        *paper_table({conf: [seed_metrics(r) for r in runs] for conf, runs in groups.items()}),
        Heading(2, "Training loss against epoch (mean over seeds)"),
        Image(path, "training loss"),
        Heading(2, "Embedding diagnostics"),
        *final_diagnostics(client, groups, out),
    ]


def write_report(client, parent, out: Path, top: int = 10) -> Path:
    """report.md and report.html of ``parent`` (a study or a grid of final runs) with their PNGs, in the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if parent.data.tags.get("kind") == "study":
        blocks = study_sections(client, parent, out, top)
    else:
        blocks = grid_report(client, parent, out)
    shutil.rmtree(out / "tmp", ignore_errors=True)
    path = out / "report.md"
    path.write_text(markdown(blocks))
    title = parent.data.tags.get("study_name", "report")
    (out / "report.html").write_text(html_page(blocks, out, title=f"study.report: {title}"))
    return path


# -- report.md and report.html: the blocks rendered ----------------------------------------------------------------------

# Markdown's characters that could start a link or an image ([ ]), inline HTML or an autolink (< >), emphasis, code,
# strikethrough, math, an entity, a table's cell (|) or a heading's end (#). With [ and ] escaped, ! ( ) start nothing.

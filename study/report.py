"""python -m study.report: a Markdown report with plots of a study or of a grid of final runs, from MLflow.

``python -m study.report --study NAME [--out DIR]`` reads the MLflow records of
a study (``study.launch``) or of a grid of final runs (``study.final --space``)
and writes ``report.md`` with PNGs: the top trials and the best config,
parameter importances, the validation metric against epoch, the Spearman rank
correlation between each ASHA rung's metric and the final one, the papers'
table (one row per metric, one column per configuration, mean and spread over
seeds) and embedding diagnostics of the final models (positive/negative pair
cosine similarities on the test classes, the mean-proxy norm over training).
``report.html`` is the same report in one file, its PNGs embedded. Both are
rendered from one list of blocks (headings, paragraphs, tables, images), and
the text the report reads from MLflow and Optuna is shown as text in both.
The same files are logged to the parent run under ``report/``, but for the
plots the study ended with at the run's root (``logged_files``).

The files a study itself ends with (``best_config.yaml``, ``trials.csv``, its
plots, drawn as the report draws them) are written by ``study.artifacts``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import yaml

from study import artifacts, inputs, names, plots, records, tracking
from study.record import StudyRecord
from study.schedulers import describe_rule
from study.selection import selection_from_record, standing
from trainables.core.budgets import rung_budgets
from trainables.core.config import TrainConfig

log = logging.getLogger(__name__)

CONFIG_KEYS = frozenset(TrainConfig.keys())
TABLE_METRICS = (
    ("NMI", "test_nmi"),
    ("R@1", "test_recall_at_1"),
    ("R@2", "test_recall_at_2"),
    ("R@4", "test_recall_at_4"),
    ("R@8", "test_recall_at_8"),
    ("MAP@R", "test_map_at_r"),
)


# -- the report's blocks: what it says, written twice (report.md and report.html) ---------------------------------------
#
# A section is a list of blocks, and a block's text a str, a Code, a Strong or a tuple of them. A str is shown as
# it reads whatever characters it holds (each renderer escapes it), so what MLflow and Optuna hold (variant names,
# params, tags, error messages) can never turn into a link, an image, markup or a broken table. Only an Image
# shows a picture, and only a PNG the report wrote into its folder.


@dataclass(frozen=True)
class Code:
    """Text in a code font: a name, a file or a command, shown verbatim."""

    text: str


@dataclass(frozen=True)
class Strong:
    """Text in bold (the best mean of a row of the papers' table)."""

    text: str


Inline = str | Code | Strong | tuple  # a tuple: a run of these


@dataclass(frozen=True)
class Heading:
    level: int
    text: Inline


@dataclass(frozen=True)
class Paragraph:
    text: Inline


@dataclass(frozen=True)
class Bullets:
    items: tuple[Inline, ...]


@dataclass(frozen=True)
class Table:
    """A header row and rows of as many cells."""

    header: tuple[Inline, ...]
    rows: tuple[tuple[Inline, ...], ...]

    def __post_init__(self) -> None:
        if any(len(row) != len(self.header) for row in self.rows):
            raise ValueError(f"Table: rows of {sorted({len(r) for r in self.rows})} cells under a header of {len(self.header)}")


@dataclass(frozen=True)
class Preformatted:
    """Text in a block of its own, lines and spaces kept (the best config's YAML)."""

    text: str
    language: str = ""


@dataclass(frozen=True)
class Image:
    """A PNG the report wrote into its folder, after ``caption`` on the same line."""

    path: Path
    alt: str
    caption: Inline = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+\.png", self.path.name):
            raise ValueError(f"Image {self.path}: expected a PNG the report named (letters, digits, _ . -)")


Block = Heading | Paragraph | Bullets | Table | Preformatted | Image


# -- pure helpers, tested by hand ---------------------------------------------------------------------------------------


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


def asha_rungs(grace_period: int, reduction_factor: float, max_epochs: int) -> list[int]:
    """The epochs at which ASHA compares trials: grace * factor^i below ``max_epochs`` (trainables.core.budgets)."""
    return rung_budgets(max_epochs, grace_period, reduction_factor)[:-1] if grace_period <= max_epochs else []


def study_rungs(record: StudyRecord) -> list[int]:
    """:func:`asha_rungs` of a study: its recorded grace period and reduction factor, below its epochs."""
    return asha_rungs(record.grace_period, record.reduction_factor, record.epochs)


def recorded_early_stopping(record: StudyRecord) -> str:
    """The scheduler a study ran, in words (a study recorded before ``scheduler`` was a param ran stock ASHA: the record says so)."""
    if record.scheduler == "budget":
        rungs = list(record.budgets[:-1])
    else:
        rungs = study_rungs(record) if record.scheduler == "asha" else []
    return describe_rule(record.scheduler, rungs, record.stratify_by)


def paper_table(columns: dict[str, list[dict[str, float]]], scale: float = 100.0) -> list[Block]:
    """The papers' layout: one row per metric, one column per configuration, mean ± sample std over seeds (in %).

    A cell of one seed reads ``72.1 (n = 1)``: one value has no spread. With more
    than one column, the cells whose mean, as printed, is the row's best are in
    bold (ties all bold), and the caption says so; with one column it does not.
    """
    names = list(columns)
    rows = []
    for label, key in TABLE_METRICS:
        values = {n: [scale * m[key] for m in columns[n] if key in m] for n in names}
        shown = {n: f"{np.mean(v):.1f}" for n, v in values.items() if v}
        best = max(shown.values(), key=float, default=None)
        cells: list[Inline] = []
        for n in names:
            if not values[n]:
                cells.append("-")
                continue
            spread = f" ± {np.std(values[n], ddof=1):.1f}" if len(values[n]) > 1 else f" (n = {len(values[n])})"
            cell = shown[n] + spread
            cells.append(Strong(cell) if len(names) > 1 and float(shown[n]) == float(best) else cell)
        rows.append((label, *cells))
    seeds = sorted({len(v) for v in columns.values()})
    caption = f"Mean ± sample standard deviation over {'/'.join(map(str, seeds))} seed(s)" + (
        "; n = 1 marks a single seed (no spread)" if 1 in seeds else ""
    )
    caption += "; the best mean of each row in bold." if len(names) > 1 else "."
    return [Table(("metric (%)", *names), tuple(rows)), Paragraph(caption)]


def _fmt(value: Any) -> str:
    """Params as MLflow keeps them (strings), with long floats shortened."""
    text = str(value)
    if "." in text or "e" in text:
        try:
            return f"{float(text):.4g}"
        except ValueError:
            pass
    return text


def _slug(text: str) -> str:
    """A file-name part for ``text``: its letters, digits, _ . - and, where that is not all of it, a hash of ``text``, so
    that two names never share a file ("a|b" and "a_b")."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", text)
    return slug if slug == text and len(slug) <= 80 else slug[:64] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]


# -- reading MLflow --------------------------------------------------------------------------------------------------


def find_parent(client, name: str, experiment: str | None):
    """The newest study (study.launch) or grid-final (study.final --space) parent run named ``name``."""
    if experiment:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise tracking.UsageError(f"--experiment {experiment}: no such MLflow experiment")
        ids = [found.experiment_id]
    else:
        ids = [e.experiment_id for e in tracking.all_pages(client.search_experiments)]
    parents = [  # searched by kind too: a study's trials share its name, and there may be many
        run
        for kind in ("study", "final_grid")
        for run in tracking.all_pages(
            client.search_runs, experiment_ids=ids, filter_string=tracking.run_filter({"tags.study_name": name, "tags.kind": kind})
        )
    ]
    parents.sort(key=lambda run: run.info.start_time, reverse=True)
    if not parents:
        raise tracking.UsageError(
            f"--study {name}: no study or grid of final runs of that name"
            + (f" in experiment {experiment!r}" if experiment else "")
            + "; expected the --study-name of study.launch or the name of a study.final --space run"
        )
    return parents[0]


class PrefetchedHistories:
    """An MLflow client whose ``get_metric_history`` answers from histories read at once for many runs
    (``tracking.metric_histories``); every other call goes to ``client``."""

    def __init__(self, client, runs: list, keys: list[str]) -> None:
        self._client = client
        self._histories = tracking.metric_histories(client, [r.info.run_id for r in runs], keys)

    def get_metric_history(self, run_id: str, key: str) -> list:
        found = self._histories.get((run_id, key))
        return found if found is not None else self._client.get_metric_history(run_id, key)

    def __getattr__(self, name: str):
        return getattr(self._client, name)


CURVE_KEYS = ("budget", "epoch")  # with the study's metric: what a study's curves and schedule ends are read from


def _history(client, run_id: str, key: str) -> dict[int, float]:
    """A run's metric by step (epoch), in step order; the last value logged at a step wins."""
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in points}


def _mean_over_seeds(client, runs: list, key: str) -> dict[int, float]:
    """The mean history of ``key`` over the runs that logged it, up to the shortest one ({} when none did)."""
    histories = [list(h.values()) for h in (_history(client, r.info.run_id, key) for r in runs if key in r.data.metrics) if h]
    if not histories:
        return {}
    length = min(len(h) for h in histories)
    return dict(enumerate(np.mean([h[:length] for h in histories], axis=0).tolist(), start=1))


def _final_seed_runs(client, parent) -> list:
    """The study.final seed runs under ``parent``, oldest first."""
    seeds = tracking.run_filter({"tags.mlflow.parentRunId": parent.info.run_id, "tags.kind": "final_seed"})
    ids = [parent.info.experiment_id]
    return tracking.all_pages(client.search_runs, experiment_ids=ids, filter_string=seeds, order_by=["attributes.start_time ASC"])


def _seed_metrics(run) -> dict[str, float]:
    return {k: v for k, v in run.data.metrics.items() if k.startswith("test_")}


def _trial_key(run) -> str:
    return run.info.run_name or run.data.tags.get("trial_id")


def _trial_state(run) -> str:
    """A trial run's Optuna state (written when the study ends), else how Tune saw it end, else "?"."""
    return run.data.tags.get("optuna_state", run.data.tags.get("trial_state", "?"))


def _schedule_ends(budget: dict[int, float], epoch: dict[int, float]) -> dict[int, int]:
    """{step: budget} at the steps where a budget's schedule finished: the logged ``epoch`` equals the ``budget``."""
    return {step: int(b) for step, b in budget.items() if epoch.get(step) == b}


# -- sections of a study's report ------------------------------------------------------------------------------------


def study_header(parent, record: StudyRecord) -> list[Block]:
    r, m = record, parent.data.metrics
    setup = (
        "space: ",
        Code(r.space),
        f", {r.num_samples} trials of up to {r.epochs} epochs, sampler {r.sampler}, {recorded_early_stopping(r)}",
    )
    status = (
        f"status: {parent.info.status}; {int(m.get('n_complete', 0))} complete, {int(m.get('n_pruned', 0))} pruned, "
        f"{int(m.get('n_failed', 0))} failed; {int(m.get('epochs_spent', 0))} epochs trained in {m.get('wall_time_s', float('nan')):.0f} s"
    )
    return [
        Heading(1, f"Study {parent.data.tags['study_name']}"),
        Bullets((setup, status, f"metric: {r.metric} ({r.mode}) on the validation classes")),
    ]


def active_params(run) -> dict[str, str]:
    """The params of a trial's run that it trained with.

    Every config key is a param of the run, defaults included (an ICE trial's ``alpha``, a softmax trial's
    ``ice_scale``); its tag ``active_params`` (``study.records``) names the keys that applied, and for a run recorded
    before that tag they are found from its params as the tag would say. A param that is no config key is always shown.
    """
    tag = run.data.tags.get(records.ACTIVE_PARAMS_TAG)
    active = tag.split(",") if tag is not None else records.active_params(run.data.params)
    if active is None:
        return dict(run.data.params)
    return {k: v for k, v in run.data.params.items() if k in active or k not in CONFIG_KEYS}


def top_trials(
    trials: list, histories: dict[str, dict[int, float]], states: dict[str, str], metric: str, mode: str, top: int
) -> list[Block]:
    """The ``top`` complete trials by their last ``metric``, with the params that vary between trials; a param a trial
    did not train with (``active_params``) is a blank cell, as in trials.csv."""
    rows = [
        (list(histories[key].values())[-1], key, r) for r in trials if states.get(key := _trial_key(r)) == "COMPLETE" and histories.get(key)
    ]
    rows.sort(key=lambda row: row[0], reverse=(mode == "max"))
    params = {r.info.run_id: active_params(r) for r in trials}
    keys = set().union(*params.values()) if trials else set()
    varying = sorted(k for k in keys if k != "seed" and len({p.get(k) for p in params.values()}) > 1)
    cells = tuple(
        (key, f"{value:.4f}", f"{schedule_epochs(r, histories[key])}", *(_fmt(params[r.info.run_id].get(k, "")) for k in varying))
        for value, key, r in rows[:top]
    )
    table = Table(("trial", metric, "epochs", *varying), cells)
    notes = Paragraph(
        "epochs: the length of the schedule the trial finished, its budget. On a ladder of budgets a promoted trial "
        "trained more: it went on from its checkpoint taken before the tail (heating, lr decay) of the shorter budget it "
        "was judged at, so that tail was trained and left behind, and its MLflow steps (epochs trained) run past its "
        "budget. A blank cell: a parameter the trial did not train with (the other loss's, or one its schedule leaves unused)."
    )
    return [Heading(2, f"Top trials by {metric}"), table, *([notes] if rows else [Paragraph("(no complete trial)")])]


def schedule_epochs(run, history: dict[int, float]) -> int:
    """The epochs of the schedule a trial's run finished: its last ``completed_budget`` on a ladder of budgets (where its
    steps count every epoch trained, retrained tails included), else its epochs recorded."""
    completed = run.data.metrics.get("completed_budget")
    return int(completed) if completed else len(history)


def pick_section(record: dict[str, Any] | None, names: dict[int, str]) -> list[Block]:
    """How the study picked its best trial: the race of ``record`` (selection.json) over validation folds, or an older
    study's seed re-runs, by mean, and the verdict.

    ``names``: the trials' run names by Optuna number. Nothing without a record (a grid, or ``--confirm-budget 0``).
    """
    if not record:
        return []
    name = lambda n: names.get(n, f"Optuna #{n}")  # noqa: E731
    selection = selection_from_record(record, "max")  # the record's ranking as it is: the mode only matters for old ones
    folds = bool(selection.winner.folds)
    by = "scores by fold (0: the trial's own)" if folds else "scores (the trial's own, then each extra seed)"
    header = ("trial", "mean ± standard error", by) + (("in the race",) if folds else ())

    def row(c) -> tuple[str, ...]:
        scores = ", ".join(f"{f}: {v:.4f}" for f, v in zip(c.folds, c.scores)) if folds else ", ".join(f"{v:.4f}" for v in c.scores)
        return (name(c.key), f"{c.mean:.4f} ± {c.sem:.4f}", scores) + ((standing(c),) if folds else ())

    rows = tuple(row(c) for c in selection.ranking)
    title, how = (
        ("The pick: the top trials raced over validation folds", "A single score is one fold's held-out classes; the race re-trains "
         "the top trials on other classes, drops a trial the leader beats fold by fold (paired t-test, Holm), and picks the best "
         "mean of those left, so the pick need not be the top row above.")
        if folds else
        ("The pick: the top trials re-run with extra seeds", "A single score is one seed's; the study picks the best mean over seeds, "
         "so the pick need not be the top row above.")
    )  # fmt: skip
    picked = Paragraph(f"picked: {name(selection.winner.key)}, the best mean; {record['verdict']}.")
    return [Heading(2, title), Paragraph(how), Table(header, rows), picked]


def best_config(client, parent, out: Path, picked: bool = False, final_epochs: int | None = None) -> list[Block]:
    """The best trial's config as the study stored it (nothing before a trial completes); ``picked``: chosen by its mean.

    Its ``epochs`` is the trials' budget; ``final_epochs`` (the study's record) is what ``study.final --study`` trains
    it to, said beside it when it differs."""
    try:
        text = Path(client.download_artifacts(parent.info.run_id, "best_config.yaml", str(out / "tmp"))).read_text()
    except Exception:  # no complete trial, or the study has not ended
        return []
    which = "The picked trial's config" if picked else "The best trial's config"
    trials_epochs = (yaml.safe_load(text) or {}).get("epochs")
    longer = f" for {final_epochs} epochs (its epochs below are the trials' budget; every schedule scales with it)"
    return [
        Paragraph(
            (
                f"{which} (",
                Code("best_config.yaml"),
                ", what ",
                Code("study.final --study"),
                " retrains" + (longer if final_epochs and final_epochs != trials_epochs else "") + "):",
            )
        ),
        Preformatted(text.rstrip(), "yaml"),
    ]


def selection_of(client, parent, out: Path) -> dict[str, Any] | None:
    """The study's ``selection.json`` (its confirmation re-runs), None when it has none."""
    try:
        return json.loads(Path(client.download_artifacts(parent.info.run_id, "selection.json", str(out / "tmp"))).read_text())
    except Exception:  # no confirmation runs (a grid, --confirm-seeds 0), or the study has not ended
        return None


def _optuna_study(parent, record: StudyRecord):
    """The study's Optuna study, from the storage its record names (raises when that storage is gone)."""
    import optuna

    from study.search import open_storage

    return optuna.load_study(study_name=parent.data.tags.get("study_name"), storage=open_storage(record.optuna_storage))


def importances(client, parent, record: StudyRecord, out: Path) -> list[Block]:
    """Parameter importances from the study's Optuna storage (fANOVA, per loss family: ``artifacts.family_importances``),
    else the PNG the study ended with."""
    blocks: list[Block] = [Heading(2, "Parameter importances")]
    try:
        study = _optuna_study(parent, record)
        families = artifacts.family_importances(study)
        path = artifacts.draw_importances(study, record.metric, out / "param_importances.png", families)
    except Exception as error:  # storage moved or unreachable: fall back to the stored plot
        detail = tracking.first_error_line(str(error) or type(error).__name__)[:200]
        try:
            path = Path(client.download_artifacts(parent.info.run_id, "param_importances.png", str(out)))
        except Exception:
            return [*blocks, Paragraph(f"(parameter importances unavailable: {detail})")]
        return [
            *blocks,
            Paragraph(f"(recomputed importances unavailable: {detail}; the plot is the one the study ended with)"),
            Image(path, "parameter importances"),
        ]
    if len(families) > 1:
        blocks.append(
            Paragraph(
                "Computed per loss family, on its complete trials: a parameter of one loss never varies among the other's "
                "trials. Each family's parameters are those all its trials sampled on the same range."
            )
        )
    for label, values in families.items():
        if len(families) > 1:
            blocks.append(Heading(3, label))
        if isinstance(values, str):
            blocks.append(Paragraph(f"({values})"))
        else:
            blocks.append(Table(("parameter", "importance"), tuple((k, f"{v:.3f}") for k, v in values.items())))
    return [*blocks, Image(path, "parameter importances")]


def _mark(steps: list[float]) -> float | tuple[float, float]:
    """One epoch, or the (first, last) span where the runs differ."""
    return steps[0] if len(set(steps)) == 1 else (min(steps), max(steps))


def curve_marks(client, record: StudyRecord, trials: list) -> dict[str, float | tuple[float, float]]:
    """Where the learning curves' steps meet the early stopping and the heating: {label: step, or (first, last) step}.

    Stock ASHA (and fifo) judges at the rung epochs of one schedule, and heating starts at
    ``heating_start`` x epochs. With budget-aware rungs every budget is its own schedule, and a
    trial's steps count the epochs it trained; a budget ends, and the last budget's heating
    starts, at the steps read from the trial's ``budget`` and ``epoch`` records.
    """
    max_epochs = record.epochs
    budget_rungs = record.scheduler == "budget"
    ends: dict[int, list[float]] = {}
    heating: list[float] = []
    for r in trials:
        p = r.data.params
        heated = p.get("loss", "softmax") == "softmax" and p.get("heating", "none") != "none" and "heating_start" in p
        if not budget_rungs:
            heating += [float(p["heating_start"]) * max_epochs] if heated else []
            continue
        budget, epoch = _history(client, r.info.run_id, "budget"), _history(client, r.info.run_id, "epoch")
        for step, b in _schedule_ends(budget, epoch).items():
            ends.setdefault(b, []).append(step)
        if heated and budget:
            last = max(budget.values())
            first = min(step for step, b in budget.items() if b == last)  # the step of its epoch epoch[first]
            heating.append(first - epoch.get(first, 1) + float(p["heating_start"]) * last)
    if budget_rungs:
        marks = {f"budget {b} ends": _mark(steps) for b, steps in sorted(ends.items()) if b < max_epochs}
    else:
        marks = {f"ASHA rung at epoch {rung}": float(rung) for rung in study_rungs(record)}
    if heating:
        marks["heating starts" + (" (range over trials)" if len(set(heating)) > 1 else "")] = _mark(heating)
    return marks


LADDER_AXIS = "epochs trained, over every budget"


def learning_curves(
    histories: dict[str, dict[int, float]],
    states: dict[str, str],
    metric: str,
    out: Path,
    marks: dict | None = None,
    ladder: bool = False,
) -> list[Block]:
    """The validation metric of every trial against its MLflow step; ``ladder``: a study on a ladder of budgets, whose
    steps count every epoch trained (the x axis and a paragraph say so)."""
    title = f"{metric} against epoch, all {len(histories)} trials"
    xlabel = LADDER_AXIS if ladder else "epoch"
    path = plots.curves(histories, out / "learning_curves.png", ylabel=metric, title=title, states=states, marks=marks, xlabel=xlabel)
    how = Paragraph(
        "The x axis counts the epochs each trial trained over every budget of the ladder, as MLflow's steps do: a trial "
        "promoted at a budget went on from its checkpoint taken before that budget's tail (heating, lr decay), so that "
        "tail's epochs are trained once for the judgement and left behind, and the curve falls back where the longer "
        "schedule goes on. A trial that finished budget b has trained more than b epochs."
    )
    return [Heading(2, "Validation metric against epoch"), *([how] if ladder else []), Image(path, "learning curves")]


def study_learning_curves(client, record: StudyRecord, trials: list, histories: dict[str, dict[int, float]], out: Path) -> list[Block]:
    """:func:`learning_curves` of a study's trials (``histories``: their validation metric by step) with the rungs and
    the heating marked: the report's section, and the PNG the study ends with (``draw_learning_curves``)."""
    states = {_trial_key(r): _trial_state(r) for r in trials}
    marks = curve_marks(client, record, trials)
    return learning_curves(histories, states, record.metric, out, marks, ladder=record.scheduler == "budget")


def draw_learning_curves(client, parent, trials: list, path: Path) -> Path:
    """learning_curves.png of a study as its report draws it (its trials' MLflow records, the rungs and heating marked):
    what the study ends with, so that the study holds one drawing of it (``study.artifacts.study_artifacts``)."""
    record = StudyRecord.from_params(parent.data.params, where=f"study {parent.data.tags.get('study_name')!r}")
    client = PrefetchedHistories(client, trials, [record.metric, *CURVE_KEYS])
    histories = {_trial_key(r): _history(client, r.info.run_id, record.metric) for r in trials}
    study_learning_curves(client, record, trials, histories, path.parent)
    return path


def parallel_coordinates(
    client, parent, record: StudyRecord, trials: list, histories: dict[str, dict[int, float]], out: Path
) -> list[Block]:
    """The complete trials' parameters and ``metric`` as parallel coordinates, a panel per loss family on the parameters
    its trials searched (``artifacts.draw_parallel_coordinates``), each trial on the axes of the parameters it had.

    From the Optuna study (a trial's params are the ones it sampled, so a conditional parameter
    is absent where its condition was false); if the storage is gone, from the trials' MLflow
    params that applied (``active_params``; values "None" or empty taken as absent). Parameters with one value in
    every trial of a family are left out.
    """
    heading = Heading(2, "Parallel coordinates")
    path = out / "parallel_coordinate.png"
    try:
        artifacts.draw_parallel_coordinates(_optuna_study(parent, record), record.metric, path)
        return [heading, Image(path, "parallel coordinates")]
    except Exception:  # storage moved or unreachable: the MLflow records
        pass
    groups: dict[str, tuple[list, list]] = {}
    for r in trials:
        key = _trial_key(r)
        if _trial_state(r) != "COMPLETE" or not histories.get(key):
            continue
        row = {k: _param_value(v) for k, v in active_params(r).items() if v not in ("None", "")}
        rows, values = groups.setdefault(f"loss {row.get('loss', '')}", ([], []))
        rows.append(row)
        values.append(list(histories[key].values())[-1])
    if len(groups) == 1:
        groups = {"": next(iter(groups.values()))}
    drawn = {}
    for label, (rows, values) in groups.items():
        varying = {name for name in {n for row in rows for n in row} if len({str(row.get(name)) for row in rows}) > 1}
        if len(rows) >= 2 and varying:
            drawn[label] = ([{k: v for k, v in row.items() if k in varying} for row in rows], values)
    if not drawn:
        return [heading, Paragraph("(fewer than two complete trials, or no parameter that varies)")]
    plots.family_parallel_coordinates(drawn, path, metric=record.metric)
    return [heading, Image(path, "parallel coordinates")]


def _param_value(text: str) -> Any:
    """An MLflow param (a string) as the number it spells, else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def finished_schedules(client, trials: list, histories: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """Per trial of a study with budget-aware rungs: {budget: the metric at the end of that budget's schedule}.

    Its steps are epochs trained over every budget; a schedule ends where the logged ``epoch`` equals ``budget``.
    """
    out = {}
    for r in trials:
        key = _trial_key(r)
        budget, epoch = _history(client, r.info.run_id, "budget"), _history(client, r.info.run_id, "epoch")
        ends = _schedule_ends(budget, epoch)
        out[key] = {ends[s]: v for s, v in histories.get(key, {}).items() if s in ends}
    return out


def early_stopping(
    record: StudyRecord, histories: dict[str, dict[int, float]], ends: dict[str, dict[int, float]] | None = None
) -> list[Block]:
    """Is early stopping trustworthy: the Spearman correlation of each rung's ranking with the full budget's.

    ``ends`` (studies with budget-aware rungs): the value of each finished schedule, read at its budget instead of an epoch.
    """
    metric, max_epochs = record.metric, record.epochs
    curves = [list(h.values()) for h in histories.values()]
    if ends is not None:  # dense by budget: a rung's value is its finished schedule's
        curves = [[e.get(b, float("nan")) for b in range(1, max_epochs + 1)] for e in ends.values() if max_epochs in e]
    correlation = rung_rank_correlation(curves, study_rungs(record), max_epochs)
    at = "the end of each rung's schedule" if ends is not None else "each ASHA rung"
    rows = tuple((f"{rung}", f"{row['spearman']:.3f}", f"{row['n']}") for rung, row in correlation.items())
    return [
        Heading(2, "Is early stopping trustworthy here?"),
        Paragraph(
            f"Spearman rank correlation between {metric} at {at} and at epoch {max_epochs}, over the trials that ran every epoch "
            "(few trials reach the end under early stopping, so read it with its n):"
        ),
        Table(("rung (epoch)", "Spearman rho", "trials"), rows or (("-", "-", "-"),)),
    ]


def study_finals(client, parent, out: Path) -> list[Block]:
    """The test metrics and diagnostics of the study's best config retrained by study.final --study."""
    name = parent.data.tags["study_name"]
    finals = _final_seed_runs(client, parent)
    heading = Heading(2, "Final model on the test classes (study.final --study)")
    if not finals:
        return [heading, Paragraph(("(none yet: ", Code(f"python -m study.final --study {name}"), ")"))]
    column = f"best config of {name}"
    return [
        heading,
        *paper_table({column: [_seed_metrics(r) for r in finals]}),
        *ensemble_line(client, parent),
        Heading(3, "Embedding diagnostics"),
        *final_diagnostics(client, {column: finals}, out),
    ]


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


def study_sections(client, parent, out: Path, top: int) -> list[Block]:
    """The blocks of a study's report, its PNGs written into ``out``; its settings are its record (study.record)."""
    record = StudyRecord.from_params(parent.data.params, where=f"study {parent.data.tags['study_name']!r}")
    metric = record.metric
    trials = tracking.child_runs(client, parent.info.experiment_id, parent.info.run_id, kind="trial")
    client = PrefetchedHistories(client, trials, [metric, *CURVE_KEYS])
    histories = {_trial_key(r): _history(client, r.info.run_id, metric) for r in trials}
    states = {_trial_key(r): _trial_state(r) for r in trials}
    budget_rungs = record.scheduler == "budget"
    selection = selection_of(client, parent, out)
    numbers = {int(r.data.tags["optuna_trial_number"]): _trial_key(r) for r in trials if "optuna_trial_number" in r.data.tags}
    return [
        *study_header(parent, record),
        *top_trials(trials, histories, states, metric, record.mode, top),
        *pick_section(selection, numbers),
        *best_config(client, parent, out, picked=selection is not None, final_epochs=record.final_epochs),
        *importances(client, parent, record, out),
        *parallel_coordinates(client, parent, record, trials, histories, out),
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
            target = out / f"similarity_{_slug(conf)}.png"
            Path(client.download_artifacts(first.info.run_id, names[0], str(out / "tmp"))).replace(target)
            blocks.append(Image(target, "pair similarities", caption=f"{conf} (seed {first.data.tags.get('seed')}):"))
    return blocks


def final_diagnostics(client, groups: dict[str, list], out: Path) -> list[Block]:
    """Pair-similarity statistics, histograms and the mean-proxy norm over training of final runs, per configuration."""
    proxy = {  # mean_proxy_norm: its name in records written before the train_ prefix
        conf: _mean_over_seeds(client, runs, "train_mean_proxy_norm") or _mean_over_seeds(client, runs, "mean_proxy_norm")
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
        *embedding_pictures(client, groups, out),
    ]


PICTURES = (  # artifacts of a study.final seed run: (file name prefix, what it shows)
    ("retrieval_grid", "test queries and their 8 nearest neighbours, wrong classes outlined in red"),
    ("tsne", "t-SNE map of the test embeddings, one colour per class"),
)


def embedding_pictures(client, groups: dict[str, list], out: Path) -> list[Block]:
    """The retrieval grid and the t-SNE map that study.final logged for each configuration's first seed."""
    blocks: list[Block] = []
    for conf, runs in groups.items():
        first = min(runs, key=lambda r: int(r.data.tags.get("seed", 0)))
        logged = [a.path for a in client.list_artifacts(first.info.run_id)]
        for prefix, caption in PICTURES:
            names = [name for name in logged if name.startswith(prefix) and name.endswith(".png")]
            if names:
                target = out / f"{prefix}_{_slug(conf)}.png"
                Path(client.download_artifacts(first.info.run_id, names[0], str(out / "tmp"))).replace(target)
                blocks += [Paragraph(f"{conf} (seed {first.data.tags.get('seed')}), {caption}:"), Image(target, prefix)]
    return blocks


def grid_report(client, parent, out: Path) -> list[Block]:
    tags = parent.data.tags
    seeds = _final_seed_runs(client, parent)
    groups: dict[str, list] = {}
    for r in seeds:
        if r.info.status == "FINISHED":
            groups.setdefault(r.data.tags.get("configuration", "?"), []).append(r)
    losses = {conf: _mean_over_seeds(client, runs, "train_loss") for conf, runs in groups.items()}
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
        *paper_table({conf: [_seed_metrics(r) for r in runs] for conf, runs in groups.items()}),
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
MD_SPECIAL = frozenset("\\`*[]<>|#~$&")


def md_text(text: str) -> str:
    """``text`` as Markdown that reads as ``text``, on one line: the characters that would be markup escaped with a backslash.

    An ``_`` between two letters or digits is left alone (it can neither open nor close emphasis), so names like
    ``trial_0`` stay readable.
    """
    text = " ".join(text.splitlines())  # a line break would end a table's row or start a block

    def escaped(i: int, c: str) -> str:
        inside_word = c == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        return "\\" + c if c in MD_SPECIAL or (c == "_" and not inside_word) else c

    return "".join(escaped(i, c) for i, c in enumerate(text))


def _fence(text: str, least: int) -> str:
    """Backticks that open and close ``text`` as code: more than the longest run of backticks in it."""
    return "`" * max(least, 1 + max(map(len, re.findall("`+", text)), default=0))


def _md_line(text: str) -> str:
    """Inline Markdown that starts a line (a paragraph, a list item), kept from starting a list or an indented code block."""
    return re.sub(r"^(?:[-+]|\d{1,9}[.)])", lambda m: m[0][:-1] + "\\" + m[0][-1], text.lstrip(" \t"))


def _md_inline(text: Inline, in_table: bool = False) -> str:
    if isinstance(text, tuple):
        return "".join(_md_inline(part, in_table) for part in text)
    if isinstance(text, Strong):
        return f"**{md_text(text.text)}**"
    if isinstance(text, Code):  # no escapes inside a code span: its fence is longer than any run of backticks in it
        body = " ".join(text.text.splitlines())
        fence = _fence(body, 1)
        pad = " " if body[:1] in ("`", " ") or body[-1:] in ("`", " ") else ""
        return fence + pad + (body.replace("|", "\\|") if in_table else body) + pad + fence
    return md_text(str(text))


def _md_block(block: Block) -> str:
    match block:
        case Heading(level, text):
            return "#" * level + " " + _md_inline(text)
        case Paragraph(text):
            return _md_line(_md_inline(text))
        case Bullets(items):
            return "\n".join("- " + _md_line(_md_inline(item)) for item in items)
        case Table(header, rows):
            lines = ["| " + " | ".join(_md_inline(cell, in_table=True) for cell in row) + " |" for row in (header, *rows)]
            return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])
        case Preformatted(text, language):
            fence = _fence(text, 3)
            return f"{fence}{language}\n{text}\n{fence}"
        case Image(path, alt, caption):
            image = f"![{md_text(alt)}]({path.name})"
            return _md_line(f"{_md_inline(caption)} {image}") if caption else image
    raise TypeError(f"not a block of the report: {block!r}")


def markdown(blocks: list[Block]) -> str:
    """report.md: the blocks in Markdown (GitHub's, with tables), a blank line between two."""
    return "\n\n".join(map(_md_block, blocks)) + "\n"


HTML_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 1.5em auto; padding: 0 1em;
       color: #1b1f24; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #c9ced6; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f2f5; }
code { background: #f0f2f5; padding: 0.1em 0.3em; border-radius: 3px; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; }
pre code { background: none; padding: 0; }
img { max-width: 100%; height: auto; border: 1px solid #e1e4e8; margin: 0.3em 0; }
"""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _html_inline(text: Inline) -> str:
    if isinstance(text, tuple):
        return "".join(map(_html_inline, text))
    if isinstance(text, Strong):
        return f"<strong>{html.escape(text.text)}</strong>"
    if isinstance(text, Code):
        return f"<code>{html.escape(text.text)}</code>"
    return html.escape(str(text))


def _html_row(cells: tuple[Inline, ...], tag: str) -> str:
    return "<tr>" + "".join(f"<{tag}>{_html_inline(cell)}</{tag}>" for cell in cells) + "</tr>"


def _embedded_png(path: Path, alt: str, folder: Path) -> str:
    """``path`` as an <img> that holds its bytes (a data: URI), if it is a PNG file directly inside ``folder``, else a note.

    ``folder`` is the report's own: a link, a file elsewhere or one that is not a PNG is never read into the page.
    """
    inside = path.parent.resolve() == folder.resolve() and not path.is_symlink() and path.is_file()
    data = path.read_bytes() if inside else b""
    if not data.startswith(PNG_SIGNATURE):
        return f"[missing image {html.escape(path.name)}]"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'


def _html_block(block: Block, folder: Path) -> str:
    match block:
        case Heading(level, text):
            return f"<h{level}>{_html_inline(text)}</h{level}>"
        case Paragraph(text):
            return f"<p>{_html_inline(text)}</p>"
        case Bullets(items):
            return "<ul>" + "".join(f"<li>{_html_inline(item)}</li>" for item in items) + "</ul>"
        case Table(header, rows):
            return "\n".join(["<table>", _html_row(header, "th"), *(_html_row(row, "td") for row in rows), "</table>"])
        case Preformatted(text):
            return f"<pre><code>{html.escape(text)}</code></pre>"
        case Image(path, alt, caption):
            return "<p>" + (_html_inline(caption) + " " if caption else "") + _embedded_png(path, alt, folder) + "</p>"
    raise TypeError(f"not a block of the report: {block!r}")


def html_page(blocks: list[Block], folder: Path, title: str) -> str:
    """report.html: the blocks as one self-contained page, its images (PNGs of ``folder``) embedded as data: URIs.

    The page needs no other file and renders in MLflow's artifact viewer; nothing is fetched and no script runs.
    """
    body = "\n".join(_html_block(block, folder) for block in blocks)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>{HTML_STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


# -- the command -----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m study.report",
        description="Write a Markdown report with plots of a study (study.launch) or of a grid of final runs (study.final --space) "
        "from its MLflow records, and log it to the study's parent run under report/.",
    )
    parser.add_argument(
        "--study", required=True, help="the study's name (study.launch --study-name, or the name of a study.final --space run)"
    )
    parser.add_argument(
        "--out",
        help="output folder: new, empty, or one a previous report wrote (default: runs/reports/NAME); "
        "only the files the report writes go there and to MLflow",
    )
    tracking.add_tracking_flags(parser.add_argument, "MLflow experiment to look in (default: all)", None)
    parser.add_argument("--top", type=int, default=10, help="trials in the top-trials table (default 10)")
    parser.add_argument("--no-log", action="store_true", help="only write the files; do not log them to the parent run")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top {args.top}: expected an integer >= 1")
    names.check_names({"--study": args.study, "--experiment": args.experiment})
    return args


def logged_files(client, parent, folder: Path) -> list[Path]:
    """The report's files that go to the parent run's ``report/``: all but the plots the study ended with at the run's
    root (``study.artifacts``: the same drawings, from the same records), so that the run holds each plot once.
    ``report.html`` embeds every picture; ``report.md`` names them as files beside it, as in the report's folder."""
    held = {a.path for a in client.list_artifacts(parent.info.run_id) if not a.is_dir}
    return [path for path in sorted(folder.iterdir()) if path.is_file() and not (path.suffix == ".png" and path.name in held)]


MARKER = ".study-report"  # in a folder the report wrote: the files it wrote there, one a line


def out_folder(flag: str | None, study: str) -> Path:
    """The report's folder: --out, else runs/reports/STUDY; refused where the report could clobber what it did not write.

    An --out that exists must be a folder that is empty or holds a previous report (its MARKER); the default folder
    is the report's own. A study name that would leave runs/reports/ asks for --out.
    """
    if flag is None:
        base = tracking.runs_dir() / "reports"
        out = (base / study).resolve()
        if out.parent != base.resolve():
            raise tracking.UsageError(f"--study {study!r}: not usable as a folder name under {base}; pass --out DIR")
        return out
    out = Path(flag).expanduser()
    if out.exists() and not out.is_dir():
        raise tracking.UsageError(f"--out {out}: exists and is not a folder; expected a folder (or a path to create)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise tracking.UsageError(
            f"--out {out}: a non-empty folder that study.report did not write; expected a new or empty folder, or a previous report's"
        )
    return out


def publish(staging: Path, out: Path) -> list[str]:
    """Move the files of ``staging`` (a fresh folder inside ``out``) up into ``out``, replacing a previous report's; list them in MARKER."""
    names = sorted(p.name for p in staging.iterdir())
    for name in names:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        staging.joinpath(name).replace(target)  # a rename: a link at the target is replaced, never followed
    (out / MARKER).write_text("".join(f"{name}\n" for name in names))
    return names


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    inputs.redact_logs()
    tracking.configure_mlflow()
    try:
        args = parse_args(argv)
        uri = tracking.resolve_tracking_uri(args.tracking_uri)
        tracking.check_store(uri, "study.report")
        client = mlflow.MlflowClient(uri)
        parent = find_parent(client, args.study, args.experiment)
        out = out_folder(args.out, args.study)
        out.mkdir(parents=True, exist_ok=True)
    except tracking.UsageError as error:
        return inputs.print_error(error)
    # The report is written into a fresh folder of its own, so its clean-up and the upload below see only its files.
    staging = Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    try:
        write_report(client, parent, staging, args.top)
        if not args.no_log:
            for path in logged_files(client, parent, staging):
                client.log_artifact(parent.info.run_id, str(path), artifact_path="report")
        publish(staging, out)
    except tracking.UsageError as error:  # a parent run that holds no study's record
        return inputs.print_error(error)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    path = out / "report.md"
    print(f"report: {path}" + ("" if args.no_log else f"  (also in MLflow run {parent.info.run_id}, artifacts report/)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

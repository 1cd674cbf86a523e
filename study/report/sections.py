"""The sections of a study's report, read from its MLflow records and its Optuna study: the header, the top trials,
the pick, the best config, importances, parallel coordinates, learning curves and the early stopping's rungs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from study import inputs, plots
from study.records import artifacts, tracking
from study.records.curves import draw_study_curves, metric_history, schedule_ends, study_rungs, trial_key, trial_state
from study.records.study_record import StudyRecord
from study.records.trials import ACTIVE_PARAMS_TAG, active_params
from study.report.document import Block, Bullets, Code, Heading, Image, Inline, Paragraph, Preformatted, Strong, Table
from study.search.race import selection_from_record, standing
from study.search.schedulers import describe_rule
from trainables.core.config import ConfigError, TrainConfig

CONFIG_KEYS = frozenset(TrainConfig.keys())
TABLE_METRICS = (
    ("NMI", "test_nmi"),
    ("R@1", "test_recall_at_1"),
    ("R@2", "test_recall_at_2"),
    ("R@4", "test_recall_at_4"),
    ("R@8", "test_recall_at_8"),
    ("MAP@R", "test_map_at_r"),
)


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


# -- reading MLflow --------------------------------------------------------------------------------------------------


def find_parent(client, name: str, experiment: str | None):
    """The newest study (study.launch) or grid-final (study.final --space) parent run named ``name``."""
    if experiment:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise inputs.UsageError(f"--experiment {experiment}: no such MLflow experiment")
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
        raise inputs.UsageError(
            f"--study {name}: no study or grid of final runs of that name"
            + (f" in experiment {experiment!r}" if experiment else "")
            + "; expected the --study-name of study.launch or the name of a study.final --space run"
        )
    return parents[0]


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


def trained_params(run) -> dict[str, str]:
    """The params of a trial's run that it trained with.

    Every config key is a param of the run, defaults included (an ICE trial's ``alpha``, a softmax trial's
    ``ice_scale``); its tag ``active_params`` (``study.records.trials``) names the keys that applied, and for a run recorded
    before that tag they are found from its params as the tag would say. A param that is no config key is always shown.
    """
    tag = run.data.tags.get(ACTIVE_PARAMS_TAG)
    active = tag.split(",") if tag is not None else active_params(run.data.params)
    if active is None:
        return dict(run.data.params)
    return {k: v for k, v in run.data.params.items() if k in active or k not in CONFIG_KEYS}


def top_trials(
    trials: list, histories: dict[str, dict[int, float]], states: dict[str, str], metric: str, mode: str, top: int
) -> list[Block]:
    """The ``top`` complete trials by their last ``metric``, with the params that vary between trials; a param a trial
    did not train with (``active_params``) is a blank cell, as in trials.csv."""
    rows = [
        (list(histories[key].values())[-1], key, r) for r in trials if states.get(key := trial_key(r)) == "COMPLETE" and histories.get(key)
    ]
    rows.sort(key=lambda row: row[0], reverse=(mode == "max"))
    params = {r.info.run_id: trained_params(r) for r in trials}
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
        "was judged at, so that tail was trained again (its run's metrics retrained/..., its tag retrained_epochs). A "
        "blank cell: a parameter the trial did not train with (the other loss's, or one its schedule leaves unused)."
    )
    return [Heading(2, f"Top trials by {metric}"), table, *([notes] if rows else [Paragraph("(no complete trial)")])]


def schedule_epochs(run, history: dict[int, float]) -> int:
    """The epochs of the schedule a trial's run finished: its last ``completed_budget`` on a ladder of budgets (where
    its last step can be an epoch of a budget it did not finish), else its epochs recorded."""
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
    source = f"best_config.yaml of study {parent.data.tags.get('study_name')}"
    values = inputs.parse_yaml(text, source, "a mapping of config keys")
    try:  # what study.final --study retrains: the same check, so a hand edit is refused here as it is there
        TrainConfig.from_dict(values, source=source)
    except (ConfigError, TypeError, ValueError) as error:
        raise inputs.UsageError(str(error).splitlines()[0]) from None
    which = "The picked trial's config" if picked else "The best trial's config"
    trials_epochs = values.get("epochs")
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


def recorded_selection(client, parent, out: Path) -> dict[str, Any] | None:
    """The study's ``selection.json`` (its race), None when it has none; one that does not read as the race's record
    (a hand edit) is a UsageError naming the file and what failed."""
    try:
        path = Path(client.download_artifacts(parent.info.run_id, "selection.json", str(out / "tmp")))
    except Exception:  # no race (a grid, --confirm-budget 0), or the study has not ended
        return None
    source = f"selection.json of study {parent.data.tags.get('study_name')}"
    try:
        record = json.loads(path.read_text())
        selection_from_record(record, "max")  # every field the report reads
        str(record["verdict"])
    except (ValueError, KeyError, TypeError, IndexError) as error:
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        raise inputs.UsageError(f"{source}: not the race's record the study writes ({reason})") from None
    return record


def _optuna_study(parent, record: StudyRecord):
    """The study's Optuna study, from the storage its record names (raises when that storage is gone)."""
    import optuna

    from study.search.journal import open_storage

    return optuna.load_study(study_name=parent.data.tags.get("study_name"), storage=open_storage(record.optuna_storage))


def importance_section(client, parent, record: StudyRecord, out: Path) -> list[Block]:
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
                "trials. Each family's parameters are those all its trials sampled on the same range. (optuna-dashboard's "
                "Hyperparameter Importance pools the trials of both families in one fANOVA, so its numbers differ.)"
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


LADDER_NOTE = (
    "The x axis is the epoch of each trial's schedule, as MLflow's steps are: a trial promoted at a budget went on "
    "from its checkpoint taken before that budget's tail (heating, lr decay), so that tail's epochs were trained once "
    "for the judgement and again by the longer schedule. The curve shows the judged ones (at step b, the end of "
    "budget b's schedule), then the longer schedule from the epoch after; the run keeps the tail trained again as "
    "retrained/<metric>. A trial that finished budget b has trained more than b epochs (its epochs_trained)."
)


def study_learning_curves(client, record: StudyRecord, trials: list, histories: dict[str, dict[int, float]], out: Path) -> list[Block]:
    """The section of a study's learning curves (``histories``: the trials' validation metric by step), drawn as the
    study's own learning_curves.png (``curves.draw_study_curves``); a ladder of budgets is said in a paragraph."""
    path = draw_study_curves(client, record, trials, histories, out)
    ladder = record.scheduler == "budget"
    return [Heading(2, "Validation metric against epoch"), *([Paragraph(LADDER_NOTE)] if ladder else []), Image(path, "learning curves")]


def parallel_coordinates_section(
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
        key = trial_key(r)
        if trial_state(r) != "COMPLETE" or not histories.get(key):
            continue
        row = {k: _param_value(v) for k, v in trained_params(r).items() if v not in ("None", "")}
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

    Its steps are the epochs of its schedule; a budget's schedule ends at the step that equals the logged ``budget``.
    """
    out = {}
    for r in trials:
        key = trial_key(r)
        ends = schedule_ends(metric_history(client, r.info.run_id, "budget"))
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

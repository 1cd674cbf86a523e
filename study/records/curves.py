"""A study's learning curves from its MLflow records: each trial's validation metric by step, where the rungs and the
heating fall, and learning_curves.png, drawn once for the study's end and its report."""

from __future__ import annotations

from pathlib import Path

from study import plots
from study.records import tracking
from study.records.study_record import StudyRecord
from trainables.core.budgets import rung_budgets


def asha_rungs(grace_period: int, reduction_factor: float, max_epochs: int) -> list[int]:
    """The epochs at which ASHA compares trials: grace * factor^i below ``max_epochs`` (trainables.core.budgets)."""
    return rung_budgets(max_epochs, grace_period, reduction_factor)[:-1] if grace_period <= max_epochs else []


def study_rungs(record: StudyRecord) -> list[int]:
    """:func:`asha_rungs` of a study: its recorded grace period and reduction factor, below its epochs."""
    return asha_rungs(record.grace_period, record.reduction_factor, record.epochs)


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


CURVE_KEYS = ("budget",)  # with the study's metric: what a study's curves and schedule ends are read from


def metric_history(client, run_id: str, key: str) -> dict[int, float]:
    """A run's metric by step (epoch), in step order; the last value logged at a step wins."""
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in points}


def trial_key(run) -> str:
    return run.info.run_name or run.data.tags.get("trial_id")


def trial_state(run) -> str:
    """A trial run's Optuna state (written when the study ends), else how Tune saw it end, else "?"."""
    return run.data.tags.get("optuna_state", run.data.tags.get("trial_state", "?"))


def schedule_ends(budget: dict[int, float]) -> dict[int, int]:
    """{step: budget} at the steps where a budget's schedule finished: the step (the epoch) equals the logged
    ``budget``. A rung's tail trained again is logged under other names (``retrained/``), so this is the point the
    trial was judged on."""
    return {step: int(b) for step, b in budget.items() if step == b}


def _mark(steps: list[float]) -> float | tuple[float, float]:
    """One epoch, or the (first, last) span where the runs differ."""
    return steps[0] if len(set(steps)) == 1 else (min(steps), max(steps))


def curve_marks(client, record: StudyRecord, trials: list) -> dict[str, float | tuple[float, float]]:
    """Where the learning curves' steps meet the early stopping and the heating: {label: step, or (first, last) step}.

    Stock ASHA (and fifo) judges at the rung epochs of one schedule, and heating starts at
    ``heating_start`` x epochs. With budget-aware rungs every budget is its own schedule: a budget
    ends at the step (epoch) read from the trial's ``budget`` record, and the heating of the last
    budget a trial trained starts at ``heating_start`` x that budget.
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
        budget = metric_history(client, r.info.run_id, "budget")
        for step, b in schedule_ends(budget).items():
            ends.setdefault(b, []).append(step)
        if heated and budget:
            heating.append(float(p["heating_start"]) * max(budget.values()))
    if budget_rungs:
        marks = {f"budget {b} ends": _mark(steps) for b, steps in sorted(ends.items()) if b < max_epochs}
    else:
        marks = {f"ASHA rung at epoch {rung}": float(rung) for rung in study_rungs(record)}
    if heating:
        marks["heating starts" + (" (range over trials)" if len(set(heating)) > 1 else "")] = _mark(heating)
    return marks


def draw_study_curves(client, record: StudyRecord, trials: list, histories: dict[str, dict[int, float]], out: Path) -> Path:
    """learning_curves.png in ``out``: the validation metric of every trial (``histories``) against its MLflow step, with
    the rungs and the heating marked. A trial's steps are the epochs of its schedule, on a ladder of budgets too (a
    rung's tail trained again is not on its curve)."""
    states = {trial_key(r): trial_state(r) for r in trials}
    marks = curve_marks(client, record, trials)
    title = f"{record.metric} against epoch, all {len(histories)} trials"
    return plots.curves(
        histories, out / "learning_curves.png", ylabel=record.metric, title=title, states=states, marks=marks, xlabel="epoch"
    )


def draw_learning_curves(client, parent, trials: list, path: Path) -> Path:
    """learning_curves.png of a study as its report draws it (its trials' MLflow records, the rungs and heating marked):
    what the study ends with, so that the study holds one drawing of it (``study.records.artifacts.study_artifacts``)."""
    record = StudyRecord.from_params(parent.data.params, where=f"study {parent.data.tags.get('study_name')!r}")
    client = PrefetchedHistories(client, trials, [record.metric, *CURVE_KEYS])
    histories = {trial_key(r): metric_history(client, r.info.run_id, record.metric) for r in trials}
    return draw_study_curves(client, record, trials, histories, path.parent)

"""Ray Tune callbacks of a study: MLflow child runs per trial and live terminal progress.

The driver writes to MLflow (workers never do): one child run per Tune trial
under the study's parent run, with the trial's params, every epoch's metrics
(step = the epoch of the trial's schedule, ``result_step``; ``result_metrics``), its node and device, how it ended (``trial_state``, from
``study.search.trial.trial_outcome``), the config keys it trained with (tag ``active_params``; the params are those keys) and a
final status (FINISHED, or FAILED with the reason). How the records reach MLflow, and wait while it is away, is
``study.records.trials.TrialRecorder``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray.tune import Callback

from study.launch.heap import Releaser
from study.launch.tunestate import KeepTuneState, drop_checkpoint_links, keep_checkpoint_links
from study.records.ending import failed_tags
from study.records.tracking import first_error_line
from study.records.trials import TrialRecorder, active_tag
from study.search.race import planned_runs
from study.search.trial import COMPLETE, FAIL, PRUNED, confirmed_trial, epochs_done, is_finite_number, train_part, trial_outcome

log = logging.getLogger(__name__)

ENDED = ("TERMINATED", "ERROR")  # a Tune trial's statuses once it has ended
STRING_KEYS = ("node", "node_ip", "node_id", "device", "resumed_from_epoch")  # tags of the trial's run
# The ladder's bookkeeping that MLflow's step already says (epoch) or that is the searcher's (objective_step).
STEP_KEYS = {"epoch", "objective_step"}
# Where a trial trains a single budget (its whole schedule), these repeat the step or a constant: left out.
LADDER_KEYS = {"budget", "completed_budget", "epochs_trained"}
SKIP_KEYS = {
    "training_iteration",
    "timestamp",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "hostname",
    "date",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "done",
    "trial_id",
    "config",
}


def trial_error_text(trial) -> str | None:
    """The trial's error: Tune writes it to the trial's local folder first and syncs it to storage later."""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path) as f:
            return f.read()
    return trial.get_error() if hasattr(trial, "get_error") else None


def result_step(result: dict[str, Any]) -> int:
    """The MLflow step of a Tune result: the epoch of the trial's schedule (within the budget it trains), 1 to N."""
    return int(result.get("epoch", result.get("training_iteration", 0)))


def result_trained(result: dict[str, Any]) -> int:
    """The epochs a trial has trained by this result, over every budget (a retrained tail included): monotone, where
    the step is not (a promoted trial trains its rung's tail again, at steps it has logged)."""
    return int(result.get("epochs_trained", result.get("training_iteration", 0)))


def result_metrics(result: dict[str, Any], max_epochs: int) -> dict[str, float]:
    """The finite numeric metrics of a Tune result for MLflow, without Tune's bookkeeping or values the step says.

    ``budget``, ``completed_budget`` and ``epochs_trained`` stay for a trial on a ladder of budgets, where they are
    not the step's; a trial trained on one budget of ``max_epochs`` (every epoch trained once) records none of them.
    """
    drop = SKIP_KEYS | STEP_KEYS
    if result.get("budget", max_epochs) == max_epochs and result_trained(result) == result_step(result):
        drop = drop | LADDER_KEYS
    return {k: float(v) for k, v in result.items() if k not in drop and is_finite_number(v)}


class MlflowTrials(Callback):
    """One MLflow child run per trial (see TrialRecorder); the driver is the only writer, from the recorder's writer thread.

    A confirmation re-run (its config names the Optuna trial it re-runs, ``study.search.trial.CONFIRMS_KEY``) is
    recorded as a ``confirmation`` run with the training config as its params.
    """

    def __init__(self, recorder: TrialRecorder, metric: str, max_epochs: int) -> None:
        self.recorder, self.metric, self.max_epochs = recorder, metric, max_epochs

    def submit(self, op: dict[str, Any]) -> None:
        number = confirmed_trial(op["config"])
        kind = {"kind": "trial"} if number is None else {"kind": "confirmation", "confirms": number}
        self.recorder.submit({**op, "config": train_part(op["config"]), **kind})

    def on_trial_start(self, iteration, trials, trial, **info):
        self.submit({"op": "start", "trial_id": trial.trial_id, "config": dict(trial.config)})

    def on_trial_result(self, iteration, trials, trial, result, **info):
        op = {
            "op": "result",
            "trial_id": trial.trial_id,
            "step": result_step(result),
            "trained": result_trained(result),
            "metrics": result_metrics(result, self.max_epochs),
            "tags": {k: str(result[k]) for k in STRING_KEYS if k in result},
            "time_ms": int(time.time() * 1000),
            "config": dict(trial.config),
        }
        self.submit(op)

    def on_trial_complete(self, iteration, trials, trial, **info):
        state = trial_outcome(trial.last_result, error=False, metric=self.metric, max_epochs=self.max_epochs)
        tags = {"stopped_early": str(state == PRUNED).lower(), "trial_state": state, **active_tag(train_part(trial.config))}
        if (
            confirmed_trial(trial.config) is None
        ):  # what the searcher tells Optuna, by the same rule: the end of the study has nothing to add
            tags["optuna_state"] = state
        self.submit({"op": "complete", "trial_id": trial.trial_id, "tags": tags, "config": dict(trial.config)})

    def on_trial_error(self, iteration, trials, trial, **info):
        reason = first_error_line(trial_error_text(trial))
        tags = failed_tags(reason, train_part(trial.config), optuna=confirmed_trial(trial.config) is None)
        self.submit({"op": "error", "trial_id": trial.trial_id, "tags": tags, "config": dict(trial.config)})


def trial_epochs(trial) -> int:
    """The epochs a Tune trial has trained so far, over every budget (0 before its first report)."""
    return result_trained(trial.last_result or {})


def ladder_ends(rungs: Sequence[int], max_epochs: int, full: float) -> tuple[list[float], float]:
    """The epochs a trial has trained when the schedule of each stop of the ladder has finished (each rung below
    ``max_epochs``, then ``max_epochs``), the retrained tails of ``full`` spread evenly over its promotions; and the
    ladder's eta, (max_epochs / rungs[0]) ^ (1 / len(rungs)). For rungs at 4 of 16, full 17: ([4, 17], 4)."""
    stops = [*sorted(r for r in set(rungs) if r < max_epochs), max_epochs]
    eta = (max_epochs / stops[0]) ** (1 / (len(stops) - 1)) if len(stops) > 1 else 1.0
    tail = (full - max_epochs) / (len(stops) - 1) if len(stops) > 1 else 0.0
    return [stop + i * tail for i, stop in enumerate(stops)], eta


def trial_epochs_left(epochs: float, rungs: Sequence[int], max_epochs: int, full: float, keep: Sequence[float] | None = None) -> float:
    """Epochs a search trial that has trained ``epochs`` is expected to train still, on the ladder of ``rungs`` (where
    trials are judged, below ``max_epochs``): the rest of the stretch it is on, then each later one with the share of
    trials the rungs before it keep (``keep``, one a rung; successive halving's 1 / eta each without it,
    eta = (max_epochs / rungs[0]) ^ (1 / len(rungs))). A trial past a rung was kept there; one at a rung has yet to be
    judged. ``full``: the epochs of a trial that trains to the end, the retrained tails of a budget-aware ladder
    included (trainables.core.budgets), spread evenly over its promotions (:func:`ladder_ends`).

    For stock ASHA's rung at 4 of 16 epochs, no tails (full 16): 4 + 12 / 4 epochs a new trial, 11 for one at 5 (kept).
    """
    ends, eta = ladder_ends(rungs, max_epochs, full)
    keep = [1 / eta] * (len(ends) - 1) if keep is None else keep
    left, start, reach = 0.0, 0.0, 1.0
    for i, end in enumerate(ends):
        if epochs <= end:
            left += reach * (end - max(epochs, start))
            reach *= keep[i] if i < len(keep) else 1.0
        start = end
    return left


def kept_share(k: int, eta: float) -> float:
    """The chance that the ``k``-th trial judged at a rung (k >= 1) goes on, under ASHA's cutoff: the (1 - 1 / eta)
    percentile (numpy's, interpolated) of the k - 1 scores the rung recorded before it, when the scores come in no
    order. The trial's rank among the k is uniform, and it beats the score at position h = (1 - 1 / eta) (k - 2) of the
    k - 1 before it, counted from the lowest, with chance (k - 1 - h) / k = 1 / eta + (1 - 2 / eta) / k: 1 for the
    first (nothing to compare it with), 1/2 for the second, then 0.42, 0.38, ... toward 1 / eta (eta 4)."""
    return 1.0 if k <= 1 else 1 / eta + (1 - 2 / eta) / k


def rung_keep(judged: int, coming: int, eta: float, strata: int = 1) -> float:
    """The share of ``coming`` trials a rung keeps, ``judged`` judged there before them: the mean of :func:`kept_share`
    from the (judged + 1)-th on; 1 / eta with none coming. The first trials at a rung are kept more often than 1 / eta
    (ASHA has little to compare them with): 16 new trials at eta 4 keep 5.9 (0.37 each), not 4. With ``strata``
    (halving run apart for each loss, study.search.halving), the trials taken as spread evenly over them: the k-th
    judged is the ceil(k / strata)-th of its stratum (16 over 2 keep 7.2)."""
    if coming <= 0:
        return 1 / eta
    return sum(kept_share(math.ceil(k / strata), eta) for k in range(judged + 1, judged + coming + 1)) / coming


def ladder_keep(
    waiting: int, ended: list[int], running: list[int], rungs: Sequence[int], max_epochs: int, full: float, strata: int = 1
) -> list[float]:
    """The share each rung is expected to keep of the trials not judged there yet (:func:`rung_keep`, over ``strata``):
    ``waiting`` trials not started, the rest of those ``running``; a trial past a rung's end was judged there, and so
    was one that ended at it (pruned)."""
    ends, eta = ladder_ends(rungs, max_epochs, full)
    keep = []
    for end in ends[:-1]:
        judged = sum(e > end for e in [*ended, *running]) + sum(e == end for e in ended)
        keep.append(rung_keep(judged, waiting + sum(e <= end for e in running), eta, strata))
    return keep


def epochs_left(
    search: tuple[int, list[int], list[int]], reruns: tuple[int, list[int]], max_epochs: int, rungs: Sequence[int], strata: int = 1
) -> float:
    """Epochs the study still trains: ``search`` (trials not started, epochs of the ended ones, of the running ones) and
    ``reruns`` (not started, epochs of the running ones), each re-run one schedule of ``max_epochs``; ``strata``: the
    values of the key halving runs apart for (1: none).

    A search trial is expected to train what successive halving keeps (:func:`trial_epochs_left`, at the shares of
    :func:`ladder_keep`), not the ended ones' mean: ASHA keeps the first trials at a rung freely (it has nothing to
    compare them with yet), so the first to end cost the whole ladder while the later ones are kept less often, and
    the ended ones' mean overstates what is left (docs/performance.md, measurements behind the code). The longest ended
    trial gives the ladder's full length once one has trained it.
    """
    waiting, ended, running = search
    full = max([max_epochs, *ended])
    keep = ladder_keep(waiting, ended, running, rungs, max_epochs, full, strata)
    rerun_waiting, rerun_running = reruns
    return (
        waiting * trial_epochs_left(0, rungs, max_epochs, full, keep)
        + sum(trial_epochs_left(e, rungs, max_epochs, full, keep) for e in running)
        + rerun_waiting * max_epochs
        + sum(max_epochs - e for e in rerun_running)
    )


def pace_since(first: tuple[float, int], now: tuple[float, int]) -> float:
    """Seconds per epoch (the study's slots together) from ``first`` to ``now``, each (time, epochs trained by then):
    the pace the progress line's time left is estimated at, from the first reported epoch on: it does as well as a
    recent window (docs/performance.md, time left). ``now`` has trained more epochs than ``first``."""
    return (now[0] - first[0]) / (now[1] - first[1])


def study_epochs_left(
    ended: list[int],
    running: list[int],
    reruns: tuple[int, list[int]],
    num_samples: int,
    max_epochs: int,
    rungs: Sequence[int],
    race: tuple[int, int, float],
    strata: int = 1,
) -> float:
    """Epochs a study of ``num_samples`` search trials on ``rungs`` (halved apart in ``strata``) still trains, then its
    race (``race``: candidates, folds, budget; study.search.race): the search trials' epochs, ``ended`` and
    ``running``; the re-runs started and the epochs of the running ones (``reruns``), and those the race trains if
    none is dropped (``selection.planned_runs``).

    The race's rounds are counted on the search's epochs trained so far, not on its estimate: the budget's rule lets a
    whole round (3 re-runs of the full budget in the default study) start or not, so an estimate near its threshold was
    off by that round either way; what the search has trained never counts a round the race cannot pay for, and is
    exact at the search's end.
    """
    search = (max(num_samples - len(ended) - len(running), 0), ended, running)
    started, rerun_running = reruns
    planned = planned_runs(*race, sum(ended) + sum(running), max_epochs)
    return epochs_left(search, (max(planned - started, 0), rerun_running), max_epochs, rungs, strata)


def rung_reached(epochs: list[int], rungs: Sequence[int]) -> bool:
    """Whether a search trial (``epochs``: each one's epochs trained) has trained to the first of ``rungs``; with no
    rungs, whether one has trained an epoch."""
    return max(epochs, default=0) >= min(rungs, default=1)


def study_time_left(
    first: tuple[float, int] | None,
    now: tuple[float, int],
    ended: list[int],
    running: list[int],
    reruns: tuple[int, list[int]],
    study: tuple[int, int, Sequence[int], tuple[int, int, float], int],
) -> float | None:
    """Seconds a study still needs: :func:`study_epochs_left` of ``ended`` and ``running`` search trials and the
    re-runs (``reruns``: started, the running ones' epochs) at the pace (:func:`pace_since`) from ``first`` (the first
    reported epoch, Ray's start-up left out) to ``now``, each (time, epochs trained by then, the ended re-runs'
    included). ``study``: its num_samples, max_epochs, rungs, race and strata.

    None until a search trial has trained to the first rung (:func:`rung_reached`): from then on, since a trial to come
    counts what the rungs keep, not a guess at its full budget; not before, where the pace of the first epochs of the
    first trials alone was up to twice the study's (docs/performance.md, time left).
    """
    num_samples, max_epochs, rungs, race, strata = study
    if first is None or now[1] <= first[1] or not rung_reached([*ended, *running], rungs):
        return None
    left = study_epochs_left(ended, running, reruns, num_samples, max_epochs, rungs, race, strata)
    return left * pace_since(first, now)


def format_duration(seconds: float) -> str:
    """Seconds as "45 s", "12 min" or "2.5 h": seconds up to 3 minutes, where whole minutes would round 95 s to
    "2 min", a quarter more than the estimate itself (``python -m bench.eta``)."""
    if seconds < 180:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress(Callback):
    """One terminal line whenever a trial reports or ends: states, the best so far and, once a trial has trained to
    the first rung, the time left (``_time_left``).

    ``num_samples`` search trials on the scheduler's ``rungs`` (``EarlyStopping.rungs``; none without early stopping),
    halved apart in ``strata`` (``settings.strata``), then the race's re-runs, counted apart (never "the best").
    ``race``: its candidates, folds and budget (``--confirm-top``, the data's folds, ``--confirm-budget``); the time
    left counts the re-runs it trains if none is dropped, each round once the search has trained the epochs that pay
    for it (:func:`study_epochs_left`).
    """

    def __init__(
        self,
        metric: str,
        mode: str,
        max_epochs: int,
        num_samples: int,
        race: tuple[int, int, float] = (0, 0, 0.0),
        rungs: Sequence[int] = (),
        strata: int = 1,
    ) -> None:
        self.metric, self.mode, self.max_epochs, self.num_samples, self.race = metric, mode, max_epochs, num_samples, race
        self.rungs, self.strata = tuple(rungs), strata
        self.started = time.time()
        self.last_line = 0.0
        self.first_result: tuple[float, int] | None = None  # when the first epoch was reported, and the epochs done then

    def _time_left(self, trials, search_ended: list[int], search_running: list[int], reruns_running: list[int]) -> float | None:
        """Seconds the study still needs (:func:`study_time_left`), or None."""
        reruns_ended = [trial_epochs(t) for t in trials if confirmed_trial(t.config) is not None and t.status in ENDED]
        done = sum(search_ended) + sum(search_running) + sum(reruns_running) + sum(reruns_ended)
        study = (self.num_samples, self.max_epochs, self.rungs, self.race, self.strata)
        reruns = (len(reruns_running) + len(reruns_ended), reruns_running)
        return study_time_left(self.first_result, (time.time(), done), search_ended, search_running, reruns, study)

    def _outcome(self, trial) -> str:
        return trial_outcome(trial.last_result, error=trial.status == "ERROR", metric=self.metric, max_epochs=self.max_epochs)

    def _line(self, trials, event: str, force: bool = False) -> None:
        if not force and time.time() - self.last_line < 10:
            return
        self.last_line = time.time()
        counts = {"running": 0, COMPLETE: 0, PRUNED: 0, FAIL: 0, "pending": 0}
        best = None
        finished, running, reruns_running, reruns, reruns_done = [], [], [], 0, 0
        for t in trials:
            ended = t.status in ENDED
            if confirmed_trial(t.config) is not None:
                reruns, reruns_done = reruns + 1, reruns_done + ended
                reruns_running += [] if ended else [trial_epochs(t)]
                continue
            (finished if ended else running).append(trial_epochs(t))
            if not ended:
                counts["running" if t.status == "RUNNING" else "pending"] += 1
                continue
            state = self._outcome(t)
            counts[state] += 1
            value = (t.last_result or {}).get(self.metric)
            if state == COMPLETE and (best is None or (value > best[0] if self.mode == "max" else value < best[0])):
                best = (value, t.trial_id)
        # the best single score so far, named so: the study's pick is the race's, said at the end
        best_text = f"best single {self.metric} {best[0]:.4f} ({best[1]})" if best else "best single: none complete yet"
        elapsed = time.time() - self.started
        left = self._time_left(trials, finished, running, reruns_running)
        left_text = f", ~{format_duration(left)} left" if left is not None else ""
        rerun_text = f", race re-runs {reruns_done} done, {reruns - reruns_done} running" if reruns else ""
        print(
            f"[{elapsed:6.0f} s{left_text}] {len(trials) - reruns}/{self.num_samples} trials: {counts['running']} running, "
            f"{counts[COMPLETE]} complete, {counts[PRUNED]} pruned, {counts[FAIL]} failed{rerun_text} | {best_text} | {event}",
            flush=True,
        )

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.first_result is None:
            self.first_result = (time.time(), sum(trial_epochs(t) for t in trials))
        where = f"epoch {result.get('training_iteration')}"
        if "budget" in result:  # a ladder of budgets: the epoch within the schedule of that budget
            where = f"epoch {result.get('epoch')}/{result['budget']}"
        self._line(trials, f"{trial.trial_id} {where}: {self.metric} {result.get(self.metric, float('nan')):.4f}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        state = self._outcome(trial)
        what = {COMPLETE: "complete", PRUNED: f"pruned at rung {epochs_done(trial.last_result)}", FAIL: "failed"}[state]
        number = confirmed_trial(trial.config)
        who = trial.trial_id if number is None else f"{trial.trial_id} (re-run of Optuna #{number})"
        self._line(trials, f"{who} {what}", force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._line(trials, f"{trial.trial_id} failed", force=True)


def links_of(trial, verb: str, act, trial_dir: Path) -> None:
    """``act(trial_dir)`` on the trial's checkpoint links; never fails the study (Tune would re-raise): a filesystem
    without hard links, or a folder Tune removed meanwhile, is a warning."""
    try:
        act(trial_dir)
    except Exception as error:
        log.warning("could not %s the links of %s's checkpoints (%s)", verb, trial, error)


class KeepState(Callback):
    """Keeps a copy of the study's last readable Tune state, which a resume puts back if a full disk tore the files."""

    def __init__(self, experiment_dir: str) -> None:
        self.keeper = KeepTuneState(experiment_dir)

    def on_step_end(self, iteration, trials, **info):
        self.keeper.maybe_keep()

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        """Before Tune registers the checkpoint (and deletes the oldest it keeps): hard links of the trial's
        checkpoints (``tunestate.keep_checkpoint_links``)."""
        links_of(trial, "keep", keep_checkpoint_links, Path(checkpoint.path).parent)

    def on_trial_complete(self, iteration, trials, trial, **info):
        links_of(trial, "drop", drop_checkpoint_links, Path(trial.path))

    def on_experiment_end(self, trials, **info):
        self.keeper.maybe_keep(force=True)


class ReleaseMemory(Callback):
    """Gives the driver's freed heap back to the operating system every ``Releaser.every_s`` of Tune's loop
    (``study.launch.heap``): its memory then grows with what a study holds, not with what it has freed."""

    def __init__(self) -> None:
        self.releaser = Releaser()

    def on_step_end(self, iteration, trials, **info):
        self.releaser.maybe_release()

"""Optuna as a Ray Tune searcher, with ASHA-stopped trials told as PRUNED.

Ray's stock ``OptunaSearch`` tells Optuna that a trial ASHA stopped early is
COMPLETE, with its truncated score, which misleads TPE (a 2-epoch score looks
like a final one). This searcher reports every epoch's metric as an Optuna
intermediate value and tells each trial's end as ``study.search.trial.trial_outcome``
says: COMPLETE with its last value when it ran its full schedule, PRUNED when
ASHA stopped it, FAIL when it errored or its metric is missing or not finite.

Only Optuna's public API is used: the searcher keeps the ``optuna.Trial``
objects that ``study.ask()`` returned, keyed by Tune trial id, and reports and
tells through them. Optuna has no public way to get a ``Trial`` back for a
trial that is already RUNNING, so the searcher's saved state (``save`` /
``restore``, what Ray Tune keeps for a resumed study) carries those objects
pickled, as Ray's own ``OptunaSearch`` does; Optuna's studies and storages
pickle for this, and a journal or RDB storage reconnects when loaded.

The Optuna study lives in a persistent storage (a journal file by default,
which optuna-dashboard opens), so a resumed study continues the same sampler
history.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from study.search.journal import open_storage
from study.search.race import ahead, race, race_rules, races, rerun_candidates
from study.search.schedulers import SAMPLERS
from study.search.spaces import Space
from study.search.trial import COMPLETE, FAIL, PRUNED, epochs_reached, is_finite_number, race_config, race_table, trial_outcome

STATES = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED, FAIL: TrialState.FAIL}
ENDED = (TrialState.COMPLETE, TrialState.PRUNED)  # a trial that trained and was told: it counts among the study's


def make_sampler(space: Space, seed: int, kind: str = "tpe", stored: int = 0) -> optuna.samplers.BaseSampler:
    """Grid spaces: Optuna's GridSampler; else TPE (multivariate, grouped, constant liar) or plain random search.

    ``stored``: the trials the study already has (a resumed study). TPE and random search are seeded with ``seed +
    stored``, so that a resumed study's random draws are not the first run's again; a grid keeps ``seed``
    (GridSampler gives trial k the k-th point of its seeded shuffle, which must stay the same).
    """
    if space.is_grid:
        return optuna.samplers.GridSampler(space.grid_search_space(), seed=seed)
    seed += stored
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind != "tpe":
        raise ValueError(f"sampler {kind!r}: expected one of {', '.join(SAMPLERS)}")
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5, constant_liar=True)


class OptunaSearcher(Searcher):
    """Suggests configs from the Optuna study ``study_name`` over ``space``; see the module docstring.

    ``storage`` is an Optuna storage URL as ``open_storage`` reads it, or a storage object.
    """

    def __init__(
        self,
        space: Space,
        storage: str | optuna.storages.BaseStorage,
        study_name: str,
        *,
        metric: str,
        mode: str,
        max_epochs: int,
        seed: int = 0,
        sampler: str = "tpe",
        overrides: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        self.space, self.storage, self.study_name = space, storage, study_name
        self.max_epochs, self.seed, self.overrides = max_epochs, seed, dict(overrides or {})
        self.sampler = sampler
        self.numbers: dict[str, int] = {}  # every Tune trial id asked for -> its Optuna trial number
        self._live: dict[str, optuna.Trial] = {}  # the trials not told yet, as study.ask() returned them
        self._reported: dict[str, set[int]] = {}  # steps already stored, per live trial
        self._study: optuna.Study | None = None

    @property
    def study(self) -> optuna.Study:
        """The Optuna study, opened on first use (a searcher pickles without it), with the sampler of its seed and the
        trials it already has (``make_sampler``: a fresh study draws as its seed says, a resumed one anew)."""
        if self._study is None:
            study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage))
            study.sampler = make_sampler(self.space, self.seed, self.sampler, stored=len(study.get_trials(deepcopy=False)))
            self._study = study
        return self._study

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_study": None}

    # -- Searcher interface -------------------------------------------------------
    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.space.is_grid and len(self.numbers) >= self.space.grid_size():
            return Searcher.FINISHED
        trial = self.study.ask()
        trial.set_user_attr("tune_trial_id", trial_id)
        config = self.space.to_config(self.space.suggest(trial), self.overrides)
        trial.set_user_attr("config", config)
        self.numbers[trial_id] = trial.number
        self._live[trial_id] = trial
        self._reported[trial_id] = set()
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """The metric as the trial's intermediate value, once per step.

        The step is ``objective_step`` when the trainable trains a ladder of budgets (``budget`` in the result): the
        budget at the end of each finished schedule, nothing mid-schedule. Else ``training_iteration``, every epoch.
        """
        step = result.get("objective_step") if "budget" in result else result.get("training_iteration")
        trial, value = self._live.get(trial_id), result.get(self.metric)
        if trial is None or step is None or not is_finite_number(value) or step in self._reported[trial_id]:
            return
        trial.report(float(value), int(step))
        self._reported[trial_id].add(int(step))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self._live:
            return  # not ours, or told already
        if result:
            self.on_trial_result(trial_id, result)  # Tune hands the last result only to on_trial_complete
        trial = self._live.pop(trial_id)
        self._reported.pop(trial_id)
        state = trial_outcome(result, error=error, metric=self.metric, max_epochs=self.max_epochs)
        if result and "epochs_trained" in result:  # the schedule's epochs reached, and all it trained apart
            trial.set_user_attr("epochs", epochs_reached(result))
            trial.set_user_attr("epochs_trained", int(result["epochs_trained"]))
        value = float(result[self.metric]) if state == COMPLETE else None
        try:
            self.study.tell(trial, value, state=STATES[state], skip_if_finished=True)
        except RuntimeError as stop:
            # GridSampler asks to stop the study once every grid point is told; the trial is stored by then
            if "Study.stop" not in str(stop):
                raise

    # -- the searcher's own state, for a resumed study ---------------------------------
    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.saved_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.restore_state(pickle.load(f))

    def saved_state(self) -> dict[str, Any]:
        return {"numbers": self.numbers, "live": self._live}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Back to the saved trials; what happened since (a trial told, a step reported) is read from the storage.

        The resume's reconciliation: Tune saves this state with each snapshot of its trials, so an Optuna trial still
        RUNNING that is not among the saved live ones was asked for after the last snapshot, and no restored Tune trial
        continues it: it is told FAIL. One that ended COMPLETE or PRUNED since is counted as asked for, though no
        restored Tune trial holds it: the study asks for no other in its place (a FAIL one is replaced, as an orphan
        is). The progress line counts Tune's trials, so it then ends one short of ``num_samples``; the summary and the
        records, read from the storage, count it. (Reading Tune's snapshot instead, with ``ExperimentAnalysis``, slows the
        resume of a large study: it also reads every trial's results; docs/performance.md, measurements behind the code.)
        """
        stored = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        ended = {t.user_attrs["tune_trial_id"]: n for n, t in stored.items() if t.state in ENDED and "tune_trial_id" in t.user_attrs}
        self.numbers = {**ended, **state["numbers"]}
        self._live = {tid: trial for tid, trial in state["live"].items() if not stored[trial.number].state.is_finished()}
        self._reported = {tid: set(stored[trial.number].intermediate_values) for tid, trial in self._live.items()}
        continued = {trial.number for trial in self._live.values()}
        for number, trial in stored.items():
            if trial.state == TrialState.RUNNING and number not in continued:
                self.study.tell(number, state=TrialState.FAIL)


class RacingSearcher(OptunaSearcher):
    """``trials`` trials from Optuna, then the race of the top ``top`` complete ones over validation folds
    (study.search.race): re-runs at the full budget, each on another fold.

    Round 1 (fold 1) starts for a top trial as soon as it is settled (``rerun_candidates``: no trial still to end can
    push it out of the top ``top``), while the search's last trials run, in the same Tuner and its warm workers.
    Later rounds start once the search is over and the round before has every score: ``race`` says who is left and
    which fold they need, with the budget ``budget`` x the epochs the search trials trained. ``budget`` 0 (and a
    grid) re-runs nothing. The Tuner's ``num_samples`` is ``trials + top x (folds - 1)``; the searcher says FINISHED
    once the race is over. ``split``: the re-runs' ``val_split`` (``--race-folds``), None for the trials' own.
    """

    def __init__(
        self, space: Space, storage, study_name: str, *, trials: int, top: int, budget: float, folds: int, split: str | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(space, storage, study_name, **kwargs)
        self.trials, self.top, self.budget, self.folds, self.split = trials, top, budget, folds, split
        self.reruns: dict[str, tuple[int, int]] = {}  # Tune trial id of a re-run -> (Optuna trial, fold)
        self.scores: dict[tuple[int, int], float] = {}  # (Optuna trial, fold) -> the re-run's score (NaN: it failed)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if len(self.numbers) < self.trials:
            return super().suggest(trial_id)
        if not races(self.budget, self.folds):
            return Searcher.FINISHED
        unfinished = len(self._live)  # the search's trials still running, as Tune has told this searcher
        complete = {t.number: t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
        given = set(self.reruns.values())
        for number, fold in self.due(complete, unfinished):
            if (number, fold) not in given:
                self.reruns[trial_id] = (number, fold)
                return race_config(complete[number].user_attrs["config"], fold, number, self.split)
        running = len(given) - len(self.scores)
        return Searcher.FINISHED if unfinished == 0 and running == 0 else None  # else wait: a result may start a round

    def due(self, complete: dict[int, optuna.trial.FrozenTrial], unfinished: int) -> list[tuple[int, int]]:
        """The re-runs the race needs now: round 1 of the settled candidates while the search runs, then the race's."""
        values = {n: t.value for n, t in complete.items()}
        if unfinished:
            return [(n, 1) for n in rerun_candidates(values, self.top, self.mode, unfinished)]
        candidates = rerun_candidates(values, self.top, self.mode)
        rules = race_rules(self.mode, self.folds, self.budget, self.study.get_trials(deepcopy=False), self.max_epochs)
        state = race(race_table(values, candidates, self.scores), rules)
        if state.next_fold is None:
            return []
        return [(n, state.next_fold) for n in state.alive] + [(n, fold) for n, fold in ahead(state, rules, self.scores)]

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self.reruns:
            value = (result or {}).get(self.metric)
            self.scores[self.reruns[trial_id]] = float(value) if not error and is_finite_number(value) else math.nan
            return
        super().on_trial_complete(trial_id, result, error)

    def saved_state(self) -> dict[str, Any]:
        return {**super().saved_state(), "race": self.reruns, "race_scores": self.scores}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.reruns = state.get("race", {})  # a study saved before the race kept seed re-runs ("reruns"): not folds
        self.scores = state.get("race_scores", {})

"""Optuna as a Ray Tune searcher, with ASHA-stopped trials told as PRUNED.

Ray's stock ``OptunaSearch`` tells Optuna that a trial ASHA stopped early is
COMPLETE, with its truncated score, which misleads TPE (a 2-epoch score looks
like a final one). This searcher reports every epoch's metric as an Optuna
intermediate value and, when a trial ends before ``max_epochs`` without an
error, tells it as PRUNED; trials that ran every epoch are COMPLETE with their
last value, errored or non-finite ones FAIL.

The Optuna study lives in a persistent storage (a journal file by default,
which optuna-dashboard opens), so a resumed study continues the same sampler
history. The searcher pickles without its storage handle, as Ray Tune needs.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from study.spaces import Space

log = logging.getLogger(__name__)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """``journal:PATH`` for a journal file (safe with concurrent writers), else an RDB URL."""
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    return optuna.storages.RDBStorage(url)


SAMPLERS = ("tpe", "random")


def make_sampler(space: Space, seed: int, kind: str = "tpe") -> optuna.samplers.BaseSampler:
    """Grid spaces: Optuna's GridSampler; else TPE (multivariate, grouped, constant liar) or plain random search."""
    if space.is_grid:
        return optuna.samplers.GridSampler(space.grid_search_space(), seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind != "tpe":
        raise ValueError(f"sampler {kind!r}: expected one of {', '.join(SAMPLERS)}")
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5, constant_liar=True)


class OptunaSearcher(Searcher):
    """Suggests configs from an Optuna study over ``space``; see the module docstring."""

    def __init__(
        self,
        space: Space,
        storage_url: str,
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
        self.space, self.storage_url, self.study_name = space, storage_url, study_name
        self.max_epochs, self.seed, self.overrides = max_epochs, seed, dict(overrides or {})
        self.sampler = sampler
        self.numbers: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self._study: optuna.Study | None = None

    # -- the Optuna study, opened lazily (not pickled) ----------------------------
    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            sampler = make_sampler(self.space, self.seed, self.sampler)
            self._study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage_url), sampler=sampler)
        return self._study

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_study": None}

    def _frozen(self, trial_id: str) -> optuna.trial.FrozenTrial:
        storage = self.study._storage
        return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(self.study._study_id, self.numbers[trial_id]))

    def _trial(self, trial_id: str) -> optuna.Trial:
        return optuna.Trial(self.study, self._frozen(trial_id)._trial_id)

    # -- Searcher interface -------------------------------------------------------
    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.space.is_grid and len(self.numbers) >= self.space.grid_size():
            return Searcher.FINISHED
        trial = self.study.ask()
        trial.set_user_attr("tune_trial_id", trial_id)
        suggested = self.space.suggest(trial)
        config = self.space.to_config(suggested, self.overrides)
        trial.set_user_attr("config", config)
        self.numbers[trial_id] = trial.number
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        value = result.get(self.metric)
        step = result.get("training_iteration")
        if trial_id not in self.numbers or step is None or value is None or not math.isfinite(value):
            return
        frozen = self._frozen(trial_id)
        if not frozen.state.is_finished() and step not in frozen.intermediate_values:
            self._trial(trial_id).report(float(value), int(step))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.numbers:
            return
        if self._frozen(trial_id).state.is_finished():
            return
        if result:
            self.on_trial_result(trial_id, result)  # Tune hands the last result only to on_trial_complete
        number = self.numbers[trial_id]
        value = (result or {}).get(self.metric)
        epochs = (result or {}).get("training_iteration", 0)
        try:
            if error or value is None or not math.isfinite(value):
                self.study.tell(number, state=TrialState.FAIL)
            elif epochs < self.max_epochs:
                self.study.tell(number, state=TrialState.PRUNED)
            else:
                self.study.tell(number, float(value))
        except RuntimeError as stop:
            # GridSampler asks to stop the study once every grid point is told; the trial is stored by then
            if "Study.stop" not in str(stop):
                raise

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as f:
            json.dump({"numbers": self.numbers}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as f:
            state = json.load(f)
        self.numbers = state["numbers"]

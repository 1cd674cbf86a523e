"""Ray Tune's asynchronous successive halving, run apart for each value of one config key (study.search.schedulers).

A study's confirmation re-runs (study.search.trial) share the search's Tuner: the scheduler lets them train their
full budget, and they never enter a rung.
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from study.search.trial import confirmed_trial


class StratifiedHalving(FIFOScheduler):
    """Ray Tune's asynchronous successive halving, run separately for each value of ``config[key]``.

    Each stratum (a loss family) has its own rungs and cutoffs, so a trial is only ever stopped for being
    in the bottom of its own family. ``key=None``: one stratum, plain asynchronous successive halving.
    A confirmation re-run is in no stratum: it always continues.
    """

    def __init__(self, key: str | None, halving_args: dict[str, Any]) -> None:
        super().__init__()
        self.key, self.halving_args = key, dict(halving_args)
        self.strata: dict[str, AsyncHyperBandScheduler] = {}
        self.stratum_of: dict[str, str] = {}  # trial id -> stratum
        self.search_properties: tuple[Any, Any] = (None, None)

    def set_search_properties(self, metric, mode, **spec) -> bool:
        super().set_search_properties(metric, mode, **spec)
        self.search_properties = (metric, mode)
        return all([sub.set_search_properties(metric, mode, **spec) for sub in self.strata.values()])

    def _sub(self, trial) -> AsyncHyperBandScheduler | None:
        """The halving that judges ``trial``: its stratum's; None for a confirmation re-run (never judged)."""
        if confirmed_trial(trial.config) is not None:
            return None
        if trial.trial_id not in self.stratum_of:
            self.stratum_of[trial.trial_id] = str(trial.config.get(self.key)) if self.key else "all"
        name = self.stratum_of[trial.trial_id]
        if name not in self.strata:
            self.strata[name] = AsyncHyperBandScheduler(**self.halving_args)
            self.strata[name].set_search_properties(*self.search_properties)
        return self.strata[name]

    def on_trial_add(self, tune_controller, trial) -> None:
        if sub := self._sub(trial):
            sub.on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result) -> str:
        sub = self._sub(trial)
        return sub.on_trial_result(tune_controller, trial, result) if sub else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        if sub := self._sub(trial):
            sub.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        if sub := self._sub(trial):
            sub.on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "; ".join(f"{name}: {sub.debug_string()}" for name, sub in self.strata.items()) or "stratified halving"

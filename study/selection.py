"""Naming the best configuration beyond noise.

A study's trials are scored once, on one seed, on a few hundred validation
images: the top trials often differ by one or two images. Before the best
configuration is named, the top ``k`` complete trials are trained again at the
full budget with extra seeds (as powerful-benchmarker's reproductions do), and
the configuration with the best *mean* wins. The summary says how far the
winner leads the runner-up in standard errors of the difference of the means.

The re-runs are trials of the search's own Tuner, on its warm workers
(``study.search.ConfirmingSearcher``); what marks a config as a re-run is
``study.trial``'s. A trial is
re-run as soon as it is sure to stay in the top ``k`` (``rerun_candidates``), so the
re-runs fill the slots the search's last trials leave idle.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def top_complete(values: dict[int, float], k: int, mode: str) -> list[int]:
    """The keys of the ``k`` best finite values (max or min), best first; ties keep key order."""
    finite = [(key, v) for key, v in values.items() if v is not None and math.isfinite(v)]
    finite.sort(key=lambda kv: (-kv[1] if mode == "max" else kv[1], kv[0]))
    return [key for key, _ in finite[:k]]


def rerun_candidates(values: dict[int, float], k: int, mode: str, seeds: int, unfinished: int = 0) -> list[int]:
    """The trials re-run with ``seeds`` extra seeds and ranked by mean, best first: the top ``k`` of ``values``.

    Empty without extra seeds or with fewer than two finite values (nothing to compare). With ``unfinished`` trials
    still to end, only those sure to stay in the top ``k``: each trial still to end adds at most one value to the
    ranking and so pushes each trial down at most one place, so the current top ``k - unfinished`` stay.
    """
    if seeds < 1 or len(top_complete(values, 2, mode)) < 2:
        return []
    return top_complete(values, max(k - max(unfinished, 0), 0), mode)


@dataclass(frozen=True)
class Candidate:
    key: int  # the Optuna trial number
    scores: tuple[float, ...]  # the trial's own score, then one per extra seed

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores)

    @property
    def sem(self) -> float:
        """Standard error of the mean over seeds (nan with one score)."""
        return statistics.stdev(self.scores) / math.sqrt(len(self.scores)) if len(self.scores) > 1 else float("nan")


@dataclass(frozen=True)
class Selection:
    ranking: tuple[Candidate, ...]  # best mean first
    lead: float  # winner's mean - runner-up's mean, in the direction of the mode (nan with one candidate)
    lead_in_se: float  # lead / standard error of the difference of the two means

    @property
    def winner(self) -> Candidate:
        return self.ranking[0]

    def verdict(self) -> str:
        """How sure the pick is, in words a reader can act on."""
        if len(self.ranking) < 2 or not math.isfinite(self.lead_in_se):
            return "one candidate: no comparison"
        if self.lead_in_se >= 2:
            return f"clear: the winner leads by {self.lead_in_se:.1f} standard errors"
        if self.lead_in_se >= 1:
            return f"likely: the winner leads by {self.lead_in_se:.1f} standard errors; more seeds would settle it"
        return f"within noise: the lead is {self.lead_in_se:.1f} standard errors; the top candidates are equally good"


def select(scores: dict[int, Sequence[float]], mode: str) -> Selection:
    """Rank candidates by mean score over seeds; ``scores`` maps a trial number to its scores."""
    if not scores:
        raise ValueError("select: no candidates")
    candidates = [Candidate(key, tuple(float(s) for s in values)) for key, values in scores.items() if values]
    sign = 1.0 if mode == "max" else -1.0
    ranking = tuple(sorted(candidates, key=lambda c: (-sign * c.mean, c.key)))
    if len(ranking) < 2:
        return Selection(ranking, float("nan"), float("nan"))
    first, second = ranking[0], ranking[1]
    lead = sign * (first.mean - second.mean)
    se = math.sqrt(first.sem**2 + second.sem**2)
    lead_in_se = lead / se if se > 0 else (math.inf if lead > 0 else float("nan"))
    return Selection(ranking, lead, lead_in_se)


def selection_record(selection: Selection) -> dict[str, Any]:
    """A JSON-able record of ``selection`` (selection.json, and the Optuna study's ``selection`` user attribute)."""
    ranking = [{"trial": c.key, "scores": list(c.scores), "mean": c.mean, "sem": c.sem} for c in selection.ranking]
    return {"ranking": ranking, "lead": selection.lead, "lead_in_se": selection.lead_in_se, "verdict": selection.verdict()}


def selection_from_record(record: dict[str, Any], mode: str) -> Selection:
    """The selection a record describes, recomputed from its scores."""
    return select({int(entry["trial"]): entry["scores"] for entry in record["ranking"]}, mode)

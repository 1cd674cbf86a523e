"""Naming the best configuration beyond noise: a race over validation folds.

A study's trials are scored once, on one set of held-out validation classes (fold 0 of
``trainables.core.data.validation_split``): the top trials often differ by a few images, and the noise that
matters most for new classes is *which* classes were held out. Before the best configuration is named, the top
``k`` complete trials (``rerun_candidates``) race, as F-race does (Birattari et al., "A racing algorithm for
configuring metaheuristics", GECCO 2002; irace):

- round r re-trains every surviving candidate at the full budget on fold r (other validation classes, and seed
  + r), so after round r each has a score on folds 0..r, its own trial's score on fold 0 included;
- after each round from ``first_test`` folds on (3: as irace, which tests only once a few instances are in, so
  that no candidate is dropped on a spread estimated from two differences), the candidates are compared fold by
  fold: the leader (best mean over the shared folds) against each other by a one-sided paired t-test, the
  p-values adjusted for the several comparisons by Holm's step-down rule; a candidate whose adjusted p is below
  ``alpha`` (0.05) is dropped;
- the race stops when one candidate is left (``clear``), when the folds run out (``folds``), or when the next
  round would spend more than the confirmation budget (``budget``: ``--confirm-budget``, a share of the epochs
  the search trained). Round 1 always runs. A pick is called clear only when the test dropped every other
  candidate; otherwise the survivors are tied as far as the folds can tell, and the best mean among them is
  picked.

``race`` replays the rules on a table of scores, so the searcher that hands out the re-runs (study.search) and
the summary at the end (study.launch) apply the same rule to the same scores. The module imports neither Ray nor
Optuna nor MLflow: the rules are tested on hand-made score tables.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from study.search.trial import epochs_spent

ALPHA = 0.05  # the race's family-wise error rate per round
FIRST_TEST = 3  # folds every survivor has before the race's first test (fold 0 and two re-runs)
CLEAR, FOLDS, BUDGET = "clear", "folds", "budget"  # why a race stopped
T = TypeVar("T")


def top_complete(values: dict[int, float], k: int, mode: str) -> list[int]:
    """The keys of the ``k`` best finite values (max or min), best first; ties keep key order."""
    finite = [(key, v) for key, v in values.items() if v is not None and math.isfinite(v)]
    finite.sort(key=lambda kv: (-kv[1] if mode == "max" else kv[1], kv[0]))
    return [key for key, _ in finite[:k]]


def rerun_candidates(values: dict[int, float], k: int, mode: str, unfinished: int = 0) -> list[int]:
    """The trials that race, best first: the top ``k`` of ``values``; empty with fewer than two finite values.

    With ``unfinished`` trials still to end, only those sure to stay in the top ``k``: each trial still to end adds
    at most one value to the ranking and so pushes each trial down at most one place, so the current top
    ``k - unfinished`` stay.
    """
    if len(top_complete(values, 2, mode)) < 2:
        return []
    return top_complete(values, max(k - max(unfinished, 0), 0), mode)


# ----------------------------------------------------------------------------- the paired test
def paired_p_value(leader: Sequence[float], other: Sequence[float], mode: str) -> float:
    """One-sided p-value of the paired t-test that ``leader`` beats ``other`` on the same folds (n >= 2).

    d_i = leader_i - other_i (negated for mode min); t = mean(d) / (sd(d) / sqrt(n)), n - 1 degrees of freedom.
    With sd(d) = 0 the differences are all alike: p = 0 when the leader is ahead on every fold, else 1.
    """
    from scipy import stats

    sign = 1.0 if mode == "max" else -1.0
    diffs = [sign * (a - b) for a, b in zip(leader, other, strict=True)]
    if len(diffs) < 2:
        return 1.0
    if statistics.stdev(diffs) <= 1e-12 * max(1.0, *map(abs, diffs)):  # alike up to rounding: t is 0/0 or infinite
        return 0.0 if statistics.fmean(diffs) > 1e-12 else 1.0
    return float(stats.ttest_rel(leader, other, alternative="greater" if mode == "max" else "less").pvalue)


def holm(p_values: Mapping[int, float]) -> dict[int, float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    ordered = sorted(p_values.items(), key=lambda kv: (kv[1], kv[0]))
    adjusted, running, m = {}, 0.0, len(ordered)
    for j, (key, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - j) * p))
        adjusted[key] = running
    return adjusted


def leader_of(scores: Mapping[int, Sequence[float]], mode: str) -> int:
    """The key with the best mean score (ties: the smaller key)."""
    sign = 1.0 if mode == "max" else -1.0
    return min(scores, key=lambda k: (-sign * statistics.fmean(scores[k]), k))


def beaten(scores: Mapping[int, Sequence[float]], mode: str, alpha: float = ALPHA) -> tuple[dict[int, float], dict[int, float]]:
    """(dropped, kept): the Holm-adjusted p-value of the leader beating each other candidate, split at ``alpha``."""
    best = leader_of(scores, mode)
    adjusted = holm({k: paired_p_value(scores[best], v, mode) for k, v in scores.items() if k != best})
    dropped = {k: p for k, p in adjusted.items() if p < alpha}
    return dropped, {k: p for k, p in adjusted.items() if k not in dropped}


# ----------------------------------------------------------------------------- the race
@dataclass(frozen=True)
class RaceRules:
    mode: str  # max or min
    folds: int  # validation folds available: 0 .. folds - 1
    budget_epochs: float  # epochs the re-runs may spend (math.inf: no limit); round 1 runs whatever it is
    epochs_per_run: int  # a re-run's epochs: the full budget
    alpha: float = ALPHA
    first_test: int = FIRST_TEST

    def affords(self, runs: int) -> bool:
        """Whether ``runs`` re-runs in all stay within the budget: the rule that lets a round after the first start."""
        return runs * self.epochs_per_run <= self.budget_epochs


def race_rules(mode: str, folds: int, budget: float, search_trials: Sequence[Any], epochs_per_run: int) -> RaceRules:
    """The race's rules once the search is over: its budget is ``budget`` (``--confirm-budget``) x the epochs every
    search trial trained (``trial.epochs_spent``)."""
    return RaceRules(mode, folds, budget * epochs_spent(search_trials), epochs_per_run)


def tie_member(tied: Sequence[T], index: int) -> T:
    """What seed ``index`` of a final trains of a race's tie (``study.final --members tied``): the index-th candidate,
    cycling."""
    return tied[index % len(tied)]


def races(budget: float, folds: int) -> bool:
    """Whether a study races its top trials at all: a budget (``--confirm-budget`` > 0) and a fold beside fold 0."""
    return budget > 0 and folds >= 2


@dataclass(frozen=True)
class RaceState:
    alive: tuple[int, ...]  # the surviving candidates, in key order
    folds_done: int  # every survivor has scores on folds 0 .. folds_done - 1
    dropped: dict[int, tuple[int, float]] = field(default_factory=dict)  # key -> (folds done when dropped, adjusted p)
    p_values: dict[int, float] = field(default_factory=dict)  # the last test: survivor -> adjusted p against the leader
    next_fold: int | None = None  # the round to run (or being run) next; None when the race is over
    stopped: str = ""  # CLEAR, FOLDS or BUDGET once over


def planned_runs(top: int, folds: int, budget: float, search_epochs: float, epochs_per_run: int) -> int:
    """The re-runs a race of ``top`` candidates trains if none is dropped: round 1, then each further round while
    ``race``'s budget rule lets it start (``budget`` x ``search_epochs``) and a fold is left. What the progress line
    counts in its time left: drops only make the race shorter."""
    if not races(budget, folds) or top < 1:
        return 0
    rules, rounds = RaceRules("max", folds, budget * search_epochs, epochs_per_run), 1
    while rounds < folds - 1 and rules.affords((rounds + 1) * top):
        rounds += 1
    return rounds * top


def fold_scores(table: Mapping[int, Mapping[int, float]], keys: Sequence[int], n: int) -> dict[int, list[float]]:
    """Each key's scores on folds 0 .. n - 1."""
    return {k: [float(table[k][f]) for f in range(n)] for k in keys}


def race(table: Mapping[int, Mapping[int, float]], rules: RaceRules) -> RaceState:
    """Replay the race (module docstring) on ``table``: candidate -> {fold: score}, fold 0 the trial's own score.

    A re-run that failed has a NaN score: its candidate is dropped (p NaN) in that round. The state says who is
    left and, while the race runs, the fold every survivor needs a score on next.
    """
    alive, dropped, p_values, n, runs = sorted(table), {}, {}, 1, 0
    while True:
        if len(alive) <= 1:
            return RaceState(tuple(alive), n, dropped, p_values, None, CLEAR)
        if n >= rules.folds:
            return RaceState(tuple(alive), n, dropped, p_values, None, FOLDS)
        if n > 1 and not rules.affords(runs + len(alive)):
            return RaceState(tuple(alive), n, dropped, p_values, None, BUDGET)
        if not all(n in table[k] for k in alive):
            return RaceState(tuple(alive), n, dropped, p_values, n)
        runs, n = runs + len(alive), n + 1
        failed = [k for k in alive if not math.isfinite(table[k][n - 1])]
        dropped.update({k: (n, math.nan) for k in failed})
        alive = [k for k in alive if k not in failed]
        if len(alive) > 1 and n >= rules.first_test:
            lost, p_values = beaten(fold_scores(table, alive, n), rules.mode, rules.alpha)
            dropped.update({k: (n, p) for k, p in lost.items()})
            alive = [k for k in alive if k not in lost]


def ahead(state: RaceState, rules: RaceRules, scores: Mapping[tuple[int, int], float]) -> list[tuple[int, int]]:
    """Re-runs of the round after ``state.next_fold`` that may start before that round ends: no test can come
    between them (the round ends below ``first_test`` folds), so nobody can be dropped but by a failed re-run, and
    the budget allows the next round for every survivor. Given to the candidates whose own re-run of the current
    round has a score, they fill the slots the round's last re-runs leave idle. ``scores``: (trial, fold) -> score.
    """
    fold = state.next_fold
    if fold is None or fold + 1 >= rules.first_test or fold + 1 >= rules.folds:
        return []
    runs = (fold + 1) * len(state.alive)  # rounds 1 .. fold + 1, every survivor in each (nobody dropped before a test)
    if not rules.affords(runs):
        return []
    return [(k, fold + 1) for k in state.alive if math.isfinite(scores.get((k, fold), math.nan))]


# ----------------------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class Candidate:
    key: int  # the Optuna trial number
    scores: tuple[float, ...]  # one per fold, in fold order (fold 0: the trial's own score)
    folds: tuple[int, ...] = ()  # the fold of each score; () in a record from before the race (the scores are seeds)
    dropped_after: int | None = None  # the folds done when the race dropped it; None for a survivor
    p_value: float = math.nan  # Holm-adjusted p of the winner beating it (at its drop, or the race's last test)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores)

    @property
    def sem(self) -> float:
        """Standard error of the mean over folds (nan with one score)."""
        return statistics.stdev(self.scores) / math.sqrt(len(self.scores)) if len(self.scores) > 1 else float("nan")


@dataclass(frozen=True)
class Selection:
    ranking: tuple[Candidate, ...]  # survivors by mean (best first), then the dropped, latest drop first
    lead: float  # winner's mean - runner-up's mean over their shared folds, in the direction of the mode
    lead_in_se: float  # lead / standard error of the paired differences (old records: of the difference of the means)
    stopped: str = ""  # CLEAR, FOLDS or BUDGET; "" in a record from before the race

    @property
    def winner(self) -> Candidate:
        return self.ranking[0]

    @property
    def folds_done(self) -> int:
        return len(self.winner.scores)

    @property
    def tied(self) -> tuple[int, ...]:
        """The candidates the race could not tell from the winner, the winner first, by mean: every survivor of a race
        (the winner alone when it is clear); the winner alone in a record from before the race."""
        if not self.stopped:
            return (self.winner.key,)
        return tuple(c.key for c in self.ranking if c.dropped_after is None)

    def verdict(self) -> str:
        """How sure the pick is, in words a reader can act on; never more than the race's test says."""
        if len(self.ranking) < 2:
            return "one candidate: no comparison"
        if not self.stopped:
            return old_verdict(self.lead_in_se)
        n, others = self.folds_done, self.ranking[1:]
        if self.stopped == CLEAR:
            tested = [c.p_value for c in others if not math.isnan(c.p_value)]
            failed = len(others) - len(tested)
            test = f" (paired t-test, Holm p <= {max(tested):.3f})" if tested else ""
            return f"clear: over {n} validation folds the winner beats every other candidate{test}" + (
                f"; {failed} dropped as a re-run of theirs failed" if failed else ""
            )
        tied = [c for c in others if c.dropped_after is None]
        why = "the confirmation budget is spent" if self.stopped == BUDGET else "the validation folds ran out"
        lead = f"the winner's mean leads by {self.lead:.4f}"
        tested = [c.p_value for c in tied if math.isfinite(c.p_value)]
        if not tested:
            return (
                f"undecided: {why} after {n} folds, before the race's first test (at {FIRST_TEST} folds): {lead}, which {n} "
                f"folds cannot tell from noise; the pick has the best mean of {len(tied) + 1} candidates"
            )
        return (
            f"undecided: {why} after {n} folds, and the race cannot tell the winner from {len(tied)} other candidate(s) "
            f"(paired t-test, Holm p = {min(tested):.2f}; {lead}); the pick has the best mean"
        )


def old_verdict(lead_in_se: float) -> str:
    """The verdict of a selection recorded before the race: seed re-runs, judged by the lead in standard errors."""
    if not math.isfinite(lead_in_se):
        return "one candidate: no comparison"
    if lead_in_se >= 2:
        return f"clear: the winner leads by {lead_in_se:.1f} standard errors"
    if lead_in_se >= 1:
        return f"likely: the winner leads by {lead_in_se:.1f} standard errors; more seeds would settle it"
    return f"within noise: the lead is {lead_in_se:.1f} standard errors; the top candidates are equally good"


def standing(candidate: Candidate) -> str:
    """Where a candidate ended in the race, in words: a survivor, or dropped (after how many folds, at what p)."""
    if not candidate.folds:
        return ""
    if candidate.dropped_after is None:
        p = f" (Holm p = {candidate.p_value:.3f} against the leader)" if math.isfinite(candidate.p_value) else ""
        return f"in the race to the end{p}"
    if math.isnan(candidate.p_value):
        return f"dropped after {candidate.dropped_after} folds: a re-run failed"
    return f"dropped after {candidate.dropped_after} folds (Holm p = {candidate.p_value:.3f})"


def paired_lead(first: Candidate, second: Candidate, mode: str) -> tuple[float, float]:
    """(lead, lead in standard errors) of ``first`` over ``second`` on the folds both ran, paired fold by fold."""
    sign = 1.0 if mode == "max" else -1.0
    theirs = dict(zip(second.folds, second.scores, strict=True))
    diffs = [sign * (s - theirs[f]) for f, s in zip(first.folds, first.scores, strict=True) if f in theirs]
    lead = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return lead, (lead / se if se > 0 else (math.inf if lead > 0 else math.nan))


def race_selection(table: Mapping[int, Mapping[int, float]], rules: RaceRules) -> Selection:
    """The verdict of the race on ``table`` (see ``race``): the survivors ranked by mean, then the dropped."""
    if not table:
        raise ValueError("race_selection: no candidates")
    state = race(table, rules)

    def candidate(key: int) -> Candidate:
        after, p = state.dropped.get(key, (None, state.p_values.get(key, math.nan)))
        used = after or state.folds_done  # the folds the race judged it on
        folds = tuple(sorted(f for f, v in table[key].items() if math.isfinite(v) and f < used))
        return Candidate(key, tuple(float(table[key][f]) for f in folds), folds, after, p)

    sign = 1.0 if rules.mode == "max" else -1.0
    survivors = sorted((candidate(k) for k in state.alive), key=lambda c: (-sign * c.mean, c.key))
    gone = sorted((candidate(k) for k in state.dropped), key=lambda c: (-(c.dropped_after or 0), -sign * c.mean, c.key))
    ranking = tuple(survivors + gone)
    if len(ranking) < 2:
        return Selection(ranking, math.nan, math.nan, state.stopped)
    lead, lead_in_se = paired_lead(ranking[0], ranking[1], rules.mode)
    return Selection(ranking, lead, lead_in_se, state.stopped)


def selection_record(selection: Selection) -> dict[str, Any]:
    """A JSON-able record of ``selection`` (selection.json, and the Optuna study's ``selection`` user attribute)."""
    ranking = [
        {
            "trial": c.key, "folds": list(c.folds), "scores": list(c.scores), "mean": c.mean, "sem": c.sem,
            "dropped_after_folds": c.dropped_after, "p_value": c.p_value,
        }
        for c in selection.ranking
    ]  # fmt: skip
    return {
        "ranking": ranking, "lead": selection.lead, "lead_in_se": selection.lead_in_se, "stopped": selection.stopped,
        "folds": selection.folds_done, "verdict": selection.verdict(),
    }  # fmt: skip


def selection_from_record(record: dict[str, Any], mode: str) -> Selection:
    """The selection a record describes; a record from before the race is recomputed from its seed scores."""
    if "stopped" not in record:
        return seed_selection({int(entry["trial"]): entry["scores"] for entry in record["ranking"]}, mode)
    ranking = tuple(
        Candidate(int(e["trial"]), tuple(e["scores"]), tuple(e["folds"]), e["dropped_after_folds"], float(e["p_value"]))
        for e in record["ranking"]
    )
    return Selection(ranking, float(record["lead"]), float(record["lead_in_se"]), record["stopped"])


def seed_selection(scores: dict[int, Sequence[float]], mode: str) -> Selection:
    """A selection recorded before the race: candidates ranked by mean over seeds, the lead in standard errors of the
    difference of the two best means."""
    candidates = [Candidate(key, tuple(float(s) for s in values)) for key, values in scores.items() if values]
    sign = 1.0 if mode == "max" else -1.0
    ranking = tuple(sorted(candidates, key=lambda c: (-sign * c.mean, c.key)))
    if len(ranking) < 2:
        return Selection(ranking, float("nan"), float("nan"))
    first, second = ranking[0], ranking[1]
    lead = sign * (first.mean - second.mean)
    se = math.sqrt(first.sem**2 + second.sem**2)
    return Selection(ranking, lead, lead / se if se > 0 else (math.inf if lead > 0 else float("nan")))


RACE_FOLDS = ("trial", "alphabets")  # --race-folds

"""The progress line's time left (issue 32): no estimate until a trial has trained to the first rung, then the pace
since the first epoch and the cost of a trial on the ladder of budgets at the share ASHA keeps, worked out by hand."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from study.launch.callbacks import Progress, epochs_left, kept_share, ladder_keep, rung_keep, rung_reached, trial_epochs_left

METRIC = "val_recall_at_1"
ROOT = Path(__file__).resolve().parents[1]


def trial(trial_id: str, status: str, epochs: int, budget: int = 8, **config) -> SimpleNamespace:
    result = {"epochs_trained": epochs, "completed_budget": epochs, "budget": budget, METRIC: 0.5} if epochs else {}
    return SimpleNamespace(trial_id=trial_id, status=status, config={"lr": 0.01, **config}, last_result=result)


def line(progress: Progress, trials: list, capsys) -> str:
    progress._line(trials, "event", force=True)
    return capsys.readouterr().out


def test_a_trials_epochs_left_on_the_ladder_by_hand():
    # rungs at 4 of 16 epochs (eta 4); a trial kept at 4 trains 17 in all (the 4-epoch schedule's last epoch retrained)
    assert trial_epochs_left(0, [4], 16, full=17) == pytest.approx(4 + 13 / 4)  # a quarter go on from rung 4
    assert trial_epochs_left(2, [4], 16, full=17) == pytest.approx(2 + 13 / 4)
    assert trial_epochs_left(4, [4], 16, full=17) == pytest.approx(13 / 4)  # at its rung: not judged yet
    assert trial_epochs_left(5, [4], 16, full=17) == pytest.approx(12)  # past it: kept, trains to the end
    assert trial_epochs_left(0, [1, 4], 16, full=16) == pytest.approx(1 + 3 / 4 + 12 / 16)  # stock ASHA: no tails
    assert trial_epochs_left(0, [1, 4], 16, full=18) == pytest.approx(1 + 4 / 4 + 13 / 16)  # a tail of 1 per promotion
    assert trial_epochs_left(3, [], 8, full=8) == 5  # no rungs: every trial trains the full budget


def test_a_trial_at_a_rung_is_kept_as_asha_keeps_the_kth_on_random_scores():
    # 1 / eta + (1 - 2 / eta) / k: at eta 4, 0.25 + 0.5 / k after the first
    assert [kept_share(k, 4) for k in (1, 2, 3, 4)] == pytest.approx([1, 1 / 2, 5 / 12, 3 / 8])
    assert kept_share(3, 2) == pytest.approx(1 / 2)  # above the midpoint of two: one chance in two
    assert kept_share(10_001, 4) == pytest.approx(0.25, abs=1e-4)
    # Ray's ASHA cutoff (np.nanpercentile of the scores before, at (1 - 1 / eta) x 100; no NaN here) on random scores
    rng = np.random.default_rng(0)
    for k in (2, 3, 5):
        scores = rng.random((200_000, k))
        kept = scores[:, -1] >= np.percentile(scores[:, :-1], 75, axis=1)
        assert kept.mean() == pytest.approx(kept_share(k, 4), abs=0.005)


def test_the_share_a_rung_keeps_of_the_trials_to_come_by_hand():
    # 16 new trials at eta 4: 1 + sum over k = 2..16 of (0.25 + 0.5 / k) = 1 + 3.75 + 0.5 (H16 - 1) = 5.940 kept
    assert rung_keep(0, 16, 4) == pytest.approx(5.94037 / 16, abs=1e-5)
    assert rung_keep(2, 2, 4) == pytest.approx((5 / 12 + 3 / 8) / 2)
    assert rung_keep(5, 0, 4) == 0.25
    # halved apart for 2 losses, 8 trials each: 2 x (1 + 1.75 + 0.5 (H8 - 1)) = 7.218 kept of 16
    assert rung_keep(0, 16, 4, strata=2) == pytest.approx(2 * (2.75 + 0.5 * 1.717857) / 16, abs=1e-5)
    # rungs at 4 of 16, full 17: 3 trials past 4 and one pruned at it (4 judged); 10 to come and one at 4 (11): the
    # 5th to 15th, 0.25 + 0.5 (H15 - H4) / 11
    assert ladder_keep(10, [17, 17, 4], [4, 9], [4], 16, 17) == pytest.approx([0.25 + 0.5 * 1.234899 / 11])
    assert trial_epochs_left(0, [4], 16, full=17, keep=[0.5]) == pytest.approx(4 + 13 / 2)


def test_the_strata_are_the_values_of_the_loss_the_space_searches():
    from study.launch.settings import strata
    from study.search.spaces import load_space

    assert strata(load_space(ROOT / "search_spaces/default.yaml")) == 2  # softmax and ice, halved apart
    assert strata(load_space(ROOT / "search_spaces/ice.yaml")) == 1  # one loss


def test_a_study_halves_in_its_spaces_strata_under_the_budget_scheduler_only(runs):
    from study.launch import cli as launch
    from study.launch.settings import study_settings

    assert study_settings(launch.parse_args(["--space", "smoke"])).strata == 2
    assert study_settings(launch.parse_args(["--space", "smoke", "--scheduler", "asha"])).strata == 1  # one stratum


def test_epochs_left_by_hand():
    # rungs at 2 of 8 (eta 4), one trial past 2 (judged), three to judge (2 not started, one at 2): kept at
    # (1/2 + 5/12 + 3/8) / 3 = 31/72 each. 2 + 6 x 31/72 a new trial, 2 of them; 6 x 31/72 for the one at its rung;
    # a re-run not started (8): 4 + 18 x 31/72 + 8 = 19.75
    assert epochs_left((2, [8], [2]), (1, []), 8, [2]) == pytest.approx(19.75)
    assert epochs_left((0, [8, 2], []), (0, [3]), 8, [2]) == pytest.approx(5)  # only a re-run's 5 epochs left


def test_the_trials_to_come_cost_what_halving_keeps_not_what_the_first_to_end_cost():
    # ASHA keeps the first trials at a rung (it has nothing to compare them with): 4 ended after the whole ladder
    # (17 epochs). Each of the 10 not started is the 6th to 15th judged at rung 4, kept at 0.25 + 0.5 (H15 - H5) / 10
    # = 0.3017: it costs 4 + 13 x 0.3017 = 7.92, not the 17 the first ones did; the one running at 9 epochs (kept at
    # rung 4) trains its last 8
    assert epochs_left((10, [17] * 4, [9]), (0, []), 16, [4]) == pytest.approx(10 * (4 + 13 * 0.301745) + 8, abs=1e-3)


def test_a_time_left_once_a_trial_has_trained_to_the_first_rung():
    assert not rung_reached([1, 1], [2, 4]) and rung_reached([2, 1], [2, 4]) and rung_reached([0, 5], [4])
    assert not rung_reached([], [4]) and not rung_reached([0], []) and rung_reached([1], [])  # no rungs: an epoch


def test_no_time_left_until_a_trial_is_at_the_first_rung_then_the_pace_since_the_first_epoch(capsys):
    # rungs at 2 of 8 epochs; one candidate, one fold to race on: one re-run
    progress = Progress(METRIC, "max", max_epochs=8, num_samples=4, race=(1, 2, 0.5), rungs=(2,))
    progress.started = time.time() - 30  # 30 s into the study, the first epoch reported 10 s in (Ray's start-up before)
    progress.first_result = (time.time() - 20, 0)
    first = line(progress, [trial("a", "RUNNING", 1), trial("b", "RUNNING", 1)], capsys)
    assert re.match(r"\[\s+30 s\] 2/4 trials", first) and "left" not in first  # the first epochs' pace is not shown
    # a at its rung: 3 epochs in 20 s. None judged yet, 4 to judge (2 not started, a and b): kept at
    # (1 + 1/2 + 5/12 + 3/8) / 4 = 55/96. 2 new at 2 + 6 x 55/96, a 6 x 55/96, b 1 + 6 x 55/96, the re-run 8: 26.75
    # epochs at 20/3 s
    at_rung = [trial("a", "RUNNING", 2), trial("b", "RUNNING", 1)]
    assert re.match(r"\[\s+30 s, ~178 s left\] 2/4 trials: 2 running, 0 complete", line(progress, at_rung, capsys))
    # a ended after 8 epochs: 10 epochs in the 20 s since the first, 2 s each; 19.75 epochs left (test_epochs_left_by_hand)
    ended = [trial("a", "TERMINATED", 8), trial("b", "RUNNING", 2)]
    assert re.match(r"\[\s+30 s, ~40 s left\] 2/4 trials: 1 running, 1 complete, 0 pruned", line(progress, ended, capsys))
    # the re-run started and trained 3 epochs, b was pruned at 2, and the other two trials ended (2 epochs each):
    # 5 epochs of the re-run left, at 20 s / 17 epochs
    done = [trial("a", "TERMINATED", 8), trial("b", "TERMINATED", 2), trial("c", "TERMINATED", 2), trial("d", "TERMINATED", 2)]
    rerun = trial("r", "RUNNING", 3, confirms_trial=0)
    assert re.match(r"\[\s+30 s, ~6 s left\] 4/4 trials", line(progress, [*done, rerun], capsys))
    # a second re-run, ended after its 8 epochs, counts in the pace: 20 s / 25 epochs, 4 s for the 5 left
    ended_rerun = trial("q", "TERMINATED", 8, confirms_trial=1)
    assert re.match(r"\[\s+30 s, ~4 s left\] 4/4 trials", line(progress, [*done, ended_rerun, rerun], capsys))


def test_the_races_rounds_count_once_the_search_has_trained_their_budget(capsys):
    # the default's race at val_fraction 0.2: 3 candidates, 5 folds, 0.6 x the search's epochs; rungs at 4 of 16, 17 epochs a kept
    # trial. 6 kept and 4 pruned trials ended (118 epochs), 6 to come, the 11th to 16th judged at rung 4: kept at
    # 0.25 + 0.5 (H16 - H10) / 6 = 0.2876, 6 x (4 + 13 x 0.2876) = 46.4 more: 164.4 in all, which would pay for a second
    # round of 3 re-runs (0.6 x 164.4 >= 96). On the 118 epochs trained, 0.6 x 118 = 70.8 pays for the first round
    # only: 46.4 + 48 epochs, at 0.5 s each since the first
    progress = Progress(METRIC, "max", max_epochs=16, num_samples=16, race=(3, 5, 0.6), rungs=(4,))
    progress.first_result = (time.time() - 59, 0)
    ended = [trial(f"k{i}", "TERMINATED", 17, budget=16) for i in range(6)] + [trial(f"p{i}", "TERMINATED", 4, budget=4) for i in range(4)]
    assert "~47 s left" in line(progress, ended, capsys)


def test_durations_read_in_seconds_up_to_three_minutes_then_minutes_then_hours():
    from study.launch.callbacks import format_duration

    assert [format_duration(s) for s in (6, 95, 179)] == ["6 s", "95 s", "179 s"]  # not "2 min" for 95 s
    assert [format_duration(s) for s in (180, 750, 5399)] == ["3 min", "12 min", "90 min"]
    assert format_duration(9000) == "2.5 h"


def test_the_eta_bench_reads_the_progress_lines_back(tmp_path):
    """bench.eta: each line's estimate against the last line's elapsed time, by hand."""
    from bench.eta import estimates, seconds, table

    assert [seconds(t) for t in ("38 s", "4 min", "2.5 h")] == [38, 240, 9000]
    lines = ["study x: 4 trials", "[    10 s] 1/4 trials", "[    20 s, ~2 min left] 2/4", "[    60 s, ~95 s left] 3/4", "[   160 s] 4/4"]
    found = estimates(lines)
    assert found == [(10, None), (20, 120), (60, 95), (160, None)]
    rows, summary = table(found)
    assert rows[2:] == ["| 20 | 120 | 140 | -14% |", "| 60 | 95 | 100 | -5% |"]
    assert summary.startswith("2 of 2 estimates within 50 % of the truth (worst -14%); the first estimate at 20.0 s of 160 s")


def test_the_eta_bench_puts_each_miss_down_to_the_epochs_or_the_pace_and_replays_a_recent_pace():
    """bench.eta --runs: 10 epochs of one trial, 10 s each for 5 epochs then 30 s each (the machine got busier);
    the log's clock is MLflow's less 950 s. Every number below by hand."""
    from bench.eta import split_errors

    times = [1000, 1010, 1020, 1030, 1040, 1070, 1100, 1130, 1160, 1190]
    by_epoch = {("aaaaaaaa", k + 1): t for k, t in enumerate(times)}
    lines = [
        "[    50 s] 1/1 trials | aaaaaaaa epoch 1/10: val 0.5",
        # 5 epochs done, 10 s/epoch so far: 50 s for 5 epochs (the right count); 150 s came (30 s/epoch): a pace miss
        "[    90 s, ~50 s left] 1/1 trials | aaaaaaaa epoch 5/10: val 0.6",
        # 8 done, 130 s / 7 epochs so far; 20 s (1.08 epochs at that pace) against 60 s (2 at 30 s): neither alone
        # misses by more than 50 %; the last 60 s (epochs 7-8, 30 s each) give 32 s (-46 %), the last 120 s 22 s
        "[   180 s, ~20 s left] 1/1 trials | aaaaaaaa epoch 8/10: val 0.7",
        "[   240 s] 1/1 trials | aaaaaaaa epoch 10/10: val 0.8",
    ]
    assert split_errors(lines, times, by_epoch) == (
        "0 of 2 estimates within 50 % (lines with epochs still to train); off by more than 50 % on their own: the epochs "
        "expected 0 times, the pace so far 1 times. Replayed: 1 of 2 with the pace of the last 60 s, 0 of 2 with the pace "
        "of the last 120 s, 0 of 2 with the pace of the last 300 s"
    )


def test_the_eta_bench_replays_each_line_with_this_checkouts_count_of_the_epochs_left():
    """bench.eta --runs: each line's estimate made again from the study's records. Two trials of up to 4 epochs on
    a rung at 1 (eta 4), then a race of 1 candidate on 1 more fold (one re-run of 4 epochs); the log's clock is
    MLflow's less 950 s. Every number below by hand."""
    from bench.eta import replay, replay_time_left, state_at
    from tests.conftest import recorded_params

    trials = {
        "aaaaaaaa": ("trial", [1000, 1010, 1020, 1030]),  # kept at its rung, trained to the end
        "bbbbbbbb": ("trial", [1005]),  # pruned at the rung
        "cccccccc": ("confirmation", [1040, 1050, 1060, 1070]),
    }
    assert state_at(trials, 1005) == ([1], [1], (0, []))  # b has ended (its last epoch), a runs on
    assert state_at(trials, 1050) == ([4, 1], [], (1, [2]))
    lines = [
        "[    50 s] 1/2 trials | aaaaaaaa epoch 1/1: val 0.5",
        # a at its rung (not judged yet, the 2nd there after b: 3 x 1/2 more), the re-run to come (4): 5.5 epochs
        # against the 7 that came; at 5 s an epoch so far 27.5 s against 65 s: the epochs within 50 %, the seconds not
        "[    55 s, ~1 min left] 2/2 trials | bbbbbbbb epoch 1/1: val 0.4",
        # the search over: the re-run's 4 epochs, the right count; 7.5 s an epoch so far: 30 s against 40 s
        "[    80 s, ~30 s left] 2/2 trials | aaaaaaaa epoch 4/4: val 0.7",
        # the re-run at 2 of 4: 2 epochs, the right count; 50 s / 6 epochs: 16.7 s against 20 s
        "[   100 s, ~20 s left] 2/2 trials | cccccccc epoch 2/4: val 0.7",
        "[   120 s] 2/2 trials | cccccccc epoch 4/4: val 0.7",
    ]
    params = recorded_params(epochs=4, num_samples=2, scheduler="budget", grace_period=1, reduction_factor=4.0, confirm_top=1,
                             val_folds=2, confirm_budget=0.5)  # fmt: skip
    assert replay(lines, trials, params) == (
        "Replayed with this checkout's epochs left: 2 of 3 estimates within 50 %; the epochs expected within 50 % of those "
        "trained after the line 3 times"
    )
    # the time left itself, every line: none at 50 s (one epoch); at 55 s a is at its rung and b was pruned there, the
    # 2nd judged: a kept at 1/2, 3 x 1/2 + 4 = 5.5 epochs at 5 s, 27.5 s against 65 (-58 %); then 30 s against 40 and
    # 50 / 6 x 2 = 16.7 s against 20, as above
    assert replay_time_left(lines, trials, params) == (
        "Replayed with this checkout's time left (strata: 1): the first estimate at 55 s (-58%); 2 of 3 within 50 % (worst -58%)"
    )

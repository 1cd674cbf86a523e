"""The progress line's time left (issue 32): no estimate until a trial has ended, then the pace since the first epoch
and the cost of a trial on the ladder of budgets, worked out by hand."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from study.callbacks import Progress, epochs_left, halving_cost

METRIC = "val_recall_at_1"


def trial(trial_id: str, status: str, epochs: int, budget: int = 8, **config) -> SimpleNamespace:
    result = {"epochs_trained": epochs, "completed_budget": epochs, "budget": budget, METRIC: 0.5} if epochs else {}
    return SimpleNamespace(trial_id=trial_id, status=status, config={"lr": 0.01, **config}, last_result=result)


def line(progress: Progress, trials: list, capsys) -> str:
    progress._line(trials, "event", force=True)
    return capsys.readouterr().out


def test_halving_cost_by_hand():
    assert halving_cost([4, 16]) == 4 + 12 / 4  # a quarter of the trials go on from 4 to 16 epochs
    assert halving_cost([1, 4, 16]) == pytest.approx(1 + 3 / 4 + 12 / 16)  # eta 4: a quarter to 4, a sixteenth to 16
    assert halving_cost([8]) == 8  # no ladder: every trial trains its budget


def test_epochs_left_by_hand():
    # budgets 2, 8 (eta 4): 2 + 6 / 4 = 3.5 epochs a trial; one trial ended after 8 (promoted): (8 + 4 x 3.5) / 5 = 4.4;
    # 2 not started (8.8), one at 2 epochs (2.4 more), a re-run not started (8): 19.2
    assert epochs_left((2, [8], [2]), (1, []), 8, [2]) == pytest.approx(19.2)
    assert epochs_left((0, [8, 2], []), (0, [3]), 8, [2, 8]) == pytest.approx(5)  # only a re-run's 5 epochs left


def test_no_time_left_until_a_trial_has_ended_then_the_pace_since_the_first_epoch(capsys):
    progress = Progress(METRIC, "max", max_epochs=8, num_samples=4, race=(1, 2, 0.5))  # one candidate, one fold to race on: one re-run
    progress.started = time.time() - 30  # 30 s into the study, the first epoch reported 10 s in (Ray's start-up before)
    progress.first_result, progress.budgets = (time.time() - 20, 0), {2, 8}
    first = line(progress, [trial("a", "RUNNING", 6), trial("b", "RUNNING", 2)], capsys)
    assert re.match(r"\[\s+30 s\] 2/4 trials", first) and "left" not in first  # a guess is not shown
    # a ended after 8 epochs: 10 epochs in the 20 s since the first, 2 s each; 19.2 epochs left (test_epochs_left_by_hand)
    ended = [trial("a", "TERMINATED", 8), trial("b", "RUNNING", 2)]
    assert re.match(r"\[\s+30 s, ~38 s left\] 2/4 trials: 1 running, 1 complete, 0 pruned", line(progress, ended, capsys))
    # the re-run started and trained 3 epochs, b was pruned at 2, and the other two trials ended (2 epochs each):
    # 5 epochs of the re-run left, at 20 s / 17 epochs
    done = [trial("a", "TERMINATED", 8), trial("b", "TERMINATED", 2), trial("c", "TERMINATED", 2), trial("d", "TERMINATED", 2)]
    rerun = trial("r", "RUNNING", 3, confirms_trial=0)
    assert re.match(r"\[\s+30 s, ~6 s left\] 4/4 trials", line(progress, [*done, rerun], capsys))


def test_durations_read_in_seconds_up_to_three_minutes_then_minutes_then_hours():
    from study.callbacks import format_duration

    assert [format_duration(s) for s in (6, 95, 179)] == ["6 s", "95 s", "179 s"]  # not "2 min" for 95 s
    assert [format_duration(s) for s in (180, 750, 5399)] == ["3 min", "12 min", "90 min"]
    assert format_duration(9000) == "2.5 h"


def test_the_eta_bench_reads_the_progress_lines_back(tmp_path):
    """bench/eta.py: each line's estimate against the last line's elapsed time, by hand."""
    from bench.eta import estimates, seconds, table

    assert [seconds(t) for t in ("38 s", "4 min", "2.5 h")] == [38, 240, 9000]
    lines = ["study x: 4 trials", "[    10 s] 1/4 trials", "[    20 s, ~2 min left] 2/4", "[    60 s, ~95 s left] 3/4", "[   160 s] 4/4"]
    found = estimates(lines)
    assert found == [(10, None), (20, 120), (60, 95), (160, None)]
    rows, summary = table(found)
    assert rows[2:] == ["| 20 | 120 | 140 | -14% |", "| 60 | 95 | 100 | -5% |"]
    assert summary.startswith("2 of 2 estimates within 50 % of the truth (worst -14%); the first estimate at 20.0 s of 160 s")


def test_the_eta_bench_puts_each_miss_down_to_the_epochs_or_the_pace_and_replays_a_recent_pace():
    """bench/eta.py --runs: 10 epochs of one trial, 10 s each for 5 epochs then 30 s each (the machine got busier);
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

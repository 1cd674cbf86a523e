"""The progress line's time left (issue 32): no estimate until a trial has ended, then the pace so far."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

from study.callbacks import Progress

METRIC = "val_recall_at_1"


def trial(trial_id: str, status: str, epochs: int, budget: int = 8) -> SimpleNamespace:
    result = {"epochs_trained": epochs, "completed_budget": epochs, "budget": budget, METRIC: 0.5} if epochs else {}
    return SimpleNamespace(trial_id=trial_id, status=status, config={"lr": 0.01}, last_result=result)


def line(progress: Progress, trials: list, capsys) -> str:
    progress._line(trials, "event", force=True)
    return capsys.readouterr().out


def test_no_time_left_until_a_trial_has_ended_then_the_pace_so_far(capsys):
    progress = Progress(METRIC, "max", max_epochs=8, num_samples=4)
    progress.started = time.time() - 30  # 30 s into the study
    running = [trial("a", "RUNNING", 4), trial("b", "RUNNING", 2)]
    first = line(progress, running, capsys)
    assert re.match(r"\[\s+30 s\] 2/4 trials", first) and "left" not in first  # a guess (every trial 8 epochs) is not shown
    # trial a ended after 4 epochs (pruned): 6 epochs in 30 s; the two trials not started cost 4 each, b 2 more:
    # 10 epochs at 5 s each
    ended = [trial("a", "TERMINATED", 4), trial("b", "RUNNING", 2)]
    assert re.match(r"\[\s+30 s, ~50 s left\] 2/4 trials: 1 running, 0 complete, 1 pruned", line(progress, ended, capsys))

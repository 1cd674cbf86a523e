"""The sampler choice: study.search.searcher.make_sampler and study.launch --sampler.

A searched space gets TPE (the default) or a seeded random sampler; a grid or
variants space is always walked by Optuna's GridSampler, whatever the choice.
"""

from __future__ import annotations

import optuna
import pytest

from study.launch import cli as launch
from study.search.searcher import make_sampler
from study.search.spaces import load_space


def test_make_sampler_kinds():
    searched, grid = load_space("smoke"), load_space("paper_ablation")
    assert isinstance(make_sampler(searched, 0, "random"), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler(searched, 0, "tpe"), optuna.samplers.TPESampler)
    assert isinstance(make_sampler(searched, 0), optuna.samplers.TPESampler)
    for kind in ("tpe", "random", "bogus"):  # a grid space is walked by the grid whatever the kind
        assert isinstance(make_sampler(grid, 0, kind), optuna.samplers.GridSampler)
    with pytest.raises(ValueError, match="bogus"):
        make_sampler(searched, 0, "bogus")


def test_random_sampler_is_seeded():
    space = load_space("smoke")

    def draws(seed):
        study = optuna.create_study(direction="maximize", sampler=make_sampler(space, seed, "random"))
        out = []
        for _ in range(4):
            trial = study.ask()
            out.append(space.suggest(trial))
            study.tell(trial, 0.5)
        return out

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_launch_sampler_flag(capsys):
    assert launch.parse_args([]).sampler == "tpe"
    assert launch.parse_args(["--sampler", "random"]).sampler == "random"
    with pytest.raises(SystemExit) as exit_info:
        launch.parse_args(["--sampler", "bogus"])
    assert exit_info.value.code == 2 and "bogus" in capsys.readouterr().err

"""Values that used to be accepted without a word, or to fail mid-study: each refused in one line naming the flag, the
variable, the file or the key, before anything starts."""

from __future__ import annotations

import math

import pytest
import yaml

from study.launch.cli import parse_args
from study.search.spaces import SpaceError, parse_space
from trainables.core import cache
from trainables.core.data import DatasetError


@pytest.mark.parametrize("value", ["-1", "100000000000000000000", str(2**31)])
def test_a_sampler_seed_out_of_range_is_refused_with_the_flag(value, capsys):
    """Before: ``--seed -1`` passed the parser and Optuna's sampler raised a ValueError traceback after Ray and the
    MLflow parent run had started."""
    with pytest.raises(SystemExit) as stop:
        parse_args(["--seed", value])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and f"--seed {value}: expected an integer from 0 to {2**31 - 1}" in err


def test_the_sampler_seeds_ends_are_accepted():
    assert parse_args(["--seed", "0"]).seed == 0
    assert parse_args(["--seed", str(2**31 - 1)]).seed == 2**31 - 1


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "lots"])
def test_a_cache_budget_that_is_no_size_is_refused_with_the_variable(monkeypatch, value):
    """Before: -1, nan and inf were read as budgets (-1 turned the cache off as 0 does, nan and inf let any size in)."""
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, value)
    with pytest.raises(DatasetError, match=rf"^\$DML_CACHE_MAX_GB={value!r}: expected a number of gigabytes, finite and >= 0"):
        cache._budget()


@pytest.mark.parametrize(("value", "expected"), [("0", 0.0), ("2.5", 2.5e9), ("", math.inf)])
def test_a_cache_budget_in_gigabytes(monkeypatch, value, expected):
    monkeypatch.setenv(cache.CACHE_MAX_GB_ENV, value)
    assert cache._budget() == expected


def space_with_when(condition) -> dict:
    return {
        "fixed": {"dataset": "synthetic", "epochs": 2},
        "params": {
            "loss": {"type": "categorical", "choices": ["softmax", "ice"]},
            "alpha": {"type": "float", "low": 4, "high": 16, "when": {"loss": condition}},
        },
    }


@pytest.mark.parametrize("condition", ["softmaxx", ["softmax", "arcface"]])
def test_a_condition_on_a_value_its_key_cannot_take_is_refused(tmp_path, condition):
    """Before: ``when: {loss: softmaxx}`` was accepted, and alpha was silently never searched."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space_with_when(condition), sort_keys=False))
    expected = r"params\.alpha\.when\.loss: '(softmaxx|arcface)' is no value of loss; expected one of 'softmax', 'ice'"
    with pytest.raises(SpaceError, match=expected):
        parse_space(yaml.safe_load(path.read_text()), str(path))


def test_a_condition_on_a_number_out_of_its_keys_range_is_refused(tmp_path):
    spec = space_with_when("softmax")
    alpha = {**spec["params"]["alpha"], "when": {"loss": "softmax", "epochs": 0}}
    spec["params"] = {"loss": spec["params"]["loss"], "epochs": {"type": "int", "low": 1, "high": 4}, "alpha": alpha}
    del spec["fixed"]["epochs"]
    with pytest.raises(SpaceError, match=r"params\.alpha\.when\.epochs: 0 is not allowed"):
        parse_space(spec, str(tmp_path / "space.yaml"))


def test_conditions_on_values_the_key_takes_are_accepted_searched_or_not(tmp_path):
    assert parse_space(space_with_when(["softmax", "ice"]), str(tmp_path / "space.yaml")).params[1].when == {"loss": ("softmax", "ice")}
    narrowed = space_with_when("ice")  # a space narrowed from another: its condition on a value it no longer searches stays
    narrowed["params"]["loss"]["choices"] = ["softmax"]
    assert parse_space(narrowed, str(tmp_path / "space.yaml")).params[1].when == {"loss": ("ice",)}


TIED = "tied_configs.yaml of study s"
CONFIG = {"dataset": "synthetic", "epochs": 2}


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ("a plain string", "expected a non-empty list"),
        ([], "expected a non-empty list"),
        ([{"trial": 3}], r"\[0\]: expected a mapping with keys trial and config"),
        ([{"trial": 3, "config": "x"}], r"\[0\]\.config: expected a mapping of config keys"),
        ([{"trial": "three", "config": CONFIG}], r"\[0\]\.trial: expected a trial number"),
        ([{"trial": True, "config": CONFIG}], r"\[0\]\.trial: expected a trial number"),
        ([{"trial": 3, "config": CONFIG}, "x"], r"\[1\]: expected a mapping with keys trial and config"),
    ],
)
def test_a_hand_edited_tie_is_refused_naming_the_file_and_the_entry(entries, field):
    """Before: a plain string gave a TypeError traceback, and an empty list trained the pick alone without a word."""
    from study.final.plan import tied_entries
    from study.inputs import UsageError

    with pytest.raises(UsageError, match=rf"^{TIED}: (entries)?{field}"):
        tied_entries(entries, TIED)


def test_a_tie_as_the_study_wrote_it_is_read():
    from study.final.plan import tied_entries

    assert tied_entries([{"trial": 3, "config": CONFIG}, {"trial": 7, "config": CONFIG}], TIED) == [(3, CONFIG), (7, CONFIG)]

"""bench/final_width.py's pure helpers against hand-computed values: the configuration a pick trains again with, the
names its runs get, and the table of differences. No final trains."""

from __future__ import annotations

from types import SimpleNamespace

from bench import final_width


def run_with(params: dict) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(params=params, metrics={}))


def test_a_pick_trains_again_as_its_first_seeds_final_did_but_for_the_width():
    result = {"config": {"loss": "softmax", "epochs": 16, "seed": 7, "lr": 0.002}}
    config = final_width.pick_config(result, run_with({"epochs": "32", "seed": "0"}), 128)
    assert config == {"loss": "softmax", "epochs": 32, "seed": 0, "lr": 0.002, "backbone_width": 128}
    assert final_width.names(3, 128) == ("w128_pick3", "pick3")


def test_the_table_sets_each_pick_beside_itself_and_means_the_differences_of_those_trained():
    base = {"test_recall_at_1": 0.80, "test_map_at_r": 0.50, "test_one_shot_error_20way": 0.30}
    wide = {"test_recall_at_1": 0.83, "test_map_at_r": 0.54, "test_one_shot_error_20way": 0.27}
    wider = {"test_recall_at_1": 0.81, "test_map_at_r": 0.52, "test_one_shot_error_20way": 0.29}
    rows = [
        {"seed": 0, "pick": 4, "family": "softmax, bn", "width_64": base, "width_96": wide},
        {"seed": 1, "pick": 2, "family": "ice, l2", "width_64": base, "width_96": wider},
        {"seed": 2, "pick": 9, "family": "ice, bn", "width_64": base, "width_96": None},
    ]
    lines = final_width.table(rows, 96).splitlines()
    assert lines[2] == "| 0 | #4 (softmax, bn) | 0.8000 / 0.5000 / 0.3000 | 0.8300 / 0.5400 / 0.2700 | +0.0300, +0.0400, -0.0300 |"
    assert lines[4] == "| 2 | #9 (ice, bn) | 0.8000 / 0.5000 / 0.3000 | not trained |  |"
    # by hand: R@1 (+0.03 + 0.01) / 2, MAP@R (+0.04 + 0.02) / 2, one-shot error (-0.03 - 0.01) / 2
    assert lines[5] == "| mean of 2 | | | | +0.0200, +0.0300, -0.0200 |"

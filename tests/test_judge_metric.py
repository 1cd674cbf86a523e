"""bench/judge_metric.py's statistics on models whose scores are set by hand, checked against values worked out by hand."""

import math

import pytest

from bench.judge_metric import Model, correlations, families, pair_agreement, picks


def model(study: str, trial: str, val_r1: float, val_map: float, test_r1: float, full: bool = True) -> Model:
    scores = {"val_recall_at_1": val_r1, "val_map_at_r": val_map, "test_recall_at_1": test_r1, "test_map_at_r": test_r1 / 2}
    scores["test_one_shot_error_20way"] = 1 - test_r1
    return Model(study, trial, False, "softmax", "bn", 16, 16, full, scores, val_r1)


# study a: val R@1 orders its models against the test, val MAP@R as the test does
A = [model("a", "m0", 0.90, 0.6, 0.80), model("a", "m1", 0.95, 0.4, 0.70), model("a", "m2", 0.80, 0.5, 0.75)]


def test_pairs_are_counted_within_a_study_beyond_the_margin():
    # m0-m1 (test gap 0.10): R@1 wrong, MAP@R right, sum (1.50 against 1.35) right; m0-m2 (0.05): all three right;
    # m1-m2 (-0.05): R@1 wrong, MAP@R right, sum (1.35 against 1.30) wrong. b's model pairs with none of a's, and
    # m3 is within the margin of m0 (0.805 against 0.80), so that pair is left out.
    others = [model("b", "x", 0.1, 0.1, 0.1), model("a", "m3", 0.99, 0.9, 0.805)]
    found = pair_agreement(A + others, margin=0.01)
    # m3 pairs with m1 (gap 0.105) and m2 (0.055): every judge right
    assert found["agree"] == {"val R@1": (3, 5), "val MAP@R": (5, 5), "val R@1 + MAP@R": (4, 5)}
    assert found["only"] == {"val R@1": 0, "val MAP@R": 2}
    assert found["mcnemar_p"] == pytest.approx(0.5)  # two discordant pairs, both one way: 2 x 0.5^2


def test_spearman_against_ranks_worked_by_hand():
    rho = correlations(A)
    # test R@1 ranks 3, 1, 2; val MAP@R's the same; val R@1's 2, 3, 1: d = -1, 2, -1, rho = 1 - 6 x 6 / (3 x 8)
    assert rho["val MAP@R"]["test_recall_at_1"] == pytest.approx(1.0)
    assert rho["val R@1"]["test_recall_at_1"] == pytest.approx(-0.5)
    assert rho["val MAP@R"]["test_one_shot_error_20way"] == pytest.approx(1.0)  # the error, negated, ranks as R@1 here
    assert math.isnan(correlations(A[:2])["val R@1"]["test_recall_at_1"])  # two models rank nothing


def test_each_judge_picks_among_the_full_budget_search_trials():
    pruned = model("a", "m4", 0.99, 0.99, 0.99, full=False)  # best everywhere, but not a candidate
    row = picks([*A, pruned])["a"]
    assert row["candidates"] == 3 and row["best test R@1"] == 0.80
    assert (row["val R@1"], row["val R@1 trial"]) == (0.70, "m1")
    assert (row["val MAP@R"], row["val MAP@R trial"]) == (0.80, "m0")


def test_family_means():
    ice = Model("a", "i", False, "ice", "bn", 16, 16, True, {**A[0].scores, "test_recall_at_1": 0.60}, 0.9)
    rows = families([*A, ice])
    assert rows["softmax, bn"]["n"] == 3 and rows["softmax, bn"]["test_recall_at_1"] == pytest.approx(0.75)  # (0.80 + 0.70 + 0.75) / 3
    assert rows["ice, bn"]["n"] == 1 and rows["ice, bn"]["test_recall_at_1"] == pytest.approx(0.60)

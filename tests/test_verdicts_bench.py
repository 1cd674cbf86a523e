"""bench.verdicts's pure helpers against hand-computed values: the runs it plans, the mean and spread of the picks'
test metrics, the families that won, the reproducibility judgement and the verdict in a few words. No study runs."""

from __future__ import annotations

import math

import pytest

from bench import verdicts


def test_runs_one_per_seed_then_the_repeats_counting_the_seed_study_as_the_first():
    runs = verdicts.plan_runs([0, 1, 2], repeats=3, repeat_seed=0)
    assert [(r.name, r.seed, r.repeat) for r in runs] == [
        ("verdicts-seed0", 0, 1),
        ("verdicts-seed1", 1, 1),
        ("verdicts-seed2", 2, 1),
        ("verdicts-seed0-repeat2", 0, 2),
        ("verdicts-seed0-repeat3", 0, 3),
    ]


def test_no_repeats_and_a_repeat_seed_outside_the_seeds():
    assert [r.name for r in verdicts.plan_runs([0, 1], repeats=0, repeat_seed=0)] == ["verdicts-seed0", "verdicts-seed1"]
    assert [r.name for r in verdicts.plan_runs([0, 1], repeats=1, repeat_seed=0)] == ["verdicts-seed0", "verdicts-seed1"]
    assert [r.name for r in verdicts.plan_runs([1], repeats=2, repeat_seed=7)] == [
        "verdicts-seed1",
        "verdicts-seed7-repeat1",
        "verdicts-seed7-repeat2",
    ]


def test_spread_and_mean_by_hand():
    # the six test R@1 of issue 31: mean (0.827 + 0.830 + 0.840 + 0.847 + 0.858 + 0.862) / 6 = 5.064 / 6 = 0.844,
    # spread 0.862 - 0.827 = 0.035
    s = verdicts.spread_and_mean([0.827, 0.830, 0.840, 0.847, 0.858, 0.862])
    assert s["n"] == 6
    assert s["mean"] == pytest.approx(0.844)
    assert s["spread"] == pytest.approx(0.035)
    assert (s["min"], s["max"]) == (0.827, 0.862)


def test_spread_and_mean_leave_out_what_was_not_measured():
    s = verdicts.spread_and_mean([0.25, None, math.nan, 0.27])
    assert s["n"] == 2 and s["mean"] == pytest.approx(0.26) and s["spread"] == pytest.approx(0.02)
    assert verdicts.spread_and_mean([None]) == {"n": 0, "mean": None, "min": None, "max": None, "spread": None}


def test_family_counts_most_frequent_first():
    counts = verdicts.family_counts(["ICE", "heated softmax", "heated softmax", "softmax without heating", "heated softmax"])
    assert counts == {
        "counts": {"heated softmax": 3, "ICE": 1, "softmax without heating": 1},
        "most": ["heated softmax"],
        "wins": 3,
        "of": 5,
    }


def test_family_counts_tie_names_both_in_order_of_first_win():
    counts = verdicts.family_counts(["ICE", "heated softmax", "heated softmax", "ICE"])
    assert counts["most"] == ["ICE", "heated softmax"] and counts["wins"] == 2 and counts["of"] == 4
    assert verdicts.family_counts([]) == {"counts": {}, "most": [], "wins": 0, "of": 0}


def test_reproducibility_same_configuration_whatever_the_verdicts():
    judged = verdicts.reproducibility([("a", True), ("a", False), ("a", False)])
    assert judged == {"runs": 3, "judgement": verdicts.SAME, "distinct": 1}


def test_reproducibility_different_picks_none_clear_is_a_tie():
    judged = verdicts.reproducibility([("a", False), ("b", False), ("a", False)])
    assert judged == {"runs": 3, "judgement": verdicts.TIE, "distinct": 2}


def test_reproducibility_a_clear_pick_that_another_run_did_not_pick_is_a_contradiction():
    judged = verdicts.reproducibility([("a", False), ("b", True)])
    assert judged == {"runs": 2, "judgement": verdicts.CONTRADICTION, "distinct": 2}


def test_reproducibility_needs_two_runs():
    assert verdicts.reproducibility([("a", True)])["judgement"] is None
    assert verdicts.reproducibility([])["judgement"] is None


def record(stopped: str, verdict: str, p_values: list[float], folds: int = 3, dropped: tuple[int, ...] = ()) -> dict:
    """A selection record as study.search.race.selection_record writes it (only the keys the helpers read); ``dropped``:
    the runners-up (0: the first) that the race dropped after 1 fold."""
    ranking = [{"trial": 0, "p_value": math.nan, "dropped_after_folds": None}] + [
        {"trial": i + 1, "p_value": p, "dropped_after_folds": 1 if i in dropped else None} for i, p in enumerate(p_values)
    ]
    return {"ranking": ranking, "stopped": stopped, "verdict": verdict, "folds": folds, "lead_in_se": 1.25}


def test_short_verdict_clear_states_the_largest_p():
    clear = record("clear", "clear: over 3 validation folds the winner beats every other candidate", [0.01, 0.04])
    assert verdicts.short_verdict(clear) == "clear (3 folds, Holm p <= 0.040)"
    assert verdicts.called_clear(clear)


def test_short_verdict_undecided_states_the_smallest_p_of_the_rest():
    # the runner-up dropped at p 0.01 is out of the tie: the smallest p among the survivors is 0.30
    tied = record("budget", "undecided: the confirmation budget is spent after 2 folds, ...", [0.01, 0.30, 0.45], folds=2, dropped=(0,))
    assert verdicts.short_verdict(tied) == "undecided (budget, 2 folds, Holm p = 0.300)"
    assert not verdicts.called_clear(tied)


def test_short_verdict_without_a_race_and_from_before_it():
    assert verdicts.short_verdict(None) == "no race" and not verdicts.called_clear(None)
    old = {"ranking": [], "lead_in_se": 1.25, "verdict": "likely: the winner leads by 1.2 standard errors"}
    assert verdicts.short_verdict(old) == "likely (seed re-runs, lead 1.2 SE)"
    assert verdicts.short_verdict(record("clear", "one candidate: no comparison", [])) == "one candidate"


def test_family_and_key_params_of_each_family():
    ice = {"loss": "ice", "ice_scale": 39.41, "classes_per_batch": 16, "samples_per_class": 2, "embedding_dim": 64, "lr": 0.0024,
           "lr_schedule": "linear"}  # fmt: skip
    assert verdicts.family(ice) == "ICE"
    assert verdicts.key_params(ice) == "s 39.4, 16 x 2, 64-d, lr 2.4e-03 linear"
    heated = {"loss": "softmax", "alpha": 3.34, "heating": "two_stage", "heating_target": 2.63, "normalization": "bn",
              "weight_norm": True, "mean_proxy_weight": 0.3, "classes_per_batch": 8, "samples_per_class": 2, "embedding_dim": 128,
              "lr": 0.0018, "lr_schedule": "step"}  # fmt: skip
    assert verdicts.family(heated) == "heated softmax"
    assert verdicts.key_params(heated) == "bn, weight norm, alpha 3.34 -> 2.63 (two_stage), mean proxy 0.3, 8 x 2, 128-d, lr 1.8e-03 step"
    plain = {**heated, "heating": "none", "weight_norm": False, "mean_proxy_weight": 0.0}
    assert verdicts.family(plain) == "softmax without heating"
    assert verdicts.key_params(plain) == "bn, alpha 3.34, 8 x 2, 128-d, lr 1.8e-03 step"


def test_summarize_uses_the_first_run_of_each_seed_and_judges_the_repeats():
    def result(seed, repeat, r1, family, identity, clear):
        tests = {"recall_at_1": r1, "map_at_r": None, "one_shot_error": None}
        return {"study": f"s{seed}r{repeat}", "seed": seed, "repeat": repeat, "test": tests, "wall_time_s": 100.0 * (seed + 1),
                "family": family, "config_identity": identity, "clear": clear}  # fmt: skip

    results = [result(0, 1, 0.84, "ICE", "a", False), result(1, 1, 0.86, "heated softmax", "b", False),
               result(0, 2, 0.10, "heated softmax", "c", False)]  # fmt: skip
    summary = verdicts.summarize(results, repeat_seed=0)
    assert summary["seeds"] == [0, 1]
    assert summary["test"]["recall_at_1"]["mean"] == pytest.approx(0.85)  # the repeat's 0.10 is left out
    assert summary["test"]["recall_at_1"]["spread"] == pytest.approx(0.02)
    assert summary["wall_time_s"]["mean"] == pytest.approx(150.0)
    assert summary["ensemble_test"]["recall_at_1"]["n"] == 0  # results without the final's ensemble: not measured
    results[0]["ensemble_test"], results[1]["ensemble_test"] = {"recall_at_1": 0.85}, {"recall_at_1": 0.88}
    joint = verdicts.summarize(results, repeat_seed=0)
    assert joint["ensemble_test"]["recall_at_1"]["mean"] == pytest.approx(0.865) and joint["ensemble_test"]["map_at_r"]["n"] == 0
    final_model = "  - the final model (its seeds, or after an undecided race the race's tie, as one model): "
    assert final_model + "mean 0.8650, spread 0.0300 (min 0.8500, max 0.8800)" in verdicts.summary_lines(joint)
    assert summary["families"]["most"] == ["ICE", "heated softmax"]
    assert summary["repeats"] == {
        "seed": 0, "studies": ["s0r1", "s0r2"], "runs": 2, "judgement": verdicts.TIE, "distinct": 2,
        "same_first_proposals": [0], "same_first_outcomes": [0], "trials": [0, 0],
    }  # fmt: skip


def test_leading_same_counts_the_trials_two_runs_share_before_they_part():
    assert verdicts.leading_same(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == 2  # the same 4th does not count
    assert verdicts.leading_same(["a", "b"], ["a", "b", "c"]) == 2
    assert verdicts.leading_same(["a"], ["b"]) == 0
    assert verdicts.leading_same([], ["a"]) == 0


def test_the_repeats_say_how_many_first_trials_each_run_proposed_and_ended_as_the_first_run():
    def result(repeat, proposals, outcomes):
        return {"study": f"r{repeat}", "seed": 0, "repeat": repeat, "test": dict.fromkeys(verdicts.TESTS), "wall_time_s": None,
                "family": "ICE", "config_identity": "a", "clear": False, "proposals": proposals, "outcomes": outcomes}  # fmt: skip

    first = result(1, ["p", "q", "r"], [["COMPLETE", 0.9], ["PRUNED", 0.5], ["COMPLETE", 0.8]])
    second = result(2, ["p", "q", "s"], [["COMPLETE", 0.9], ["COMPLETE", 0.7], ["COMPLETE", 0.6]])  # q ended otherwise
    third = result(3, ["p", "q", "r"], [["COMPLETE", 0.9], ["PRUNED", 0.5], ["COMPLETE", 0.8]])
    repeats = verdicts.summarize([first, second, third], repeat_seed=0)["repeats"]
    assert repeats["same_first_proposals"] == [2, 3] and repeats["same_first_outcomes"] == [1, 3] and repeats["trials"] == [3, 3, 3]
    lines = verdicts.summary_lines({"seeds": [0], "test": {k: verdicts.spread_and_mean([]) for k in verdicts.TESTS},
                                    "wall_time_s": verdicts.spread_and_mean([]), "families": verdicts.family_counts(["ICE"]),
                                    "repeats": repeats})  # fmt: skip
    assert "  - r2 proposed the same first 2 trials as r1 (of 3), and the first 1 ended alike (state and value)" in lines
    assert "  - r3 proposed the same first 3 trials as r1 (of 3), and the first 3 ended alike (state and value)" in lines


def test_config_identity_ignores_the_keys_that_do_not_change_training():
    softmax = {"loss": "softmax", "alpha": 5.5, "heating": "none", "normalization": "bn", "lr": 0.002}
    # a softmax pick's ice_scale and, without heating, its heating_target are inactive: the same configuration
    assert verdicts.config_identity({**softmax, "ice_scale": 7.0, "heating_target": 2.0}) == verdicts.config_identity(softmax)
    assert verdicts.config_identity({**softmax, "alpha": 5.6}) != verdicts.config_identity(softmax)

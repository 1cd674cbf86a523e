"""bench/candidate_ensemble.py on hand-made bench records: which trial and seed each member trains, each candidate's
config rebuilt from the study's fixed keys and its own proposal, the runs the two ways share, and the table's
paired differences against values computed by hand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import candidate_ensemble as bench

FIXED = {"dataset": "omniglot", "epochs": 16, "val_fraction": 0.3}
PROPOSALS = [
    {"loss": "ice", "ice_scale": 32.0, "lr": 0.001},  # trial 0
    {"loss": "softmax", "alpha": 6.0, "normalization": "bn", "lr": 0.002},  # trial 1, the pick
    {"loss": "softmax", "alpha": 3.0, "normalization": "l2", "lr": 0.003},  # trial 2, dropped by the race
]


def result(seed: int = 0) -> dict:
    ranking = [{"trial": 1, "dropped_after_folds": None}, {"trial": 0, "dropped_after_folds": None}, {"trial": 2, "dropped_after_folds": 3}]
    return {
        "seed": seed,
        "picked_trial": 1,
        "config": {**FIXED, **PROPOSALS[1]},
        "proposals": [json.dumps(p, sort_keys=True) for p in PROPOSALS],
        "selection": {"ranking": ranking},
    }


def test_members_are_the_kept_candidates_cycling_with_seed_k_or_the_pick_with_seeds_0_to_k():
    assert bench.survivors(result()) == [1, 0]  # trial 2 was dropped
    tie = bench.members(result(), 3, candidates=True)
    assert [(trial, config["seed"]) for trial, config in tie] == [(1, 0), (0, 1), (1, 2)]
    assert tie[1][1] == {**FIXED, **PROPOSALS[0], "seed": 1}  # the ICE trial: the fixed keys, its own, none of the pick's
    assert "alpha" not in tie[1][1] and "normalization" not in tie[1][1]
    seeds = bench.members(result(), 3, candidates=False)
    assert [(trial, config["seed"]) for trial, config in seeds] == [(1, 0), (1, 1), (1, 2)]


def test_a_trial_and_seed_both_ways_train_once():
    args = argparse.Namespace(epochs=None, stage="val", work=Path("/w"), members=3)
    both = {path for way in (True, False) for *_, path in bench.plan(args, result(4), way)}
    assert both == {Path(f"/w/val_study4_trial{t}_seed{s}.npz") for t, s in [(1, 0), (1, 1), (1, 2), (0, 1)]}
    assert {epochs for _, _, epochs, _ in bench.plan(args, result(4), True)} == {32}  # 2 x the trials' 16


def test_the_table_gives_each_study_and_the_paired_mean_difference():
    def row(seed, a, b):
        seeds = {"ensemble": {"recall_at_1": a}, "members": [1, 1, 1]}
        ways = {"seeds": seeds, "candidates": {"ensemble": {"recall_at_1": b}, "members": [1, 0, 1]}}
        return {"sampler_seed": seed, "pick": 1, **ways, "difference": {"recall_at_1": b - a}}

    lines = bench.table([row(0, 0.90, 0.92), row(1, 0.94, 0.95)]).splitlines()
    assert lines[2] == "| 0 | #1, #0, #1 | 0.9000 / 0.9200 (+0.0200) |"
    # differences 0.02 and 0.01: mean 0.015, sd 0.0070711, t = 0.015 / (0.0070711 / sqrt 2) = 3.0; spreads 0.04 and 0.03
    assert lines[-1] == (
        "recall_at_1: mean 0.9200 (pick's seeds) against 0.9350 (candidates), difference +0.0150 (paired t 3.00, 1 df); "
        "spread over studies 0.0400 against 0.0300"
    )

"""bench/seed_ensemble.py against hand-computed values and a direct loop: the ensemble's embeddings, the comparison
with the seeds' mean, the table, and its validation stage end to end on the synthetic dataset (two 1-epoch seeds)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from bench import seed_ensemble


def test_the_ensemble_sets_unit_rows_side_by_side_so_a_pairs_cosine_is_the_seeds_mean():
    a = np.array([[2.0, 0.0], [0.0, 1.0]])
    b = np.array([[3.0, 4.0], [0.0, 2.0]])
    joint = seed_ensemble.ensemble([a, b])
    np.testing.assert_allclose(joint, np.array([[1.0, 0.0, 0.6, 0.8], [0.0, 1.0, 0.0, 1.0]]) / np.sqrt(2), atol=1e-7)
    assert float(joint[0] @ joint[1]) == pytest.approx(0.4)  # (0 + 0.8) / 2


def test_compare_and_table_give_the_gain_over_the_seeds_mean():
    row = seed_ensemble.compare([{"recall_at_1": 0.90, "map_at_r": 0.70}, {"recall_at_1": 0.92, "map_at_r": 0.74}],
                                {"recall_at_1": 0.93, "map_at_r": 0.77})  # fmt: skip
    assert row["mean"] == pytest.approx({"recall_at_1": 0.91, "map_at_r": 0.72})
    assert row["gain"] == pytest.approx({"recall_at_1": 0.02, "map_at_r": 0.05})
    lines = seed_ensemble.table([{"sampler_seed": 3, "pick": 12, **row}]).splitlines()
    assert lines[2] == "| 3 | #12 | 0.9100 / 0.9300 (+0.0200) | 0.7200 / 0.7700 (+0.0500) |"
    assert lines[3] == "| mean of 1 | | 0.9100 / 0.9300 (+0.0200) | 0.7200 / 0.7700 (+0.0500) |"


def test_the_validation_stage_scores_each_seed_and_their_ensemble_on_the_validation_classes(tmp_path):
    config = {"dataset": "synthetic", "epochs": 1, "classes_per_batch": 8, "samples_per_class": 2, "embedding_dim": 8, "loss": "softmax"}
    verdicts = tmp_path / "verdicts.json"
    verdicts.write_text(json.dumps({"results": [{"seed": 5, "picked_trial": 7, "config": config}]}))
    args = argparse.Namespace(seeds=[0, 1], epochs=1, work=tmp_path / "work", parallel=1)
    (row,) = seed_ensemble.run_val(args, json.loads(verdicts.read_text())["results"])
    files = [np.load(tmp_path / "work" / f"pick5_seed{seed}.npz") for seed in (0, 1)]
    labels = files[0]["labels"]
    assert len(np.unique(labels)) < 40  # the validation classes of the synthetic dataset's 40, not all of them
    similarity = np.zeros((len(labels), len(labels)))
    for f in files:  # R@1 of the mean cosine similarity, by a direct loop
        e = f["embeddings"] / np.linalg.norm(f["embeddings"], axis=1, keepdims=True)
        similarity += e @ e.T
    np.fill_diagonal(similarity, -np.inf)
    assert row["ensemble"]["recall_at_1"] == pytest.approx(np.mean(labels[similarity.argmax(axis=1)] == labels))
    assert (row["sampler_seed"], row["pick"], len(row["per_seed"])) == (5, 7, 2)
    again = seed_ensemble.run_val(args, [{"seed": 5, "picked_trial": 7, "config": config}])  # resumes: nothing trains
    assert again[0]["ensemble"] == row["ensemble"] and again[0]["seconds"] == row["seconds"]

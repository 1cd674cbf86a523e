"""bench.gpu_study: its space is one the project accepts, and it reads the study's and final's summaries as they
print them."""

from __future__ import annotations

from bench.gpu_study import SEED_TIME, SUMMARY, TEST, UTILIZATION, parse, space_yaml
from study.records.utilization import Utilization
from study.search.spaces import parse_space

# the end of a study's and of study.final's output, as a GPU run printed them (docs/bench/gpu_study.json's run 1)
STUDY_END = """
study gpu-k4 finished in 104 s: 8 trials, 4 complete, 4 pruned early, 0 failed, 40 epochs trained
utilization 0.66: 272 s training and evaluating in 11 trials / (104 s wall x 4 slots); Ray start-up 5.8 s apart
"""
FINAL_END = """
gpu-k4: test metrics over 3 seed(s) (mean +- std)
  test_recall_at_1         0.9999 +- 0.0001
  test_recall_at_2         1.0000 +- 0.0000
  test_map_at_r            0.9608 +- 0.0078
  test_one_shot_error_20way 0.0087 +- 0.0017
  time per seed            30 s
"""


def test_the_space_parses_with_both_families_and_batches_in_thirds_of_max_classes():
    args = parse(["--root", "r", "--work", "w", "--max-classes", "60", "--epochs", "6"])
    space = parse_space(space_yaml(args), "gpu_study.yaml")
    names = {p.name for p in space.params}
    assert {"loss", "alpha", "heating_target", "ice_scale", "classes_per_batch", "samples_per_class", "lr"} <= names
    batch = next(p for p in space.params if p.name == "classes_per_batch")
    assert (batch.low, batch.high, batch.step) == (20, 60, 20)
    assert space.fixed["epochs"] == 6 and space.fixed["dataset"] == "cub200" and space.fixed["precision"] == "bf16"


def test_the_summaries_are_read_as_printed():
    summary = SUMMARY.search(STUDY_END)
    assert (summary["wall"], summary["trials"], summary["epochs"]) == ("104", "8", "40")
    util = UTILIZATION.search(STUDY_END)
    assert (util["util"], util["slots"], util["startup"]) == ("0.66", "4", "5.8")
    assert {m["name"]: m["value"] for m in TEST.finditer(FINAL_END)} == {"recall_at_1": "0.9999", "map_at_r": "0.9608"}
    assert SEED_TIME.search(FINAL_END)["s"] == "30"


def test_the_utilization_line_the_study_prints_today_still_parses():
    line = Utilization(in_trial_s=272.4, wall_s=104.2, slots=4, startup_s=5.8, trials=11).describe()
    util = UTILIZATION.search(line)
    assert util is not None and (util["slots"], util["startup"]) == ("4", "5.8")

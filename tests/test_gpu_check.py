"""tools.gpu_check: the preset's study it runs is the preset but for the check's changes, its table is read as
documented (docs/performance.md, "The GPU check"), and with ``--cpu`` it runs end to end on any machine (slow: a
study through Ray per packing; it belongs in the fault tier)."""

from __future__ import annotations

import json

import pytest
import yaml

from study.search.spaces import SHIPPED, parse_space
from tools import gpu_check


@pytest.mark.parametrize("preset, fit, expected", [("cub200", 7, (4, 6, 2)), ("sop", 1019, (50, 90, 10)), ("sop", 16, (8, 16, None))])
def test_the_checks_space_is_the_preset_with_its_changes(preset, fit, expected):
    args = gpu_check.parse(["--preset", preset, "--root", "r", "--work", "w", "--epochs", "2"])
    data = gpu_check.check_space(args, fit)
    space = parse_space(data, f"{preset}-check.yaml")  # valid as a whole
    c = data["params"]["classes_per_batch"]
    assert (c["low"], c["high"], c.get("step")) == expected and c["high"] <= fit
    preset_data = yaml.safe_load((SHIPPED / f"{preset}.yaml").read_text())
    changed = {"epochs": 2, "pretrained": "none"}
    assert space.fixed == {**preset_data["fixed"], **changed}  # the preset's backbone, precision and crop, on the GPU
    assert {k: v for k, v in data["params"].items() if k != "classes_per_batch"} == {
        k: v for k, v in preset_data["params"].items() if k != "classes_per_batch"
    }
    on_cpu = gpu_check.check_space(gpu_check.parse(["--preset", preset, "--root", "r", "--work", "w", "--cpu"]), fit)
    assert (on_cpu["fixed"]["backbone"], on_cpu["fixed"]["image_size"]) == ("small_cnn", 32)


def test_the_table_has_a_row_per_packing_and_dashes_for_what_was_not_measured():
    report = {
        "title": "tools.gpu_check of cub200 on NVIDIA A10G",
        "studies": [
            {"packed": 1, "cpus_per_trial": 4, "trials": 8, "epochs": 20, "wall": 300, "per_trial": 1234.5, "all_trials": 1234.5,
             "util_mean": 61.2, "mem_max_mib": 6200.0},
            {"packed": 2, "cpus_per_trial": 2, "per_trial": None, "all_trials": None, "util_mean": None, "mem_max_mib": None},
        ],
    }  # fmt: skip
    lines = gpu_check.markdown(report).splitlines()
    assert lines[2].startswith("| trials per GPU | CPUs each | trials | epochs trained | study s | images/s per trial |")
    assert lines[4] == "| 1 | 4 | 8 | 20 | 300 | 1,234 | 1,234 | 61 % | 6,200 |"
    assert lines[5] == "| 2 | 2 | - | - | - | - | - | - | - |"


@pytest.mark.faults
@pytest.mark.slow
def test_the_check_runs_on_the_cpu_without_the_gpu_parts(tmp_path, capsys):
    out = tmp_path / "check.json"
    argv = ["--preset", "sop", "--root", str(tmp_path / "data"), "--work", str(tmp_path / "work"), "--cpu", "--scale", "0.0016",
            "--size-scale", "0.1", "--pack", "1", "2", "--trials", "2", "--epochs", "1", "--cpus", "1", "--out", str(out)]  # fmt: skip
    assert gpu_check.main(argv) == 0
    printed = capsys.readouterr().out
    assert "bound held: every study exits 0" in printed and "on the CPU (--cpu: small_cnn at 32 px)" in printed
    report = json.loads(out.read_text())
    assert [r["packed"] for r in report["studies"]] == [1, 2]
    for row in report["studies"]:
        assert row["exit"] == 0 and row["trials"] == 2 and len(row["trial_rates"]) == 2 and row["per_trial"] > 0
        assert row["util_mean"] is None and row["mem_max_mib"] is None  # no GPU part ran
        assert row["all_trials"] == pytest.approx(row["packed"] * row["per_trial"])
    assert report["fit"]["classes"] == 16 and report["space"]["fixed"]["precision"] == "bf16"

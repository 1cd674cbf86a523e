"""The suite's own order: the longest test files first (tests/conftest.py), from a measured run's seconds by tier."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, longest_files_first

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.test_a" name="test_two" time="2.0"/>
<testcase classname="tests.test_b.TestGroup" name="test_three" time="30.25"/>
<testcase classname="tests.test_b.TestGroup" name="test_five" time="9.5">
<properties><property name="tier" value="faults"/></properties></testcase>
<testcase classname="tests.test_c" name="test_four" time="0.2"/>
<testcase classname="" name="tests.test_e" time="0.000"><skipped message="module skipped whole"/></testcase>
<testcase classname="tests.test_d" name="test_six" time="40"><properties><property name="tier" value="faults"/></properties></testcase>
</testsuite></testsuites>
"""


class Item:
    def __init__(self, nodeid: str, faults: bool = False) -> None:
        self.nodeid = nodeid
        self.path = Path(nodeid.split("::")[0])
        self.faults = faults

    def get_closest_marker(self, name: str):
        return name == "faults" and self.faults or None


def test_file_seconds_sums_each_files_tests_by_tier_longest_first(tmp_path):
    from tools.suite_time import file_seconds

    (tmp_path / "run.xml").write_text(JUNIT)
    got = file_seconds(tmp_path / "run.xml")
    # 1.5 + 2.0 rounded; under a second left out; a test without the property is of the default tier
    assert got == {"default": {"tests/test_b.py": 30, "tests/test_a.py": 4}, "faults": {"tests/test_d.py": 40, "tests/test_b.py": 10}}
    assert list(got["default"]) == ["tests/test_b.py", "tests/test_a.py"]


def test_the_longest_files_first_each_files_tests_together_and_in_order():
    seconds = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    long, short = sorted(seconds["default"], key=seconds["default"].get)[-1], sorted(seconds["default"], key=seconds["default"].get)[0]
    ids = ["tests/test_unknown.py::test_x", f"{short}::test_1", f"{long}::test_1", f"{short}::test_2", f"{long}::test_2[a]"]
    ids += ["tests/test_unknown.py::test_y"]
    items = [Item(i) for i in ids]
    longest_files_first(items)
    assert [i.nodeid for i in items] == [
        f"{long}::test_1", f"{long}::test_2[a]", f"{short}::test_1", f"{short}::test_2",
        "tests/test_unknown.py::test_x", "tests/test_unknown.py::test_y",
    ]  # fmt: skip


def test_a_file_counts_the_seconds_of_the_tiers_of_its_tests_that_run():
    seconds = {"default": {"tests/test_m.py": 5, "tests/test_d.py": 20}, "faults": {"tests/test_m.py": 100}}
    default_tier = [Item("tests/test_m.py::test_1"), Item("tests/test_d.py::test_2")]
    longest_files_first(default_tier, seconds)
    assert [i.nodeid for i in default_tier] == ["tests/test_d.py::test_2", "tests/test_m.py::test_1"]  # 20 before 5
    both = [Item("tests/test_m.py::test_1"), Item("tests/test_m.py::test_3", faults=True), Item("tests/test_d.py::test_2")]
    longest_files_first(both, seconds)
    assert [i.nodeid for i in both] == ["tests/test_m.py::test_1", "tests/test_m.py::test_3", "tests/test_d.py::test_2"]  # 105 first

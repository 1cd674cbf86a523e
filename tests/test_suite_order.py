"""The suite's own order: the longest test files first (tests/conftest.py), from a measured run's seconds."""

from __future__ import annotations

import json

from tests.conftest import ROOT, pytest_collection_modifyitems

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.test_a" name="test_two" time="2.0"/>
<testcase classname="tests.test_b.TestGroup" name="test_three" time="30.25"/>
<testcase classname="tests.test_c" name="test_four" time="0.2"/>
</testsuite></testsuites>
"""


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_file_seconds_sums_each_files_tests_longest_first(tmp_path):
    from tools.suite_time import file_seconds

    (tmp_path / "run.xml").write_text(JUNIT)
    got = file_seconds(tmp_path / "run.xml")
    assert got == {"tests/test_b.py": 30, "tests/test_a.py": 4}  # 1.5 + 2.0 rounded; under a second left out
    assert list(got) == ["tests/test_b.py", "tests/test_a.py"]


def test_the_longest_files_come_first_each_files_tests_together_and_in_order():
    seconds = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    long, short = sorted(seconds, key=seconds.get)[-1], sorted(seconds, key=seconds.get)[0]
    ids = ["tests/test_unknown.py::test_x", f"{short}::test_1", f"{long}::test_1", f"{short}::test_2", f"{long}::test_2[a]"]
    ids += ["tests/test_unknown.py::test_y"]
    items = [Item(i) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        f"{long}::test_1", f"{long}::test_2[a]", f"{short}::test_1", f"{short}::test_2",
        "tests/test_unknown.py::test_x", "tests/test_unknown.py::test_y",
    ]  # fmt: skip

"""The suite's two tiers (tests/conftest.py): every test file in one of them, the fault tests marked where a file holds both."""

from __future__ import annotations

import ast
from collections import Counter

from tests.conftest import ROOT, TIERS

MARK = "pytest.mark.faults"


def marked_tests(source: str) -> list[str]:
    """The tests of a file's source that carry @pytest.mark.faults, and "pytestmark" when the module's marks hold it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            if any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == MARK for d in node.decorator_list):
                found.append(node.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            if MARK in ast.unparse(node.value):
                found.append("pytestmark")
    return found


def test_every_test_file_is_in_one_tier_and_the_table_names_only_files_that_exist():
    named = Counter(name for files in TIERS.values() for name in files)
    assert set(TIERS) == {"default", "faults", "mixed"}
    assert [name for name, count in named.items() if count > 1] == []  # each file once
    files = {path.name for path in (ROOT / "tests").glob("test_*.py")}
    assert sorted(files - set(named)) == []  # a new file: add it to tests/conftest.py's TIERS
    assert sorted(set(named) - files) == []  # a file that is gone


def test_a_mixed_file_marks_its_fault_tests_and_no_other_file_marks_any():
    for tier, files in TIERS.items():
        for name in files:
            source = (ROOT / "tests" / name).read_text()
            marked = marked_tests(source)
            if tier == "mixed":
                tests = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
                assert marked and len(marked) < len(tests), name  # both tiers in it
            else:
                assert marked == [], name  # "default": none; "faults": the whole file, by its tier


def test_the_mark_is_found_above_or_below_other_decorators():
    source = "import pytest\n@pytest.mark.faults\n@pytest.mark.slow\ndef test_a(): pass\n@pytest.mark.slow\n@pytest.mark.faults\n"
    source += "def test_b(): pass\n@pytest.mark.slow\ndef test_c(): pass\n"
    assert marked_tests(source) == ["test_a", "test_b"]
    assert marked_tests("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.faults]\n") == ["pytestmark"]

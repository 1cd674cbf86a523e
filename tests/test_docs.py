"""The README and docs/ stay a user's reference (issue 57, item 5).

- The README names no commit hash, date, load average, host CPU or test count: those date, and git keeps them.
- Every Markdown page under docs/ and every benchmark in bench/ is reachable from the README by links (the README, the
  pages it links, the pages they link, ...), and every relative link there resolves, anchors included.
- Every ``python -m study.X --flag`` the README names is a flag of that command: its ``--help`` lists it.

The benchmarks are read from bench/ when the test runs: a module of bench/ that runs as a script (``__main__``) and
whose name does not start with ``_``. Nothing here starts Ray or MLflow; the ``--help`` of each command runs in a
subprocess, all of them at once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GENERATED = DOCS / "bench"  # the benchmarks' own tables, written by their scripts

QUICK_START = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && DML_DATA_ROOT=../shared/data .venv/bin/python -m study.launch',
    ".venv/bin/python -m pytest",
)
README_MAX_LINES = 250
DOCS_MAX_LINES = 2500  # the Markdown written by hand under docs/ (the benchmarks' generated tables apart)


# ----------------------------------------------------------------------------- what dates a text
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b\d\d:\d\d(?::\d\d)? ?UTC\b")
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:tests|passed|failed|skipped)\b", re.IGNORECASE)  # not "106 test characters"
LOAD = re.compile(r"\bload average\b|\buptime\b", re.IGNORECASE)
HOST_CPU = re.compile(r"\b(?:EPYC|Xeon|Ryzen|Core i[3579])\b")


def commit_hashes(text: str) -> list[str]:
    """Runs of 7 to 40 lowercase hex digits with both a digit and a letter: what git prints for a commit."""
    return [m for m in COMMIT.findall(text) if re.search(r"\d", m) and re.search(r"[a-f]", m)]


def dating(text: str) -> dict[str, list[str]]:
    """What in ``text`` dates it, by kind (empty lists when nothing does)."""
    return {
        "commit hash": commit_hashes(text),
        "date or time": DATE.findall(text),
        "test count": TEST_COUNT.findall(text),
        "load average": LOAD.findall(text),
        "host CPU": HOST_CPU.findall(text),
    }


@pytest.mark.parametrize(
    "text, kind",
    [
        ("measured at 2e4621b on the idle machine", "commit hash"),
        ("a fresh clone of 93b692e7a1c5d04f", "commit hash"),
        ("on 2026-11-28 the study", "date or time"),
        ("from 04:14 to 04:30 UTC", "date or time"),
        ("the suite's 1,256 tests", "test count"),
        ("848 passed in 351 s", "test count"),
        ("at a load average of 10 to 23", "load average"),
        ("2 cores of an AMD EPYC", "host CPU"),
    ],
)
def test_what_dates_a_text_is_found(text, kind):
    assert dating(text)[kind], f"{text!r} should be found as a {kind}"


@pytest.mark.parametrize(
    "text", ["3 seeds of 32 epochs", "models:/NAME-embedding/1", "deadbeef", "1e-3 and 5e-4", "the 10 to 21 minutes", "106 test characters"]
)
def test_what_does_not_date_a_text_is_left_alone(text):
    assert not any(dating(text).values()), dating(text)


def test_the_readme_names_nothing_that_dates():
    found = {kind: hits for kind, hits in dating(README.read_text()).items() if hits}
    assert not found, f"README.md: {found}; a figure belongs in a table beside its command and the kind of machine"


def test_the_readme_keeps_its_two_quick_start_commands_and_its_size():
    text = README.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert any(block.strip().splitlines() == list(QUICK_START) for block in blocks), (
        "README's quick start: exactly two commands (.ci/run runs them)"
    )
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: the rest belongs in docs/"


# ----------------------------------------------------------------------------- links
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def link_targets(text: str) -> list[str]:
    """The targets of the Markdown links and images of ``text``, outside fenced code."""
    return LINK.findall(FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", FENCE.sub("", page.read_text()), re.M)}


def walk(start: Path, root: Path = ROOT) -> tuple[set[Path], list[str]]:
    """Every file linked from ``start`` or from a Markdown page under ``root`` reachable from it, and the links that do
    not resolve."""
    seen: set[Path] = set()
    broken: list[str] = []
    pages, reached = [start], {start}
    while pages:
        page = pages.pop()
        for target in link_targets(page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target == "#":
                continue  # a URL (http:, mailto:, ...), or an empty anchor
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: ({target})"
            if not resolved.exists():
                broken.append(f"{where} names no file")
                continue
            if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} names no heading of {resolved.relative_to(root)}")
            seen.add(resolved)
            if resolved.suffix == ".md" and root in resolved.parents and resolved not in reached:
                reached.add(resolved)
                pages.append(resolved)
    return seen | reached, broken


def benchmarks() -> list[Path]:
    """The benchmarks in bench/ as the checkout holds them now: the modules that run as a script."""
    return sorted(
        path
        for path in (ROOT / "bench").glob("*.py")
        if not path.name.startswith("_") and re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M)
    )


def test_links_and_anchors_are_read_as_github_reads_them(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n[b](b.md#its-section-code) ![p](img.png) [web](https://x.org) [gone](c.md)\n")
    (tmp_path / "b.md").write_text("# B\n\n## Its section: `code`\n\n```\n[in code](d.md)\n```\n[back](a.md#nowhere)\n")
    (tmp_path / "img.png").write_bytes(b"")
    seen, broken = walk(tmp_path / "a.md", root=tmp_path)
    assert seen == {tmp_path / name for name in ("a.md", "b.md", "img.png")}
    assert broken == ["a.md: (c.md) names no file", "b.md: (a.md#nowhere) names no heading of a.md"]
    assert slug("Its section: `code`") == "its-section-code"
    assert slug("The papers' tables") == "the-papers-tables"


def test_every_doc_page_and_benchmark_is_reachable_from_the_readme_and_every_link_resolves():
    seen, broken = walk(README)
    assert not broken, "\n".join(broken)
    pages = sorted(DOCS.rglob("*.md"))
    assert pages and benchmarks(), "docs/ and bench/ are where this test looks"
    unreached = [str(p.relative_to(ROOT)) for p in [*pages, *benchmarks()] if p not in seen]
    assert not unreached, f"not linked from the README or a page it reaches: {unreached}"


def test_the_hand_written_docs_stay_within_their_size():
    lines = sum(len(p.read_text().splitlines()) for p in DOCS.rglob("*.md") if GENERATED not in p.parents)
    assert lines <= DOCS_MAX_LINES, f"docs/ holds {lines} lines of Markdown written by hand; at most {DOCS_MAX_LINES}"


# ----------------------------------------------------------------------------- commands and flags
def named_flags(text: str) -> dict[str, set[str]]:
    """The flags given to each ``python -m study.X`` in ``text``: those after it, up to the end of its command (a
    backtick, a quote, a shell separator, a comment or the line's end)."""
    named: dict[str, set[str]] = {}
    for match in re.finditer(r"python -m (study\.[a-z_]+)\b", text):
        command = re.split(r"[`'\"|;\n]|&&| #", text[match.end() :], maxsplit=1)[0]
        named.setdefault(match.group(1), set()).update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command))
    return named


def options(help_text: str) -> set[str]:
    """The option strings argparse's ``--help`` lists: on each line that starts with a dash, before its description."""
    listed: set[str] = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):
            listed.update(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", re.split(r"\s{2,}", stripped, maxsplit=1)[0]))
    return listed


def helps(commands: Iterable[str]) -> dict[str, subprocess.CompletedProcess]:
    """``python -m COMMAND --help`` of each command, all at once, from the checkout."""
    running = {
        command: subprocess.Popen(
            [sys.executable, "-m", command, "--help"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    }
    done = {}
    for command, process in running.items():
        out, err = process.communicate(timeout=300)
        done[command] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


def test_flags_are_read_from_commands_as_written():
    text = "run `python -m study.final --study NAME --seeds 3`: then 'cd x && python -m study.launch --address auto' # --not-this\n"
    text += "python -m study.report --study NAME  # --out is a comment here\n.venv/bin/python -m study.sync\n"
    assert named_flags(text) == {
        "study.final": {"--study", "--seeds"},
        "study.launch": {"--address"},
        "study.report": {"--study"},
        "study.sync": set(),
    }
    help_text = "usage: x [-h] [--seeds SEEDS]\n\noptions:\n  -h, --help  show this\n  --reuse-actors, --no-reuse-actors\n"
    help_text += "                 run a new trial in the worker (not --seeds)\n  --seeds SEEDS  train this many seeds\n"
    assert options(help_text) == {"-h", "--help", "--reuse-actors", "--no-reuse-actors", "--seeds"}


def test_every_flag_the_readme_names_is_listed_by_its_commands_help():
    named = named_flags(README.read_text())
    assert {"study.launch", "study.final", "study.report"} <= set(named), f"the README's commands: {sorted(named)}"
    missing = []
    for command, result in helps(named).items():
        assert result.returncode == 0, f"python -m {command} --help exited {result.returncode}: {result.stderr[-2000:]}"
        listed = options(result.stdout)
        assert "--help" in listed, f"python -m {command} --help printed no options: {result.stdout[:500]}"
        missing += [f"python -m {command} {flag}" for flag in sorted(named[command] - listed)]
    assert not missing, f"the README names flags their commands do not have: {missing}"

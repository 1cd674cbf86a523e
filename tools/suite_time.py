"""The test suite's wall time: in one process (-n 0) against three files at a time (the default, pytest-xdist).

Runs ``python -m pytest`` once per variant per round, the variants interleaved, and reads each run's
outcome line. Results go to docs/bench/suite_time.{jsonl,md}; the load averages before and after each
run say what else ran on the machine.

  python -m tools.suite_time                    # the default tier, in one process and three files at a time
  python -m tools.suite_time --all --rounds 2   # both tiers
  python -m tools.suite_time --file-seconds run.xml   # tests/file_seconds.json from `pytest --all --junitxml run.xml`

tests/file_seconds.json is each test file's seconds in one run of both tiers, by tier: tests/conftest.py starts the
longest files first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"one process (-n 0)": ["-n", "0"], "three files at a time (default)": []}
OUTCOME = re.compile(r"(?P<line>(?:\d+ \w+, )*\d+ passed[^=\n]*?) in (?P<seconds>[\d.]+)s")


def run_suite(flags: list[str]) -> dict:
    load_before = os.getloadavg()[0]
    started = time.time()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags], cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - started
    found = OUTCOME.search(out.stdout)
    return {
        "returncode": out.returncode,
        "outcome": found["line"] if found else out.stdout[-500:],
        "pytest_s": float(found["seconds"]) if found else None,
        "wall_s": wall,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| round | variant | outcome | pytest s | wall s | load before / after |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['round']} | {r['variant']} | {r['outcome']} | {r['pytest_s']} | {r['wall_s']:.0f} | "
            f"{r['load_before']:.1f} / {r['load_after']:.1f} |"
        )
    base = [r["pytest_s"] for r in rows if r["variant"] == next(iter(VARIANTS)) and r["pytest_s"]]
    new = [r["pytest_s"] for r in rows if r["variant"] != next(iter(VARIANTS)) and r["pytest_s"]]
    if base and new:
        lines += ["", f"Mean ratio (the default / one process): {sum(new) / len(new) / (sum(base) / len(base)):.2f}"]
    return "\n".join(lines) + "\n"


def file_seconds(junit: Path) -> dict[str, dict[str, int]]:
    """Each test file's seconds (setup, call and teardown of its tests) in a ``pytest --junitxml`` report, by tier
    (a test's "tier" property, which tests/conftest.py sets for the fault tier; "default" without one), longest first."""
    seconds: dict[str, Counter[str]] = {"default": Counter(), "faults": Counter()}
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname", "").split(".")  # tests.test_x[.Class]
        if len(module) < 2:  # a module skipped whole (its name in "name"): none of its tests ran
            continue
        tier = next((p.get("value") for p in case.iter("property") if p.get("name") == "tier"), "default")
        seconds[tier][f"{module[0]}/{module[1]}.py"] += float(case.get("time", 0))
    return {tier: {name: round(s) for name, s in found.most_common() if s >= 1} for tier, found in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.suite_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both variants (default 1)")
    parser.add_argument("--all", action="store_true", help="time both tiers (pytest --all); without it, the default tier")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench"), help="folder for suite_time.{jsonl,md}")
    parser.add_argument("--file-seconds", metavar="JUNIT", help="write tests/file_seconds.json from this report, and run nothing")
    args = parser.parse_args(argv)
    if args.file_seconds:
        (ROOT / "tests" / "file_seconds.json").write_text(json.dumps(file_seconds(Path(args.file_seconds)), indent=1) + "\n")
        return 0
    rows = []
    for round_ in range(1, args.rounds + 1):
        for variant, flags in VARIANTS.items():
            rows.append({"round": round_, "variant": variant, **run_suite([*flags, *(["--all"] if args.all else [])])})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite_time.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "suite_time.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""python bench/eta.py OUTPUT: how far the progress lines' "~N left" was from the time the study really took.

OUTPUT is what ``python -m study.launch`` printed (its stdout, saved with ``| tee``). Each progress line reads
``[  ELAPSED s, ~LEFT left] ...``; the truth for a line is the last progress line's elapsed seconds minus its own
(the end of the study's training: the end-of-study summary after it is not counted by the estimate). The table
gives, per line with an estimate, the estimate, the truth and the error as a share of the truth; the summary,
how many lines are within 50 % (issue 32's bound) and the worst.

  python -m study.launch | tee /tmp/study.out && python bench/eta.py /tmp/study.out
  python bench/eta.py /tmp/study.out --markdown docs/bench/eta.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

LINE = re.compile(r"^\[\s*(\d+) s(?:, ~([^\]]+) left)?\]")
UNITS = {"s": 1, "min": 60, "h": 3600}


def seconds(text: str) -> float:
    """``callbacks.format_duration``'s text back to seconds: "38 s", "4 min", "2.5 h"."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|min|s)\b", text)
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(value) * UNITS[unit] for value, unit in parts)


def estimates(lines: list[str]) -> list[tuple[float, float | None]]:
    """(elapsed s, estimated s left or None) of each progress line, in order."""
    found = []
    for line in lines:
        match = LINE.match(line.strip())
        if match:
            found.append((float(match[1]), seconds(match[2]) if match[2] else None))
    return found


def table(found: list[tuple[float, float | None]]) -> tuple[list[str], str]:
    end = found[-1][0]
    rows, errors = ["| elapsed s | estimate s | truth s | error |", "| ---: | ---: | ---: | ---: |"], []
    for elapsed, left in found:
        truth = end - elapsed
        if left is None or truth <= 0:
            continue
        errors.append((left - truth) / truth)
        rows.append(f"| {elapsed:.0f} | {left:.0f} | {truth:.0f} | {errors[-1]:+.0%} |")
    within = sum(abs(e) <= 0.5 for e in errors)
    worst = max(errors, key=abs, default=0.0)
    first = next((elapsed for elapsed, left in found if left is not None), None)
    summary = (
        f"{within} of {len(errors)} estimates within 50 % of the truth (worst {worst:+.0%}); "
        f"the first estimate at {first} s of {end:.0f} s; {sum(left is None for _, left in found)} lines without one"
    )
    return rows, summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the study's saved stdout")
    parser.add_argument("--markdown", type=Path, help="write the table and summary here")
    args = parser.parse_args(argv)
    found = estimates(args.output.read_text(errors="replace").replace("\r", "\n").splitlines())
    if not found:
        raise SystemExit(f"{args.output}: no progress lines ('[  N s, ~T left] ...') in it")
    rows, summary = table(found)
    text = "\n".join(rows) + f"\n\n{summary}\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()

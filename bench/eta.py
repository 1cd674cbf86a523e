"""python bench/eta.py OUTPUT: how far the progress lines' "~N left" was from the time the study really took.

OUTPUT is what ``python -m study.launch`` printed (its stdout, saved with ``| tee``). Each progress line reads
``[  ELAPSED s, ~LEFT left] ...``; the truth for a line is the last progress line's elapsed seconds minus its own
(the end of the study's training: the end-of-study summary after it is not counted by the estimate). The table
gives, per line with an estimate, the estimate, the truth and the error as a share of the truth; the summary,
how many lines are within 50 % (issue 32's bound) and the worst.

With ``--runs``, the study's MLflow store (``DML_RUNS_DIR``, its ``mlflow.db``) gives every epoch's time, and each
estimate is split in two: the epochs it expected against the epochs the study really trained after it, and the pace
so far (seconds per epoch, the whole study's slots together) against the pace that followed. A miss is put down to
the factor that alone would miss by more than 50 %. It also replays the estimate with the pace of the last W
seconds instead of the pace since the first epoch (the estimate x recent pace / pace so far), for a few W.

  python -m study.launch | tee /tmp/study.out && python bench/eta.py /tmp/study.out
  python bench/eta.py /tmp/study.out --markdown docs/bench/eta.md
  python bench/eta.py runs/launch.log --runs runs --study NAME
"""

from __future__ import annotations

import argparse
import bisect
import re
import statistics
from pathlib import Path

LINE = re.compile(r"^\[\s*(\d+) s(?:, ~([^\]]+) left)?\]")
EVENT = re.compile(r"\| (\w{8}) epoch (\d+)/")  # the event of a progress line: Tune's trial id and the epoch
WINDOWS_S = (60, 120, 300)
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


def epoch_times(runs: Path, study: str) -> tuple[list[float], dict[tuple[str, int], float]]:
    """The times (s) of every epoch the study's trials and re-runs trained, sorted, and by (Tune trial id, epoch)."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(experiments, filter_string=f"tags.study_name = '{study}'", max_results=5000)
    times, by_epoch = [], {}
    for run in found:
        if run.data.tags.get("kind") not in ("trial", "confirmation"):
            continue
        for m in client.get_metric_history(run.info.run_id, "train_loss"):
            times.append(m.timestamp / 1000)
            by_epoch[(run.data.tags.get("trial_id"), m.step)] = m.timestamp / 1000
    return sorted(times), by_epoch


def split_errors(lines: list[str], times: list[float], by_epoch: dict[tuple[str, int], float]) -> str:
    """Each estimate's error put down to its epochs or its pace, and the estimate replayed with a recent pace."""
    progress = [line for line in lines if LINE.match(line.strip())]
    found = [(elapsed, left, EVENT.search(line)) for line, (elapsed, left) in zip(progress, estimates(progress))]
    offsets = [by_epoch[(e[1], int(e[2]))] - elapsed for elapsed, _, e in found if e and (e[1], int(e[2])) in by_epoch]
    if not offsets:
        raise SystemExit("no progress line names an epoch recorded in MLflow: --runs and --study name another study")
    offset, end, total = statistics.median(offsets), found[-1][0], len(times)  # the log's clock to MLflow's

    def done(elapsed: float) -> int:  # epochs trained by then
        return bisect.bisect_right(times, elapsed + offset)

    first = times[0] - offset
    counts = {"lines": 0, "within": 0, "epochs": 0, "pace": 0, **{w: 0 for w in WINDOWS_S}}
    for elapsed, left, _ in found:
        truth, trained = end - elapsed, done(elapsed)
        if left is None or truth <= 0 or trained <= done(first) or trained >= total:
            continue
        pace = (elapsed - first) / (trained - done(first))  # what the estimate used: seconds per epoch so far
        counts["lines"] += 1
        counts["within"] += abs(left / truth - 1) <= 0.5
        counts["epochs"] += abs(left / pace / (total - trained) - 1) > 0.5  # the epochs expected against those trained
        counts["pace"] += abs(pace / (truth / (total - trained)) - 1) > 0.5  # the pace so far against the one that followed
        for w in WINDOWS_S:
            since = max(first, elapsed - w)
            recent = (elapsed - since) / (trained - done(since)) if trained > done(since) else pace
            counts[w] += abs(left * recent / pace / truth - 1) <= 0.5
    n = counts["lines"]
    windows = ", ".join(f"{counts[w]} of {n} with the pace of the last {w} s" for w in WINDOWS_S)
    return (
        f"{counts['within']} of {n} estimates within 50 % (lines with epochs still to train); off by more than 50 % on "
        f"their own: the epochs expected {counts['epochs']} times, the pace so far {counts['pace']} times. "
        f"Replayed: {windows}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the study's saved stdout")
    parser.add_argument("--markdown", type=Path, help="write the table and summary here")
    parser.add_argument("--runs", type=Path, help="the study's runs folder (DML_RUNS_DIR): split each error into epochs and pace")
    parser.add_argument("--study", help="the study's name (with --runs)")
    args = parser.parse_args(argv)
    if (args.runs is None) != (args.study is None):
        parser.error("--runs and --study go together")
    lines = args.output.read_text(errors="replace").replace("\r", "\n").splitlines()
    found = estimates(lines)
    if not found:
        raise SystemExit(f"{args.output}: no progress lines ('[  N s, ~T left] ...') in it")
    rows, summary = table(found)
    text = "\n".join(rows) + f"\n\n{summary}\n"
    if args.runs:
        text += "\n" + split_errors(lines, *epoch_times(args.runs, args.study)) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()

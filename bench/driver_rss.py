"""python bench/driver_rss.py: the study driver's resident memory with and without giving its freed heap back.

Two rehearsals of the same study start at once, side by side on the same machine (so under the same load), each
with its own runs folder: one as ``python -m study.launch`` runs it (``study.heap`` hands the malloc arenas' free
pages back every 10 s of Tune's loop), one with that release turned off in its process. Each driver's VmRSS is read
from /proc every 2 s, and its progress lines give the trials ended by then.

Reported per arm: the RSS when a tenth of the trials had ended and when 95 % had (the search: the last trials'
progress lines come with the end of the study), the growth per ended trial between the two, the peak (the end of
the study, which reads Tune's results and draws the plots) and the study's wall time. Rows go to
``docs/bench/driver_rss.jsonl``; ``--table-only`` prints the table of its rows again.

  python bench/driver_rss.py --trials 2000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the driver, with study.heap's release turned off (the "off" arm) or as shipped ("on")
DRIVER = """
import runpy, sys
if sys.argv[1] == "off":
    import study.heap
    study.heap._malloc_trim = lambda: None
sys.argv = ["study.launch", *sys.argv[2:]]
runpy.run_module("study.launch", run_name="__main__")
"""
PROGRESS = re.compile(r"(\d+) complete, (\d+) pruned, (\d+) failed")


@dataclass
class Arm:
    release: str  # "on" or "off"
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, RSS MB, trials ended)
    ended: int = 0
    wall_s: float = 0.0
    returncode: int | None = None


def rss_mb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) // 1024
    except (OSError, StopIteration):
        return None


def run_arm(arm: Arm, argv: list[str], runs: Path, start: float) -> None:
    env = {**os.environ, "DML_RUNS_DIR": str(runs), "PYTHONUNBUFFERED": "1"}  # its progress lines as they come
    env.pop("MLFLOW_TRACKING_URI", None)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, arm.release, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )

    def read_progress() -> None:
        for line in driver.stdout:
            if match := PROGRESS.search(line):
                arm.ended = sum(int(g) for g in match.groups())

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    while driver.poll() is None:
        if (rss := rss_mb(driver.pid)) is not None:
            arm.samples.append((round(time.time() - start, 1), rss, arm.ended))
        time.sleep(2)
    reader.join()
    arm.returncode, arm.wall_s = driver.returncode, round(time.time() - start, 1)


def summary(release: str, samples: list, trials: int) -> dict:
    """RSS at a tenth and at 95 % of the trials ended, the growth per trial between them, the peak."""
    tenth = next(s for s in samples if s[2] >= trials // 10)
    late = next(s for s in samples if s[2] >= trials * 95 // 100)
    return {
        "release": release,
        "rss_tenth_mb": tenth[1],
        "rss_95_percent_mb": late[1],
        "growth_kb_per_trial": round((late[1] - tenth[1]) * 1024 / max(1, late[2] - tenth[2]), 1),
        "peak_mb": max(s[1] for s in samples),
    }


def print_table(rows: list[dict]) -> None:
    print("| commit | trials | release | RSS at 10 % of trials MB | at 95 % MB | growth KB per trial | peak MB | wall s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for row in rows:
        cells = (row["commit"], row["trials"], row["release"], row["rss_tenth_mb"], row["rss_95_percent_mb"])
        cells += (row["growth_kb_per_trial"], row["peak_mb"], row["wall_s"])
        print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--epoch-seconds", type=float, default=0.05)
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "driver_rss.jsonl"))
    parser.add_argument("--table-only", action="store_true", help="print the table of --out's rows, run nothing")
    args = parser.parse_args()
    if args.table_only:
        with open(args.out) as lines:
            rows = [json.loads(line) for line in lines]
        print_table([{**row, **summary(row["release"], row["samples"], row["trials"])} for row in rows])
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    study = ["--rehearse", str(args.epoch_seconds), "--ray-cpus", str(args.slots), "--max-concurrent", str(args.slots)]
    study += ["--num-samples", str(args.trials), "--epochs", "16", "--space", "smoke", "--confirm-budget", "0"]
    arms = [Arm("on"), Arm("off")]
    load_before = os.getloadavg()
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        threads = [
            threading.Thread(target=run_arm, args=(arm, [*study, "--study-name", f"rss-{arm.release}"], Path(tmp) / arm.release, start))
            for arm in arms
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    rows = []
    for arm in arms:  # the code is the one checked out when the drivers started
        row = {**summary(arm.release, arm.samples, args.trials), "wall_s": arm.wall_s, "returncode": arm.returncode}
        row.update(trials=args.trials, slots=args.slots, commit=commit, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)))
        rows.append({**row, "load_before": load_before, "load_after": os.getloadavg()})
    with open(args.out, "a") as out:
        for arm, row in zip(arms, rows, strict=True):
            out.write(json.dumps({**row, "samples": arm.samples}) + "\n")
    print_table(rows)
    return 0 if all(row["returncode"] == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

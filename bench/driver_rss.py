"""python bench/driver_rss.py: the study driver's resident memory with and without giving its freed heap back.

Two rehearsals of the same study start at once, side by side on the same machine (so under the same load), each
with its own runs folder: one as ``python -m study.launch`` runs it (``study.heap`` hands the malloc arenas' free
pages back every 10 s of Tune's loop), one with that release turned off in its process. Each driver's VmRSS is read
from /proc every 2 s, and its progress lines give the trials ended by then.

Reported per arm: the RSS when a tenth of the trials had ended, when the last trial ended, the growth per ended
trial between the two, the peak (the end of the study included) and the study's wall time. Rows go to
``docs/bench/driver_rss.jsonl``.

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


def summary(arm: Arm, trials: int) -> dict:
    """RSS at a tenth of the trials ended and at the last, the growth per trial between them, the peak."""
    tenth = next(s for s in arm.samples if s[2] >= trials // 10)
    last = next((s for s in arm.samples if s[2] >= trials), arm.samples[-1])
    per_trial_kb = (last[1] - tenth[1]) * 1024 / max(1, last[2] - tenth[2])
    return {
        "release": arm.release,
        "rss_tenth_mb": tenth[1],
        "rss_last_trial_mb": last[1],
        "growth_kb_per_trial": round(per_trial_kb, 1),
        "peak_mb": max(s[1] for s in arm.samples),
        "wall_s": arm.wall_s,
        "returncode": arm.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--epoch-seconds", type=float, default=0.05)
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "driver_rss.jsonl"))
    args = parser.parse_args()
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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rows = [{**summary(arm, args.trials), "trials": args.trials, "slots": args.slots, "commit": commit} for arm in arms]
    with open(args.out, "a") as out:
        for arm, row in zip(arms, rows, strict=True):
            row.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)), load_before=load_before, load_after=os.getloadavg())
            out.write(json.dumps({**row, "samples": arm.samples}) + "\n")
    print("| release | RSS at 1/10 of trials MB | at the last trial MB | growth KB per trial | peak MB | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['release']} | {row['rss_tenth_mb']} | {row['rss_last_trial_mb']} | {row['growth_kb_per_trial']} | "
            f"{row['peak_mb']} | {row['wall_s']} |"
        )
    return 0 if all(row["returncode"] == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

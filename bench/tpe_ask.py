"""What one Optuna ask costs the study's driver as the study grows: the searcher's TPE over 100 to 5,000 finished trials.

The driver asks Optuna for each new trial (``OptunaSearcher.suggest``: ``study.ask``, the space's suggestions, two
user attributes). This bench does exactly that, with the study's own sampler (``search.make_sampler``: TPE,
multivariate, grouped, constant liar) over a shipped space, on a journal file as a study keeps it, and tells each
trial as successive halving would end it: every trial reports the rung budget (``--rung``) and a share
(``--complete``) goes on to complete at the full budget, the others are pruned there. Values are drawn at random
(seeded): the sampler's cost depends on how many trials it reads, not on what they say.

Reported: the CPU-milliseconds (``time.process_time``, this process only, so other work on the machine stretches
it little) of the ask and its suggestions, the mean over the ``--window`` asks before each mark, and the tell's.

  python bench/tpe_ask.py                                      # marks 100 500 1000 2000 5000, the smoke space
  python bench/tpe_ask.py --marks 100 1000 --space default

Results are appended to docs/bench/tpe_ask.jsonl with the commit, the date and the load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ask_costs(space_path: str, marks: list[int], window: int, rung: int, epochs: int, complete: float, seed: int) -> list[dict]:
    """Fill a journal study trial by trial up to the last mark; at each mark the mean CPU-ms of the last ``window``
    asks and tells."""
    import optuna

    from study.search.journal import open_storage
    from study.search.searcher import make_sampler
    from study.search.spaces import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    space = load_space(space_path)
    rng = random.Random(seed)
    rows, asks, tells = [], [], []
    with tempfile.TemporaryDirectory(prefix="tpe_ask_") as tmp:
        storage = open_storage(f"journal:{Path(tmp) / 'journal.log'}")
        study = optuna.create_study(study_name="tpe-ask", storage=storage, direction="maximize", sampler=make_sampler(space, seed))
        for n in range(1, max(marks) + 1):
            started = time.process_time()
            trial = study.ask()
            trial.set_user_attr("tune_trial_id", f"t{n}")
            trial.set_user_attr("config", space.to_config(space.suggest(trial)))
            asks.append(time.process_time() - started)
            started = time.process_time()
            trial.report(rng.random(), rung)
            if rng.random() < complete:
                trial.report(rng.random(), epochs)
                study.tell(trial, rng.random())
            else:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            tells.append(time.process_time() - started)
            if n in marks:
                row = {"trials": n, "ask_cpu_ms": 1000 * sum(asks[-window:]) / len(asks[-window:])}
                row["tell_cpu_ms"] = 1000 * sum(tells[-window:]) / len(tells[-window:])
                row["all_asks_cpu_s"] = sum(asks)
                rows.append(row)
                line = f"{n:6d} trials: ask {row['ask_cpu_ms']:7.1f} CPU-ms, tell {row['tell_cpu_ms']:5.1f}"
                print(f"{line}, all asks so far {sum(asks):7.1f} CPU-s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python bench/tpe_ask.py",
        description=doc[0],
        epilog="\n\n".join(doc[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--marks", type=int, nargs="+", default=[100, 500, 1000, 2000, 5000], help="study sizes to report at")
    parser.add_argument("--window", type=int, default=50, help="asks averaged before each mark (default 50)")
    parser.add_argument("--space", default=str(ROOT / "search_spaces" / "smoke.yaml"), help="a space file (default the smoke space)")
    parser.add_argument("--rung", type=int, default=4, help="the budget every trial reports (default 4, the smoke study's first rung)")
    parser.add_argument("--epochs", type=int, default=16, help="the full budget a completed trial reports (default 16)")
    parser.add_argument("--complete", type=float, default=0.35, help="share of trials that complete (default 0.35); the rest are pruned")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "tpe_ask.jsonl"), help="the .jsonl to append to")
    args = parser.parse_args(argv)
    if args.window < 1 or min(args.marks) < args.window:
        parser.error(f"--window: expected from 1 to the smallest of --marks ({min(args.marks)}), got {args.window}")
    load = os.getloadavg()
    rows = ask_costs(args.space, sorted(set(args.marks)), args.window, args.rung, args.epochs, args.complete, args.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    record = {
        "rows": rows,
        "space": os.path.relpath(args.space, ROOT),
        "window": args.window,
        "rung": args.rung,
        "epochs": args.epochs,
        "complete": args.complete,
    }
    record.update(commit=commit, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    record.update(loadavg_before=load, loadavg_after=os.getloadavg(), bench_command="python bench/tpe_ask.py " + shlex.join(argv))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A study of thousands of trials, its driver SIGKILLed mid-study and resumed: what the resume costs, what it keeps.

Workload: one rehearsal (``python -m study.launch --rehearse EPOCH_S --ray-cpus SLOTS --max-concurrent SLOTS
--num-samples TRIALS --epochs 16 --space SPACE``, ``DML_RUNS_DIR`` a folder of its own) runs until its progress line
counts KILL_AT finished trials. The driver and the local Ray it started (its process group) are then SIGKILLed, as a
lost head node or an out-of-memory kill leaves a study, and ``python -m study.launch --study-name NAME --resume``
continues it to its end. Both drivers are sampled every 0.5 s (bench.study_scale's sampler). One JSON line per kill:
what each driver cost (wall, CPU-seconds, peak RSS; the resume's seconds to its header, its first progress line and
its end) and the records once it has ended (Optuna trials by state, MLflow runs by status, the spool's lines left).

With ``--repeat``, a soak: small studies killed and resumed again and again, each kill landing at another moment
(inside an MLflow transaction, an append to Optuna's journal, an ask...). Run it beside a busy loop per core.

Question: does a study killed at any moment resume to its end with its records whole, and what does that cost at
thousands of trials?

Bound: every kill resumes with its records whole: the resume exits 0, one MLflow run per Optuna trial, none twice,
none RUNNING, the parent run FINISHED, the spool empty.

  python -m bench.resume_scale --trials 5000 --kill-at 4000 --slots 32 --epoch-seconds 0.05 --keep /tmp/resume_scale
  python -m bench.resume_scale --trials 20 --kill-at 6 --slots 8 --repeat 10 --out /tmp/soak.jsonl      # the soak

Rows are appended to docs/bench/resume_scale.jsonl with the commit, the date, the load average and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import ROOT
from bench.study_scale import Sampler, errors_in

PROGRESS = re.compile(r"^\[.*?\] \d+/\d+ trials: (\d+) running, (\d+) complete, (\d+) pruned, (\d+) failed")


def finished_in(line: str) -> int | None:
    """Complete + pruned trials a progress line counts, None for another line."""
    match = PROGRESS.match(line)
    return int(match.group(2)) + int(match.group(3)) if match else None


class Driver:
    """``python -m study.launch ARGV`` in a session of its own, sampled, its output timestamped into ``log``; ``reached``
    is set once a progress line counts ``kill_at`` finished trials (or the output ends)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, spool: Path, kill_at: int | None = None) -> None:
        self.started = time.time()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "study.launch", *argv], cwd=ROOT, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.sampler = Sampler(self.process.pid, spool)
        self.sampler.start()
        self.lines: list[tuple[float, str]] = []
        self.finished = 0
        self.reached = threading.Event()
        self.kill_at = kill_at
        self.reader = threading.Thread(target=self._read, args=(log,), daemon=True)
        self.reader.start()

    def _read(self, log: Path) -> None:
        with log.open("w") as out:
            for line in self.process.stdout:
                now = time.time()
                self.lines.append((now, line.rstrip("\n")))
                out.write(f"{now - self.started:9.2f} {line}")
                count = finished_in(line)
                if count is not None:
                    self.finished = count
                    if self.kill_at is not None and count >= self.kill_at:
                        self.reached.set()
        self.reached.set()  # the driver ended (or was killed) before reaching it

    def first(self, predicate) -> float | None:
        """Seconds from the start to the first output line for which ``predicate(text)`` holds."""
        return next((t - self.started for t, text in self.lines if predicate(text)), None)

    def end(self, kill: bool) -> dict[str, Any]:
        if kill:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:  # the driver and its Ray had ended already
                pass
        self.process.wait()
        self.reader.join()
        ended = time.time()
        return {"returncode": self.process.returncode, "wall_s": ended - self.started, **self.sampler.stop()}


def records(runs: Path, name: str) -> dict[str, Any]:
    """What the study's stores hold at the end: Optuna trials by state, MLflow trial runs by status, and the trials
    with no run or with more than one."""
    import mlflow
    import optuna

    from study.records.tracking import all_pages, child_runs, find_study_run
    from study.search.journal import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}"))
    trials = study.get_trials(deepcopy=False)
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dml-studies")
    parent = find_study_run(client, experiment.experiment_id, name)
    children = child_runs(client, experiment.experiment_id, parent.info.run_id)
    every = all_pages(client.search_runs, experiment_ids=[experiment.experiment_id])
    numbers = Counter(int(r.data.tags["optuna_trial_number"]) for r in children if "optuna_trial_number" in r.data.tags)
    spool = runs / "spool" / f"{name}.jsonl"
    return {
        "optuna_states": dict(Counter(t.state.name for t in trials)),
        "trial_runs": len(children),
        "trial_run_statuses": dict(Counter(r.info.status for r in children)),
        "runs_running": sum(r.info.status == "RUNNING" for r in every),
        "parent_status": parent.info.status,
        "trials_without_run": sum(t.number not in numbers for t in trials),
        "trials_with_runs_twice": sum(n > 1 for n in numbers.values()),
        "spool_lines_left": sum(1 for line in spool.read_text().splitlines() if line.strip()) if spool.exists() else 0,
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    name = f"resume-{args.slots}x{args.trials}-{int(time.time())}"
    runs = workdir / "runs"
    env = {**os.environ, "DML_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    start = ["--rehearse", f"{args.epoch_seconds:g}", "--ray-cpus", str(args.slots), "--max-concurrent", str(args.slots)]
    start += ["--num-samples", str(args.trials), "--epochs", "16", "--space", args.space, "--study-name", name]
    spool = runs / "spool" / f"{name}.jsonl"
    print(f"$ DML_RUNS_DIR={runs} python -m study.launch {shlex.join(start)}   (SIGKILLed at {args.kill_at} finished)", flush=True)
    first = Driver(start, env, workdir / "first.out", spool, kill_at=args.kill_at)
    first.reached.wait()
    killed_at = first.finished
    row: dict[str, Any] = {"study_name": name, "trials": args.trials, "slots": args.slots, "kill_at": args.kill_at}
    row["first"] = {**first.end(kill=True), "finished_when_killed": killed_at}
    if killed_at < args.kill_at:
        tail = "\n".join(text for _, text in first.lines[-6:])
        raise SystemExit(
            f"the study ended (exit {row['first']['returncode']}) with {killed_at} of --kill-at {args.kill_at} trials finished:\n{tail}"
        )
    row["first"]["errors"] = errors_in([text for _, text in first.lines])
    resume = ["--study-name", name, "--resume"]
    print(f"$ DML_RUNS_DIR={runs} python -m study.launch {shlex.join(resume)}   (killed at {killed_at} finished)", flush=True)
    second = Driver(resume, env, workdir / "resume.out", spool)
    row["resume"] = second.end(kill=False)
    row["resume"]["header_s"] = second.first(lambda text: f"of study {name}: " in text)
    progress = next(((t - second.started, finished_in(text)) for t, text in second.lines if finished_in(text) is not None), (None, None))
    row["resume"]["first_progress_s"], row["resume"]["first_progress_finished"] = progress
    row["resume"]["errors"] = errors_in([text for _, text in second.lines])
    row["resume"]["output_tail"] = [text for _, text in second.lines[-6:]] if row["resume"]["returncode"] else []
    row["records"] = records(runs, name)
    return row


def build_parser() -> argparse.ArgumentParser:
    parser = harness.parser("resume_scale", __doc__)
    parser.add_argument("--trials", type=int, default=5000, help="trials of the study (default 5000)")
    parser.add_argument("--kill-at", type=int, default=4000, help="SIGKILL the driver once this many trials finished (default 4000)")
    parser.add_argument("--slots", type=int, default=32, help="concurrent trials (= Ray's logical CPUs) to rehearse (default 32)")
    parser.add_argument("--epoch-seconds", type=float, default=0.05, help="seconds the surrogate sleeps per epoch (default 0.05)")
    parser.add_argument("--space", default="smoke", help="search space, as study.launch --space (default smoke)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "resume_scale.jsonl"), help="the .jsonl to append to")
    parser.add_argument("--keep", help="keep the stores and both drivers' output under this folder (default: a temporary one, removed)")
    parser.add_argument("--repeat", type=int, default=1, help="kill and resume this many studies, one after the other (default 1)")
    return parser


def whole(row: dict[str, Any]) -> bool:
    """Whether the resume ended and the study kept its records: one run per Optuna trial, none twice, none RUNNING,
    the parent FINISHED, the spool empty."""
    kept = row["records"]
    return (
        row["resume"]["returncode"] == 0
        and kept["parent_status"] == "FINISHED"
        and not (kept["trials_without_run"] or kept["trials_with_runs_twice"] or kept["runs_running"] or kept["spool_lines_left"])
    )


def once(args: argparse.Namespace, argv: list[str], commit: str) -> dict[str, Any]:
    """One kill and resume, its row appended to ``--out`` and summed up in three lines."""
    with tempfile.TemporaryDirectory(prefix="resume_scale_") as tmp:
        workdir = Path(args.keep or tmp) / f"{args.slots}x{args.trials}-{int(time.time())}"
        workdir.mkdir(parents=True)
        state = harness.machine_state()
        row = run(args, workdir)
    row.update(state, loadavg_after=os.getloadavg(), commit=commit, bench_command=harness.command("resume_scale", argv))
    row.update(date=harness.now(), workdir=str(workdir) if args.keep else None, machine=harness.machine_line())
    harness.append_row(args.out, row)
    first, resume, kept = row["first"], row["resume"], row["records"]
    print(
        f"first driver: killed at {first['finished_when_killed']} finished after {first['wall_s']:.0f} s, peak RSS "
        f"{first['driver_peak_rss_mb']:.0f} MB, {first['driver_cpu_s']:.0f} CPU-s\n"
        f"resume: rc {resume['returncode']}, header at {resume['header_s']} s, first progress at {resume['first_progress_s']} s, "
        f"end at {resume['wall_s']:.0f} s, peak RSS {resume['driver_peak_rss_mb']:.0f} MB, {resume['driver_cpu_s']:.0f} CPU-s\n"
        f"records: {json.dumps(kept)}" + ("" if whole(row) else f"\nNOT WHOLE: {resume['output_tail'] or 'records above'}"),
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if not 0 < args.kill_at < args.trials:
        build_parser().error(f"--kill-at: expected between 1 and --trials - 1 ({args.trials - 1}), got {args.kill_at}")
    if args.repeat < 1:
        build_parser().error(f"--repeat: expected an integer >= 1, got {args.repeat}")
    commit = harness.commit()
    rows = [once(args, argv, commit) for _ in range(args.repeat)]
    headers = sorted(row["resume"]["header_s"] for row in rows if row["resume"]["header_s"] is not None)
    spread = f"; headers at {headers[0]:.1f} to {headers[-1]:.1f} s" if headers else ""
    return harness.bound(
        all(map(whole, rows)), f"every kill resumes with its records whole ({sum(map(whole, rows))} of {len(rows)}{spread})"
    )


if __name__ == "__main__":
    sys.exit(main())

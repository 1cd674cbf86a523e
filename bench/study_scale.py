"""A study at cluster scale, rehearsed on one machine: the full stack against stock Ray Tune on the same surrogate.

Workload: for each (slots, trials) of a grid, one after the other, a study of the surrogate trainable
(``trainables.surrogate``: it trains nothing and sleeps EPOCH_S per epoch, so what is left is the cost of
orchestrating SLOTS trials on this machine's real cores), each trial asking for one logical CPU:

* **full**: ``python -m study.launch --rehearse EPOCH_S --ray-cpus SLOTS --max-concurrent SLOTS --num-samples TRIALS
  --epochs 16 --space SPACE``: the driver, TPE, the budget scheduler, the race's re-runs, the MLflow recorder and its
  spool, the Optuna journal, in a fresh ``DML_RUNS_DIR``;
* **stock**: the same surrogate as a user would tune it by hand: ``tune.Tuner`` with ``OptunaSearch`` (TPE,
  define-by-run over the same space), ``ASHAScheduler`` (max_t 16, grace 4, reduction 4), ``max_concurrent_trials=SLOTS``,
  ``MLflowLoggerCallback`` to a sqlite store, ``ray.init(num_cpus=SLOTS)``, Ray's defaults otherwise, in a process of
  its own (``_stock``);
* **bare** (``--only bare`` or ``all``): Ray's own scalability benchmark's floor: TRIALS configs drawn up front, no
  searcher, no scheduler, no loggers.

Measured per run (one JSON line each): the wall and fit wall against the minimum ((epochs reported) x EPOCH_S /
SLOTS); the driver's own CPU-seconds and peak RSS (psutil, every 0.5 s; Ray's processes apart); the MLflow backlog.

Question: what does the study driver cost when a study has many slots and many trials, against stock Ray Tune?

Bound (issue 27): at each (slots, trials) where both ran, the full stack's driver CPU per trial is at most half stock
Ray Tune's and its overhead (wall minus the minimum) at most stock's; the full stack's driver stays under 2 GB.

  python -m bench.study_scale --slots 8 32 --trials 100                    # both stacks, 4 runs
  python -m bench.study_scale --slots 64 --trials 100 --only full          # one stack
  python -m bench.study_scale --table-only                                 # the .md and plots again from the .jsonl

Results: docs/bench/study_scale.jsonl (appended, with the commit, the load average and the command), .md and plots.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import ROOT

METRIC, MODE = "val_recall_at_1", "max"
MAX_T, GRACE, REDUCTION = 16, 4, 4  # the stock ASHA of the brief; the full stack derives the same ladder from --epochs 16
SAMPLE_S = 0.5
STACKS = ("full", "stock", "bare")
STOCK_MARK = "STUDY_SCALE_STOCK "  # the stock child's lines for this script: fit start, fit end, result


def import_psutil():
    """psutil: installed, else the copy Ray ships in its thirdparty_files."""
    try:
        import psutil
    except ImportError:
        __import__("ray")  # importing Ray puts the psutil it ships on the path
        import psutil
    return psutil


class Sampler(threading.Thread):
    """Samples a driver process and its descendants every SAMPLE_S seconds until the driver exits.

    Keeps the driver's last CPU-seconds (user + system) and peak RSS, the largest CPU-seconds seen for each
    descendant pid (a process that exits loses what it spent after its last sample), and the longest line
    count of ``spool`` (a file; missing counts 0).
    """

    def __init__(self, pid: int, spool: Path | None = None) -> None:
        super().__init__(daemon=True)
        psutil = self.psutil = import_psutil()
        self.driver = psutil.Process(pid)
        self.spool = spool
        self.driver_cpu_s = 0.0
        self.peak_rss = 0
        self.children: dict[int, tuple[str, float]] = {}
        self.max_spool = 0
        self.samples = 0
        self.machine_before = self._machine_busy()
        self.done = threading.Event()

    @staticmethod
    def _machine_busy() -> float:
        t = import_psutil().cpu_times()
        return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)

    def run(self) -> None:
        ps = self.psutil
        while not self.done.is_set():
            try:
                with self.driver.oneshot():
                    cpu = self.driver.cpu_times()
                    self.driver_cpu_s = cpu.user + cpu.system
                    self.peak_rss = max(self.peak_rss, self.driver.memory_info().rss)
                    children = self.driver.children(recursive=True)
            except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
                break
            for child in children:
                try:
                    c = child.cpu_times()
                    name = " ".join(child.cmdline()[:1]) or child.name()
                    if name.startswith("ray::") or "default_worker.py" in " ".join(child.cmdline()):
                        kind = "workers"
                    else:
                        kind = "ray_system"
                    seen = self.children.get(child.pid, (kind, 0.0))[1]
                    self.children[child.pid] = (kind, max(seen, c.user + c.system))
                except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
                    continue
            if self.spool is not None and self.spool.exists():
                try:
                    with self.spool.open("rb") as fh:
                        self.max_spool = max(self.max_spool, sum(1 for _ in fh))
                except OSError:
                    pass
            self.samples += 1
            self.done.wait(SAMPLE_S)

    def stop(self) -> dict[str, Any]:
        self.done.set()
        self.join()
        by_kind: dict[str, float] = {}
        for kind, cpu in self.children.values():
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu
        return {
            "driver_cpu_s": self.driver_cpu_s,
            "driver_peak_rss_mb": self.peak_rss / 2**20,
            "ray_system_cpu_s": by_kind.get("ray_system", 0.0),
            "workers_cpu_s": by_kind.get("workers", 0.0),
            "descendant_processes": len(self.children),
            "machine_busy_cpu_s": self._machine_busy() - self.machine_before,
            "max_spool_lines": self.max_spool if self.spool is not None else None,
            "samples": self.samples,
        }


def run_sampled(command: list[str], env: dict[str, str], log: Path, spool: Path | None) -> dict[str, Any]:
    """Run ``command`` with its output timestamped line by line into ``log``; returns the samples and the lines."""
    lines: list[tuple[float, str]] = []
    started = time.time()
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        sampler = Sampler(process.pid, spool)
        sampler.start()
        with log.open("w") as out:
            for line in process.stdout:
                now = time.time()
                lines.append((now, line.rstrip("\n")))
                out.write(f"{now - started:9.2f} {line}")
        process.wait()
    ended = time.time()
    return {"started": started, "ended": ended, "returncode": process.returncode, "lines": lines, **sampler.stop()}


def run_full(slots: int, trials: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    name = f"scale-full-{slots}x{trials}-{int(time.time())}"
    runs = workdir / "runs"
    command = [sys.executable, "-m", "study.launch", "--rehearse", f"{args.epoch_seconds:g}", "--ray-cpus", str(slots)]
    command += ["--max-concurrent", str(slots), "--num-samples", str(trials), "--epochs", str(MAX_T), "--space", args.space]
    command += ["--study-name", name]
    if args.checkpoint_every is not None:
        command += ["--checkpoint-every", f"{args.checkpoint_every:g}"]
    env = {**os.environ, "DML_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    shown = f"DML_RUNS_DIR={runs} python " + shlex.join(command[1:])
    print(f"$ {shown}", flush=True)
    run = run_sampled(command, env, workdir / "driver.out", runs / "spool" / f"{name}.jsonl")
    lines = run.pop("lines")
    progress = [t for t, text in lines if text.startswith("[")]
    finished = next((t for t, text in lines if text.startswith(f"study {name} finished")), None)
    row: dict[str, Any] = {"stack": "full", "study_name": name, "command": shown}
    row["epochs"] = sum(sum(1 for line in p.read_text().splitlines() if line.strip()) for p in (runs / "ray" / name).glob("*/result.json"))
    row["tune_trials"] = len(list((runs / "ray" / name).glob("*/result.json")))
    try:
        import optuna

        from study.search.journal import open_storage
        from study.search.trial import epochs_trained

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{runs / 'optuna' / 'journal.log'}"))
        frozen = study.get_trials(deepcopy=False)
        row["optuna_search_epochs"] = sum(epochs_trained(t) for t in frozen)
        row["optuna_states"] = {s: sum(1 for t in frozen if t.state.name == s) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    except Exception as error:  # a failed study may have no journal: record why, keep the run's other figures
        row["optuna_error"] = repr(error)[:300]
    header = next((t for t, text in lines if f"study {name}: " in text), None)  # printed just before Tuner.fit
    row["fit_start"] = header or (progress[0] if progress else None)
    row["fit_end"] = progress[-1] if progress else None
    row["finished_line_at"] = finished
    log = runs / "logs" / f"{name}.log"
    log_lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    row["log_errors"] = errors_in(log_lines)
    row["checkpoint_every_s"] = args.checkpoint_every  # None: study.launch's default
    row["checkpoints_left"] = len(list((runs / "ray" / name).glob("*/checkpoint_*")))
    # Tune's warning when a trial's num_to_keep-th checkpoint since its last snapshot forced another one within 5 s
    row["forced_snapshot_warnings"] = sum(line.count("snapshotting has been triggered multiple times") for line in log_lines)
    row["driver_errors"] = errors_in([text for _, text in lines])
    row["summary_lines"] = [text for _, text in lines if text.startswith(("study ", "utilization"))]
    row["output_tail"] = [text for _, text in lines[-8:]] if run["returncode"] != 0 else []
    return {**row, **run}


def run_stock(slots: int, trials: int, args: argparse.Namespace, workdir: Path, bare: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.study_scale", "_stock", "--slots", str(slots), "--trials", str(trials)]
    command += ["--epoch-seconds", f"{args.epoch_seconds:g}", "--space", args.space, "--workdir", str(workdir)]
    command += ["--bare"] if bare else []
    shown = "python " + shlex.join(command[1:])
    print(f"$ {shown}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = run_sampled(command, env, workdir / "driver.out", None)
    lines = run.pop("lines")
    marks = {}
    for t, text in lines:
        if text.startswith(STOCK_MARK):
            kind, _, payload = text[len(STOCK_MARK) :].partition(" ")
            marks[kind] = (t, payload)
    result = json.loads(marks["result"][1]) if "result" in marks else {}
    stack = "bare" if bare else "stock"
    row: dict[str, Any] = {"stack": stack, "study_name": f"{stack}-{slots}x{trials}", "command": shown}
    row["epochs"] = result.get("epochs", 0)
    row["tune_trials"] = result.get("trials", 0)
    row["stock_errors"] = result.get("errors", 0)
    row["fit_start"] = marks["fit_start"][0] if "fit_start" in marks else None
    row["fit_end"] = marks["fit_end"][0] if "fit_end" in marks else None
    row["child_os_times"] = result.get("os_times")
    row["driver_errors"] = errors_in([text for _, text in lines])
    row["output_tail"] = [text for _, text in lines[-8:]] if run["returncode"] != 0 else []
    return {**row, **run}


def errors_in(lines: list[str]) -> list[str]:
    """Lines that say something failed (tracebacks, ERROR records, exceptions), first 20, each cut to 300 characters."""
    keys = ("Traceback", "ERROR", "Error:", "Exception", "exception", "failed")
    return [line[:300] for line in lines if any(k in line for k in keys) and "0 failed" not in line][:20]


def define_by_run(space, trial) -> dict[str, Any]:
    """OptunaSearch's define-by-run space: the space's distributions; its fixed values (epochs 16) returned as constants.

    Module level: Tune pickles the searcher, and this function with it, into its experiment state."""
    chosen = space.suggest(trial)
    return {k: v for k, v in {**space.fixed, "epochs": MAX_T}.items() if k not in chosen}


def drawn_configs(space, trials: int) -> list[dict[str, Any]]:
    """``trials`` configs of ``space`` drawn at random (Optuna's random sampler, seed 0), with 16 epochs each."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    return [space.to_config(space.suggest(study.ask()), {"epochs": MAX_T}) for _ in range(trials)]


def bare_trial(config: dict[str, Any], *, configs: list[dict[str, Any]], epoch_seconds: float) -> None:
    """One bare trial: the surrogate on the drawn config ``config["index"]`` names (module level: Tune pickles it)."""
    from trainables.surrogate import train_surrogate

    train_surrogate(configs[config["index"]], budgets=None, epoch_seconds=epoch_seconds)


def bare_tuner(space, args: argparse.Namespace, workdir: Path):
    """Bare stock Ray Tune: a grid over the drawn configs, no searcher, no scheduler, no callbacks."""
    from ray import tune

    slots, trials = args.slots[0], args.trials[0]
    trainable = tune.with_parameters(bare_trial, configs=drawn_configs(space, trials), epoch_seconds=args.epoch_seconds)
    return tune.Tuner(
        trainable,
        param_space={"index": tune.grid_search(list(range(trials)))},
        tune_config=tune.TuneConfig(max_concurrent_trials=slots),
        run_config=tune.RunConfig(name="bare", storage_path=str(workdir / "ray")),
    )


def stock_tuner(space, args: argparse.Namespace, workdir: Path):
    """Stock Ray Tune as a user would write it: OptunaSearch (TPE), ASHA and MLflowLoggerCallback."""
    from ray import tune
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from trainables.surrogate import train_surrogate

    slots, trials = args.slots[0], args.trials[0]
    return tune.Tuner(
        tune.with_parameters(train_surrogate, budgets=None, epoch_seconds=args.epoch_seconds),
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(space=functools.partial(define_by_run, space), metric=METRIC, mode=MODE, seed=0),
            scheduler=ASHAScheduler(
                time_attr="training_iteration", metric=METRIC, mode=MODE, max_t=MAX_T, grace_period=GRACE, reduction_factor=REDUCTION
            ),
            num_samples=trials,
            max_concurrent_trials=slots,
        ),
        run_config=tune.RunConfig(
            name="stock",
            storage_path=str(workdir / "ray"),
            callbacks=[MLflowLoggerCallback(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}", experiment_name="stock-scale")],
        ),
    )


def stock_child(args: argparse.Namespace) -> int:
    """The stock (or bare) Ray Tune study: run in its own process by ``run_stock``."""
    import ray

    from study.search.spaces import load_space

    space = load_space(args.space)
    workdir = Path(args.workdir)
    if args.bare:
        os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"  # read by Tune when the Tuner is built
    ray.init(address="local", num_cpus=args.slots[0])  # a Ray of its own, never one another process left running
    tuner = bare_tuner(space, args, workdir) if args.bare else stock_tuner(space, args, workdir)
    print(f"{STOCK_MARK}fit_start {time.time()}", flush=True)
    results = tuner.fit()
    print(f"{STOCK_MARK}fit_end {time.time()}", flush=True)
    epochs = sum(int((r.metrics or {}).get("training_iteration", 0)) for r in results)
    errors = sum(1 for r in results if r.error is not None)
    t = os.times()
    payload = {"epochs": epochs, "trials": len(results), "errors": errors, "os_times": [t.user, t.system]}
    print(f"{STOCK_MARK}result {json.dumps(payload)}", flush=True)
    return 0


def figures(row: dict[str, Any], slots: int, trials: int, epoch_s: float) -> dict[str, Any]:
    wall = row["ended"] - row["started"]
    fit_wall = row["fit_end"] - row["fit_start"] if row.get("fit_start") and row.get("fit_end") else None
    minimum = row["epochs"] * epoch_s / slots
    return {
        "slots": slots,
        "trials": trials,
        "epoch_seconds": epoch_s,
        "wall_s": wall,
        "fit_wall_s": fit_wall,
        "minimum_s": minimum,
        "wall_over_min": wall / minimum if minimum else None,
        "fit_over_min": fit_wall / minimum if minimum and fit_wall else None,
        "driver_cpu_s_per_trial": row["driver_cpu_s"] / trials,
        "driver_cpu_ms_per_epoch": 1000 * row["driver_cpu_s"] / row["epochs"] if row["epochs"] else None,
        "results_per_s": row["epochs"] / fit_wall if fit_wall else None,
        "startup_s": row["fit_start"] - row["started"] if row.get("fit_start") else None,
        "end_s": row["ended"] - row["fit_end"] if row.get("fit_end") else None,
    }


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def ckpt_every(row: dict[str, Any]) -> str:
    """The full stack's --checkpoint-every: every epoch before it existed (rows without the key), 60 by default since."""
    if row["stack"] != "full":
        return "-"
    if "checkpoint_every_s" not in row:
        return "0 (every epoch)"
    return fmt(row["checkpoint_every_s"] if row["checkpoint_every_s"] is not None else 60.0, 0)


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "# A study at scale, rehearsed on one machine (python -m bench.study_scale)",
        "",
        "full: `python -m study.launch --rehearse`; stock: hand-written `tune.Tuner` + OptunaSearch + ASHA + MLflowLoggerCallback, "
        "same surrogate; bare: `tune.Tuner` over drawn configs, no searcher, no scheduler, no loggers. "
        "minimum = epochs reported x epoch s / slots. fit wall: the header before `Tuner.fit` to the last "
        "progress line (full) or `Tuner.fit` (stock, bare). driver CPU: the driver process only (Ray's processes apart). "
        "The load column says what ran beside; docs/performance.md reads the figures.",
        "",
        "| stack | slots | trials | rc | Tune trials | epochs | wall s | fit wall s | minimum s | wall/min | fit/min | driver CPU-s | "
        "CPU-s/trial | CPU-ms/epoch | peak RSS MB | Ray system CPU-s | workers CPU-s | machine busy CPU-s | max spool | "
        "results/s | start-up s | end s | checkpoint every s | forced snapshot warnings | load before | commit |",
        "|" + "---|" * 26,
    ]
    for r in rows:
        out.append(
            f"| {r['stack']} | {r['slots']} | {r['trials']} | {r['returncode']} | {r['tune_trials']} | {r['epochs']} | "
            f"{fmt(r['wall_s'])} | {fmt(r['fit_wall_s'])} | {fmt(r['minimum_s'])} | {fmt(r['wall_over_min'], 2)} | "
            f"{fmt(r['fit_over_min'], 2)} | "
            f"{fmt(r['driver_cpu_s'])} | {fmt(r['driver_cpu_s_per_trial'], 2)} | {fmt(r['driver_cpu_ms_per_epoch'], 0)} | "
            f"{fmt(r['driver_peak_rss_mb'], 0)} | {fmt(r['ray_system_cpu_s'])} | {fmt(r['workers_cpu_s'])} | "
            f"{fmt(r['machine_busy_cpu_s'])} | {fmt(r.get('max_spool_lines'))} | {fmt(r['results_per_s'], 2)} | "
            f"{fmt(r['startup_s'])} | {fmt(r['end_s'])} | {ckpt_every(r)} | {fmt(r.get('forced_snapshot_warnings'))} | "
            f"{fmt(r['loadavg_before'][0], 2)} | {r['commit']} |"
        )
    return "\n".join(out) + "\n"


def plots(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, x, y, xlabel, ylabel in (
        ("cost", "trials", "driver_cpu_s_per_trial", "trials", "driver CPU-s per trial"),
        ("overhead", "slots", "wall_over_min", "slots (concurrent trials)", "wall / minimum"),
    ):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for stack, marker in (("full", "o"), ("stock", "s"), ("bare", "^")):
            group = "slots" if x == "trials" else "trials"
            for g in sorted({r[group] for r in rows if r["stack"] == stack}):
                pts = sorted((r[x], r[y]) for r in rows if r["stack"] == stack and r[group] == g and r[y] is not None)
                if pts:
                    ax.plot(*zip(*pts), marker=marker, label=f"{stack}, {g} {group}")
        ax.set_xscale("log", base=2 if x == "slots" else 10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_{name}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def write_outputs(out: Path) -> None:
    rows = harness.read_rows(out)
    out.with_suffix(".md").write_text(markdown(rows))
    paths = plots(rows, out)
    print(f"wrote {out.with_suffix('.md')} and {', '.join(str(p) for p in paths)}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = harness.parser("study_scale", __doc__)
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 32, 64], help="concurrent trials (= Ray's logical CPUs) to rehearse")
    parser.add_argument(
        "--trials", type=int, nargs="+", default=[100, 1000, 5000], help="trials per study (100 at 8 slots: ~100 s minimum at 1 s/epoch)"
    )
    parser.add_argument(
        "--epoch-seconds",
        type=float,
        default=1.0,
        help="seconds the surrogate sleeps per epoch (default 1); less stresses the driver more",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=float,
        help="full stack: study.launch --checkpoint-every SECONDS (default: study.launch's own, 60); 0 checkpoints every epoch",
    )
    parser.add_argument("--space", default="smoke", help="search space, as study.launch --space (default smoke; epochs forced to 16)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=(*STACKS, "both", "all"),
        default=["both"],
        help="the stacks to run, one after the other at each size: both is full and stock, all adds bare (default both)",
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "study_scale.jsonl"), help="the .jsonl to append to")
    parser.add_argument("--keep", help="keep each run's stores and logs under this folder (default: a temporary folder, removed)")
    parser.add_argument("--table-only", action="store_true", help="only rewrite the .md and the plots from the .jsonl")
    return parser


def bound(rows: list[dict[str, Any]]) -> int:
    """Issue 27's bound on this invocation's rows: the full stack against stock at each size both ran, its RSS."""
    stock = {(r["slots"], r["trials"]): r for r in rows if r["stack"] == "stock"}
    pairs = [(r, stock[r["slots"], r["trials"]]) for r in rows if r["stack"] == "full" and (r["slots"], r["trials"]) in stock]
    held = [f["driver_cpu_s_per_trial"] <= s["driver_cpu_s_per_trial"] / 2 and f["wall_s"] - f["minimum_s"] <= s["wall_s"] - s["minimum_s"]
            for f, s in pairs] + [r["driver_peak_rss_mb"] < 2048 for r in rows if r["stack"] == "full"]  # fmt: skip
    figures = "; ".join(f"{f['slots']}x{f['trials']}: {f['driver_cpu_s_per_trial']:.2f} against {s['driver_cpu_s_per_trial']:.2f} "
                        f"CPU-s a trial, {f['wall_s'] - f['minimum_s']:.0f} against {s['wall_s'] - s['minimum_s']:.0f} s over the "
                        f"minimum, {f['driver_peak_rss_mb']:.0f} MB" for f, s in pairs)  # fmt: skip
    statement = f"the full stack's driver CPU per trial at most half stock's, its overhead at most stock's, under 2 GB ({figures})"
    return harness.bound(all(held) if pairs else None, statement)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_stock"]:  # the stock study's own process (run_stock)
        child = build_parser()
        child.add_argument("--workdir", required=True)
        child.add_argument("--bare", action="store_true")
        return stock_child(child.parse_args(argv[1:]))
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if args.table_only:
        write_outputs(out)
        return 0
    if any(t >= 5000 for t in args.trials):
        print("note: 5000 trials at 1 s per epoch take hours on a small machine", flush=True)
    commit, command = harness.commit(), harness.command("study_scale", argv)
    named = {"both": ("full", "stock"), "all": STACKS}
    stacks = list(dict.fromkeys(stack for name in args.only for stack in named.get(name, (name,))))
    ran = []
    with tempfile.TemporaryDirectory(prefix="study_scale_") as tmp:
        base = Path(args.keep or tmp)
        for trials in args.trials:
            for slots in args.slots:
                for stack in stacks:
                    workdir = base / f"{stack}-{slots}x{trials}-{int(time.time())}"
                    workdir.mkdir(parents=True)
                    state = harness.machine_state()
                    if stack == "full":
                        row = run_full(slots, trials, args, workdir)
                    else:
                        row = run_stock(slots, trials, args, workdir, bare=stack == "bare")
                    row = {
                        **row,
                        **figures(row, slots, trials, args.epoch_seconds),
                        **state,
                        "loadavg_after": os.getloadavg(),
                        "commit": commit,
                        "date": harness.now(),
                        "bench_command": command,
                        "machine": harness.machine_line(),
                        "space": args.space,
                        "workdir": str(workdir) if args.keep else None,
                    }
                    harness.append_row(out, row)
                    ran.append(row)
                    print(
                        f"{stack} {slots}x{trials}: rc {row['returncode']}, wall {row['wall_s']:.0f} s (fit {fmt(row['fit_wall_s'])} s), "
                        f"minimum {row['minimum_s']:.0f} s, {row['epochs']} epochs, driver {row['driver_cpu_s']:.1f} CPU-s "
                        f"({row['driver_cpu_s_per_trial']:.2f}/trial), peak RSS {row['driver_peak_rss_mb']:.0f} MB, "
                        f"max spool {row.get('max_spool_lines')}, errors {len(row.get('driver_errors', []))}",
                        flush=True,
                    )
    write_outputs(out)
    return bound(ran)


if __name__ == "__main__":
    sys.exit(main())

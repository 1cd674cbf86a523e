"""Study utilization and where a trial's seconds go, for variants of the launch side by side.

Workload: ``python -m study.launch`` as a subprocess for the smoke study (``--space smoke``) and a short default
study (few trials and epochs), once per variant and repeat, interleaved, each in its own MLflow store, Optuna
journal and Ray storage. From the study's own records it reports:

* wall time (the parent run's ``wall_time_s``, from Tuner creation to the end), the in-trial seconds (``time_epoch_s``
  of every epoch of every child run) and the utilization of ``study.records.utilization``;
* start-up: the process start to the ``study NAME: ...`` line printed just before ``Tuner.fit()``, and from
  ``Tuner.fit()`` to the first trial's start and to its first epoch report;
* per search trial (means): waiting for a worker, set-up before its first epoch, the overhead between epochs, the tail
  after its last report; and the Ray worker processes the trials ran in.

A variant is ``NAME=SPEC``: SPEC holds environment assignments (``VAR=value``) and extra launch flags
(``--max-concurrent 4``). ``+reuse_actors`` runs the launch with ``tune.TuneConfig(reuse_actors=True)`` set by this
script; ``@PATH`` runs the launch of another checkout (``git worktree add PATH COMMIT``), to measure code before and
after a change side by side.

Question: how much of a study's wall time goes to training, and where does the rest go?

Bound (issue 12, on an idle machine): utilization at least 0.9 for the default study and at least 0.75 for the smoke
study, whose trials last seconds.

  DML_DATA_ROOT=../shared/data python -m bench.study_overhead             # smoke and short default, base and reuse
  python -m bench.study_overhead --studies smoke --variant base= --variant four='--max-concurrent 4'
  python -m bench.study_overhead --studies smoke --variant before=@/tmp/before --variant after=   # two commits
  python -m bench.study_overhead --reuse                                  # the tables again from the .jsonl

Results: docs/bench/study_overhead.jsonl (one line per run) and docs/bench/study_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import ROOT
from study.records import utilization

EXPERIMENT = "dml-studies"
REUSE_TOKEN = "+reuse_actors"
# Runs study.launch with every Tuner's TuneConfig(reuse_actors=True): a measurement shim for launches without a flag.
REUSE_SHIM = (
    "import dataclasses, runpy, sys\n"
    "from ray import tune\n"
    "_init = tune.Tuner.__init__\n"
    "def _reusing(self, *args, tune_config=None, **kwargs):\n"
    "    if tune_config is not None:\n"
    "        tune_config = dataclasses.replace(tune_config, reuse_actors=True)\n"
    "    _init(self, *args, tune_config=tune_config, **kwargs)\n"
    "tune.Tuner.__init__ = _reusing\n"
    "sys.argv = ['study.launch', *sys.argv[1:]]\n"
    "runpy.run_module('study.launch', run_name='__main__')\n"
)
TARGETS = {"smoke": 0.75, "default": 0.9}  # issue 12's utilization on an idle machine
STUDIES = {
    "smoke": lambda a: ["--space", "smoke", "--num-samples", str(a.smoke_samples)],
    "default": lambda a: ["--space", "default", "--num-samples", str(a.default_samples), "--epochs", str(a.default_epochs)],
}


def parse_variant(text: str) -> tuple[str, dict[str, str], list[str], bool, Path]:
    """``NAME=SPEC`` -> (name, environment, extra launch flags, reuse actors by the shim, the checkout to run)."""
    name, _, spec = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=SPEC, e.g. reuse=+reuse_actors or four='--max-concurrent 4'")
    env, flags, reuse, checkout = {}, [], False, ROOT
    for token in shlex.split(spec):
        if token == REUSE_TOKEN:
            reuse = True
        elif token.startswith("@"):
            checkout = Path(token[1:]).resolve()
            if not (checkout / "study" / "launch.py").is_file():
                raise SystemExit(f"--variant {text!r}: {checkout} holds no study/launch.py; expected a checkout of this project")
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", token) and not flags:
            key, _, value = token.partition("=")
            env[key] = value
        else:
            flags.append(token)
    return name, env, flags, reuse, checkout


def launch(study: str, variant: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One study run; returns the bench's own clock readings and the launch's paths."""
    name, env, flags, reuse, checkout = parse_variant(variant)
    study_name = f"{study}-{name}-{int(time.time())}"
    paths = {
        "tracking_uri": f"sqlite:///{workdir / 'mlflow.db'}",
        "journal": str(workdir / "journal.log"),
        "storage": str(workdir / "ray"),
    }
    command = [sys.executable, *(["-c", REUSE_SHIM] if reuse else ["-m", "study.launch"])]
    command += [*STUDIES[study](args), "--study-name", study_name, "--tracking-uri", paths["tracking_uri"]]
    command += ["--optuna-storage", f"journal:{paths['journal']}", "--storage-path", paths["storage"], "--seed", str(args.seed), *flags]
    environment = {**os.environ, "DML_RUNS_DIR": str(workdir / "runs"), **env}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))
    if args.data_root:
        environment["DML_DATA_ROOT"] = args.data_root
    shown = shlex.join(["python", *(["<reuse shim>"] if reuse else ["-m", "study.launch"]), *command[3:]])
    print(f"$ {' '.join(f'{k}={v}' for k, v in env.items())} {shown}", flush=True)
    lines: list[tuple[float, str]] = []
    started = time.time()
    with subprocess.Popen(command, cwd=checkout, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            lines.append((time.time(), line.rstrip("\n")))
            if args.verbose:
                print("   ", line.rstrip("\n"), flush=True)
    ended = time.time()
    if process.returncode != 0:
        tail = "\n".join(text for _, text in lines[-30:])
        raise RuntimeError(f"{study}/{name}: study.launch exited with {process.returncode}:\n{tail}")
    fit_at = next((t for t, text in lines if text.startswith(f"study {study_name}:")), None)
    return {
        "study": study,
        "variant": name,
        "spec": variant.partition("=")[2],
        "study_name": study_name,
        "paths": paths,
        "process_start": started,
        "process_end": ended,
        "fit_at": fit_at,
        "summary_lines": [text for _, text in lines if text.startswith(("study ", "utilization"))],
    }


def result_pids(storage: str, study_name: str) -> dict[str, set[int]]:
    """Tune trial id -> the pids of the processes its reports came from (result.json of the search and its re-runs;
    ``NAME-confirm``: the re-runs' own Tuner, before they ran in the search's)."""
    pids: dict[str, set[int]] = {}
    for folder in (Path(storage) / study_name, Path(storage) / f"{study_name}-confirm"):
        for path in folder.glob("*/result.json"):
            for line in path.read_text().splitlines():
                if line.strip():
                    report = json.loads(line)
                    pids.setdefault(str(report.get("trial_id")), set()).add(int(report.get("pid", -1)))
    return pids


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def measure(run: dict[str, Any], slots: int | None = None) -> dict[str, Any]:
    """The figures of one study run from its MLflow runs, Optuna trials and Tune result files."""
    import mlflow
    import optuna

    from study.search.journal import open_storage

    client = mlflow.MlflowClient(run["paths"]["tracking_uri"])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    parent = client.search_runs([experiment.experiment_id], f"tags.study_name = '{run['study_name']}' and tags.kind = 'study'")[0]
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=10000)
    epochs = utilization.epochs_from_mlflow(client, experiment.experiment_id, parent.info.run_id)
    wall_s = float(parent.data.metrics["wall_time_s"])
    params = parent.data.params
    slots = slots or utilization.concurrent_slots(
        int(params.get("max_concurrent", 2)), cpus=os.cpu_count(), cpus_per_trial=float(params.get("cpus_per_trial", 1.0))
    )
    startup_s = run["fit_at"] - run["process_start"] if run["fit_at"] else float("nan")
    figure = utilization.study_utilization(epochs, wall_s, slots, startup_s)

    study = optuna.load_study(study_name=run["study_name"], storage=open_storage(f"journal:{run['paths']['journal']}"))
    asked = {t.user_attrs.get("tune_trial_id"): t.datetime_start.timestamp() for t in study.get_trials(deepcopy=False) if t.datetime_start}
    trials, by_kind = [], {}
    for child in children:
        kind, trial_id = child.data.tags.get("kind"), child.data.tags.get("trial_id")
        if kind not in utilization.TRIAL_KINDS:
            continue
        key = next((k for k in utilization.TIME_KEYS["epoch_s"] if k in child.data.metrics), None)
        history = utilization.every_epoch(client, child.info.run_id, key) if key else []
        if not history:
            continue
        start, end = child.info.start_time / 1000, (child.info.end_time or 0) / 1000
        reports = [m.timestamp / 1000 for m in history]
        seconds = [m.value for m in history]
        gaps = [reports[i] - reports[i - 1] - seconds[i] for i in range(1, len(reports))]
        trials.append(
            {
                "kind": kind,
                "trial_id": trial_id,
                "epochs": len(history),
                "in_trial_s": sum(seconds),
                "start": start,
                "first_report": reports[0],
                "worker_wait_s": start - asked[trial_id] if trial_id in asked else None,
                "setup_s": reports[0] - start - seconds[0],
                "between_epochs_s": sum(gaps),
                "tail_s": end - reports[-1] if end else None,
                "span_s": (end or reports[-1]) - start,
            }
        )
        by_kind[kind] = by_kind.get(kind, 0.0) + sum(seconds)
    search = [t for t in trials if t["kind"] == "trial"]
    pids = result_pids(run["paths"]["storage"], run["study_name"])
    fit_at = run["fit_at"]
    return {
        "study": run["study"],
        "variant": run["variant"],
        "spec": run["spec"],
        "study_name": run["study_name"],
        "trials": len(trials),
        "search_trials": len(search),
        "epochs": sum(t["epochs"] for t in trials),
        "slots": slots,
        "wall_s": wall_s,
        "process_s": run["process_end"] - run["process_start"],
        "in_trial_s": figure.in_trial_s,
        "in_trial_by_kind_s": by_kind,
        "utilization": figure.utilization,
        "startup_s": startup_s,
        "fit_to_first_trial_s": min(t["start"] for t in trials) - fit_at if trials and fit_at else None,
        "fit_to_first_report_s": min(t["first_report"] for t in trials) - fit_at if trials and fit_at else None,
        "per_trial": {
            key: mean([t[key] for t in search if t[key] is not None])
            for key in ("worker_wait_s", "setup_s", "between_epochs_s", "tail_s", "in_trial_s", "span_s", "epochs")
        },
        "worker_processes": len({p for s in pids.values() for p in s}),
        "tune_trials": len(pids),
        "launch_summary": run["summary_lines"],
        "loadavg_after": harness.load(),
    }


def f(value: Any, digits: int = 1) -> str:
    return harness.cell(value, f".{digits}f")


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        "# Study utilization and start-up costs",
        "",
        f"Machine: {meta['machine']}; code at {meta.get('commit', '?')}. Command: `{meta['command']}`. {meta.get('note', '')}",
        "",
        "utilization = in-trial seconds (time_epoch_s of every child run) / (wall_time_s x slots); "
        "start-up = process start to `Tuner.fit()`, reported apart.",
        "",
        "| study | variant | trials (Tune) | epochs | wall s | in-trial s | slots | utilization | vs first variant | "
        "start-up s | fit -> 1st trial s | fit -> 1st report s | worker processes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    first: dict[str, float] = {}
    for r in rows:
        first.setdefault(r["study"], r["utilization"])
        ratio = r["utilization"] / first[r["study"]] if first[r["study"]] else float("nan")
        out.append(
            f"| {r['study']} | {r['variant']} | {r['trials']} ({r['tune_trials']}) | {r['epochs']} | {f(r['wall_s'])} | "
            f"{f(r['in_trial_s'])} | {r['slots']} | {f(r['utilization'], 3)} | {f(ratio, 2)}x | {f(r['startup_s'])} | "
            f"{f(r['fit_to_first_trial_s'])} | {f(r['fit_to_first_report_s'])} | {r['worker_processes']} |"
        )
    out += [
        "",
        "Where a search trial's seconds go (means per trial): waiting for a worker (Optuna ask to the trial's start in Tune), "
        "set-up in the trial before its first epoch, overhead between epochs, the tail after the last report, and its epochs.",
        "",
        "| study | variant | worker wait s | set-up s | between epochs s | tail s | in epochs s | epochs | span s (start to end) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["per_trial"]
        out.append(
            f"| {r['study']} | {r['variant']} | {f(p['worker_wait_s'])} | {f(p['setup_s'])} | {f(p['between_epochs_s'])} | "
            f"{f(p['tail_s'])} | {f(p['in_trial_s'])} | {f(p['epochs'])} | {f(p['span_s'])} |"
        )
    out += ["", "Variants: " + "; ".join(f"`{v}`" for v in meta["variants"]), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.study_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", nargs="+", default=["smoke", "default"], choices=sorted(STUDIES))
    parser.add_argument(
        "--variant",
        action="append",
        help=f"NAME=SPEC, repeatable: env assignments, launch flags, {REUSE_TOKEN} (default: base= and reuse={REUSE_TOKEN})",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, interleaved (default 1)")
    parser.add_argument("--smoke-samples", type=int, default=8, help="trials of the smoke study (default 8)")
    parser.add_argument("--default-samples", type=int, default=6, help="trials of the short default study (default 6)")
    parser.add_argument("--default-epochs", type=int, default=4, help="epochs of the short default study (default 4: budgets 1 and 4)")
    parser.add_argument("--slots", type=int, help="concurrent slots to divide by (default: the study's max_concurrent, capped by CPUs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", default=os.environ.get("DML_DATA_ROOT") or str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--workdir", help="keep the studies' stores here (default: a temporary folder, removed)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "study_overhead.jsonl"))
    parser.add_argument("--note", default="", help="a sentence for the table's header: what else ran on the machine")
    parser.add_argument("--reuse", action="store_true", help="only rewrite the .md from the .jsonl")
    parser.add_argument("--verbose", action="store_true", help="echo the launch's output")
    args = parser.parse_args(argv)
    out = Path(args.out)
    variants = args.variant or ["base=", f"reuse={REUSE_TOKEN}"]
    command = harness.command("study_overhead", argv or sys.argv[1:])
    meta = {"machine": harness.machine_line(), "commit": harness.commit(), "command": command, "variants": variants, "note": args.note}
    if args.reuse:
        lines = harness.read_rows(out)
        meta, rows = lines[0]["meta"], [line for line in lines if "meta" not in line]
        harness.write(out.with_suffix(".md"), markdown(rows, meta))
        return bound(rows)
    rows = []
    with tempfile.TemporaryDirectory(prefix="study_overhead_") as tmp:
        for study in args.studies:
            for repeat in range(args.repeats):
                for variant in variants:
                    workdir = Path(args.workdir or tmp) / f"{study}-{variant.partition('=')[0]}-{repeat}"
                    workdir.mkdir(parents=True, exist_ok=True)
                    before = harness.load()
                    row = {**measure(launch(study, variant, args, workdir), args.slots), "repeat": repeat, "loadavg_before": before}
                    rows.append(row)
                    print(
                        f"{study}/{row['variant']}: utilization {row['utilization']:.3f} ({row['in_trial_s']:.0f} s in trials / "
                        f"{row['wall_s']:.0f} s x {row['slots']}); start-up {row['startup_s']:.1f} s; fit -> first trial "
                        f"{f(row['fit_to_first_trial_s'])} s; {row['worker_processes']} worker processes for {row['tune_trials']} trials",
                        flush=True,
                    )
    harness.write(out, "\n".join(json.dumps(line) for line in [{"meta": meta}, *rows]) + "\n")
    harness.write(out.with_suffix(".md"), markdown(rows, meta))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return bound(rows)


def bound(rows: list[dict[str, Any]]) -> int:
    """Issue 12's utilization targets, run by run."""
    runs = ", ".join(f"{r['study']}/{r['variant']} {r['utilization']:.3f}" for r in rows)
    held = all(r["utilization"] >= TARGETS[r["study"]] for r in rows) if rows else None
    return harness.bound(held, f"utilization at least 0.9 for the default study and 0.75 for the smoke study ({runs})")


if __name__ == "__main__":
    sys.exit(main())

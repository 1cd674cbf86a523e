"""Training throughput of the core on the CPU, and the per-epoch overhead of the Ray trainable.

Workload, on the CPU with a fixed number of torch threads:

- small_cnn: the HBN config of configs/omniglot_hbn.yaml (small_cnn, Omniglot, 32 px grayscale), trained by
  ``trainables.core.engine.fit`` in study mode.
- resnet18: the same loss and batch settings with backbone resnet18 (no pretrained weights) on 64 px RGB images
  decoded from files: coloured stroke glyphs (``trainables.core.data.synthetic_glyphs``) written as 73 px PNG files
  into a temporary ``folder`` dataset, cropped (RandomResizedCrop 64) and flipped as a photo dataset is.
- ray: the small_cnn config (or ``--ray-backbone resnet18``) trained for warm-up + N epochs by ``engine.fit`` in this
  process, and by ``trainables.dml.train_dml`` in a one-trial Ray Tune run set up as ``python -m study.launch`` sets up
  a study (local Ray, one checkpoint per epoch, num_to_keep=2), alternating. The per-epoch overhead is (ray - direct) /
  direct of the median wall time between consecutive epoch reports; Ray's start-up is reported apart.

Every run's first epoch is a warm-up left out of the medians; each epoch is split into data loading (waiting for the
loader, decoding, augmentation), compute (forward, backward, optimizer step) and evaluation.

Question: how fast does the core train on a CPU, and what does running it as a Ray Tune trial cost per epoch?

Bound: the Ray trainable adds at most 5 % to an epoch's wall time.

  python -m bench.throughput                                        # all measurements, default settings
  python -m bench.throughput --epochs 2 --repeats 1 --out /tmp/throughput.json
  python -m bench.throughput --only ray --threads 2
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import ROOT

MEASUREMENTS = ("small_cnn", "resnet18", "ray")
HBN_CONFIG = ROOT / "configs" / "omniglot_hbn.yaml"
TARGET_OVERHEAD = 0.05  # at most 5 % per epoch through Ray
WARMUP_EPOCHS = 1
BUSY_LOAD = 1.0  # 1-minute load average of other processes above which the results are marked as taken on a busy machine
# the generated RGB folder dataset of the resnet18 measurement
PHOTO_TRAIN_CLASSES, PHOTO_TEST_CLASSES, PHOTO_PER_CLASS, PHOTO_SIZE = 50, 10, 20, 73  # 73 = round(64 * 256 / 224)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.parser("throughput", __doc__)
    a = parser.add_argument
    a("--epochs", type=int, default=5, help="measured epochs per training run, after one warm-up epoch (default 5)")
    a("--repeats", type=int, default=3, help="training runs per measurement; the Ray comparison alternates direct and Ray (default 3)")
    a("--threads", type=int, default=1, help="torch threads (and OMP/MKL threads), the same for every run (default 1, a trial's CPU)")
    a("--out", default="docs/bench/throughput.json", help="JSON output; the markdown fragment goes beside it as .md")
    a("--only", default=",".join(MEASUREMENTS), help=f"comma-separated subset of {','.join(MEASUREMENTS)} (default: all)")
    a("--ray-backbone", default="small_cnn", choices=("small_cnn", "resnet18"), help="the config of the Ray comparison")
    a("--data-root", help="folder holding omniglot/ (default: $DML_DATA_ROOT)")
    args = parser.parse_args(argv)
    for flag, value in (("--epochs", args.epochs), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag} {value}: expected an integer >= 1")
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = [m for m in only if m not in MEASUREMENTS]
    if unknown or not only:
        parser.error(f"--only {args.only}: expected a comma-separated subset of {','.join(MEASUREMENTS)}")
    args.only = [m for m in MEASUREMENTS if m in only]
    args.data_root = args.data_root or os.environ.get("DML_DATA_ROOT")
    needs_omniglot = "small_cnn" in args.only or ("ray" in args.only and args.ray_backbone == "small_cnn")
    if needs_omniglot and not (args.data_root and (Path(args.data_root) / "omniglot").is_dir()):
        where = f"--data-root {args.data_root}: no omniglot/ folder there" if args.data_root else "no data root"
        parser.error(f"{where}; expected --data-root DIR or $DML_DATA_ROOT naming a folder that holds omniglot/")
    if args.data_root:
        args.data_root = str(Path(args.data_root).expanduser().resolve())
    return args


def spread(values: list[float]) -> dict[str, Any]:
    """Median, quartiles, min and max of ``values`` (all NaN when empty)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"n": 0, "median": math.nan, "q1": math.nan, "q3": math.nan, "min": math.nan, "max": math.nan, "values": []}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return {
        "n": len(values),
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": min(values),
        "max": max(values),
        "values": [round(v, 6) for v in values],
    }


def relative(a: float, b: float) -> float:
    return (a - b) / b if b > 0 else math.nan


def hbn_config(epochs: int, **changes: Any):
    import yaml

    from trainables.core.config import TrainConfig

    values = yaml.safe_load(HBN_CONFIG.read_text())
    return TrainConfig.from_dict({**values, "epochs": epochs, **changes}, source=str(HBN_CONFIG))


def resnet18_config(epochs: int):
    return hbn_config(epochs, backbone="resnet18", pretrained="none", dataset="folder", image_size=64)


def write_photo_folder(root: Path, seed: int = 0) -> Path:
    """A ``folder`` dataset of coloured glyph PNGs under ``root`` (returned): train/ and test/ classes."""
    import numpy as np
    from PIL import Image

    from trainables.core.data import synthetic_glyphs

    classes = PHOTO_TRAIN_CLASSES + PHOTO_TEST_CLASSES
    glyphs, labels = synthetic_glyphs(classes, PHOTO_PER_CLASS, PHOTO_SIZE, seed=seed)
    rng = np.random.default_rng(seed)
    colours = rng.uniform(0, 255, size=(classes, 2, 3))
    for i, (glyph, label) in enumerate(zip(glyphs, labels)):
        ink = 1.0 - glyph[..., None].astype(np.float32) / 255.0
        background, foreground = colours[label]
        rgb = background * (1 - ink) + foreground * ink + rng.normal(0, 8, size=(PHOTO_SIZE, PHOTO_SIZE, 3))
        part = "train" if label < PHOTO_TRAIN_CLASSES else "test"
        folder = root / part / f"class_{label:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(folder / f"{i:05d}.png")
    return root


def train_direct(config, data_root: str | None) -> dict[str, Any]:
    """One ``engine.fit`` in this process: per-epoch metrics, report times and the run's sizes."""
    import torch

    from trainables.core.engine import fit

    epochs: list[dict[str, float]] = []
    marks: list[float] = []

    def on_epoch(epoch: int, metrics: dict[str, float], run) -> None:
        marks.append(time.perf_counter())
        epochs.append({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})

    started = time.perf_counter()
    run = fit(config, on_epoch, mode="study", data_root=data_root, device=torch.device("cpu"), num_workers=0)
    finished = time.perf_counter()
    eval_images = len(run.eval_set) + (len(run.gallery) if run.gallery is not None else 0)
    return {
        "epochs": epochs,
        "report_times": marks,
        "setup_s": marks[0] - started - epochs[0]["time/epoch_s"],  # data, model, optimizer before epoch 1
        "total_s": finished - started,
        "train_images_per_epoch": len(run.sampler) * config.batch_size,
        "eval_images": eval_images,
        "run": run,
    }


def epoch_breakdown(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and spreads over the measured (post warm-up) epochs of ``runs``."""
    rows = [e for r in runs for e in r["epochs"][WARMUP_EPOCHS:]]
    if not rows:  # a single-epoch run: only the warm-up epoch
        rows = [e for r in runs for e in r["epochs"]]
    n_train, n_eval = runs[0]["train_images_per_epoch"], runs[0]["eval_images"]

    def column(key: str) -> list[float]:
        return [e.get(key, math.nan) for e in rows]

    other = [e["time/epoch_s"] - e["time/data_s"] - e["time/compute_s"] - e.get("time/eval_s", 0.0) for e in rows]
    return {
        "train_images_per_epoch": n_train,
        "eval_images": n_eval,
        "measured_epochs": len(rows),
        "train_images_per_s": spread([n_train / t for t in column("time/train_s")]),
        "compute_images_per_s": spread([n_train / t for t in column("time/compute_s")]),
        "eval_images_per_s": spread([n_eval / t for t in column("time/eval_s")]),
        "epoch_images_per_s": spread([n_train / t for t in column("time/epoch_s")]),
        "time_epoch_s": spread(column("time/epoch_s")),
        "time_train_s": spread(column("time/train_s")),
        "time_data_s": spread(column("time/data_s")),
        "time_compute_s": spread(column("time/compute_s")),
        "time_eval_s": spread(column("time/eval_s")),
        "time_other_s": spread(other),
        "setup_s": spread([r["setup_s"] for r in runs]),
    }


def measure_throughput(name: str, config, data_root: str | None, repeats: int) -> dict[str, Any]:
    runs = []
    for repeat in range(repeats):
        print(f"[{name}] run {repeat + 1}/{repeats}: {config.epochs} epochs ({WARMUP_EPOCHS} warm-up)", flush=True)
        result = train_direct(config, data_root)
        result.pop("run")
        runs.append(result)
        e = result["epochs"][-1]
        print(f"[{name}]   last epoch {e['time/epoch_s']:.2f} s (train {e['time/train_s']:.2f} s, eval {e.get('time/eval_s', 0):.2f} s)")
    return {
        "config": config.to_dict(),
        "batch_size": config.batch_size,
        **epoch_breakdown(runs),
        "runs": [{k: v for k, v in r.items() if k != "report_times"} for r in runs],
    }


def init_ray(threads: int) -> float:
    """A fresh local Ray set up as study.launch does; returns the seconds ray.init took."""
    import ray

    started = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=max(threads, os.cpu_count() or 1),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
        runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}},
    )
    return time.perf_counter() - started


def train_ray(config, data_root: str | None, threads: int, storage: Path, name: str) -> dict[str, Any]:
    """One trial of ``train_dml`` through Tune on the running Ray; driver-side times of each report."""
    from ray import tune

    from trainables.dml import train_dml

    class Timer(tune.Callback):
        def __init__(self) -> None:
            self.started: float | None = None
            self.results: list[tuple[float, dict[str, Any]]] = []

        def on_trial_start(self, iteration, trials, trial, **info) -> None:
            self.started = time.perf_counter()

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            keep = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.results.append((time.perf_counter(), keep))

    timer = Timer()
    trainable = tune.with_resources(tune.with_parameters(train_dml, data_root=data_root), {"cpu": threads, "gpu": 0})
    tuner = tune.Tuner(
        trainable,
        param_space=config.to_dict(),
        tune_config=tune.TuneConfig(num_samples=1),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            verbose=0,
            callbacks=[timer],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    started = time.perf_counter()
    grid = tuner.fit()
    finished = time.perf_counter()
    if grid.errors:
        raise RuntimeError(f"the Ray trial failed: {grid.errors[0]}")
    if len(timer.results) != config.epochs:
        raise RuntimeError(f"the Ray trial reported {len(timer.results)} epochs; expected {config.epochs}")
    marks = [t for t, _ in timer.results]
    epochs = [r for _, r in timer.results]
    return {
        "epochs": epochs,
        "report_times": marks,
        "tuner_fit_s": finished - started,
        "fit_to_trial_start_s": (timer.started - started) if timer.started is not None else math.nan,
        "fit_to_first_report_s": marks[0] - started,
        # the first report's step covers the trainable's setup (data, model) and epoch 1
        "trial_start_s": marks[0] - started - epochs[0]["time_this_iter_s"],
        "last_report_to_fit_end_s": finished - marks[-1],
    }


def intervals(times: list[float]) -> list[float]:
    """Wall time between consecutive reports, after the warm-up epoch (epoch k-1 -> k for k > warm-up)."""
    return [b - a for a, b in zip(times[WARMUP_EPOCHS - 1 : -1], times[WARMUP_EPOCHS:])] if WARMUP_EPOCHS else []


def median_interval(run: dict[str, Any]) -> float:
    return statistics.median(intervals(run["report_times"]) or [math.nan])


def checkpoint_cost(run, folder: Path, times: int = 5) -> dict[str, Any]:
    """Size of one checkpoint bundle and the time to build and write it (as train_dml does each epoch)."""
    from trainables.core.checkpoint import BUNDLE_NAME, save_bundle

    durations = []
    for _ in range(times):
        started = time.perf_counter()
        path = save_bundle(run.bundle(), folder / BUNDLE_NAME)
        durations.append(time.perf_counter() - started)
    return {"bundle_bytes": path.stat().st_size, "save_s": spread(durations)}


def measure_ray(config, data_root: str | None, repeats: int, threads: int, work: Path) -> dict[str, Any]:
    import ray

    direct_runs, ray_runs, inits, shutdowns = [], [], [], []
    checkpoint = None
    for repeat in range(repeats):
        print(f"[ray] repeat {repeat + 1}/{repeats}: direct fit, {config.epochs} epochs", flush=True)
        direct = train_direct(config, data_root)
        if checkpoint is None:
            checkpoint = checkpoint_cost(direct["run"], work / "bundle")
        direct.pop("run")
        direct_runs.append(direct)
        print(f"[ray] repeat {repeat + 1}/{repeats}: train_dml through Tune, {config.epochs} epochs", flush=True)
        inits.append(init_ray(threads))
        try:
            ray_runs.append(train_ray(config, data_root, threads, work / "ray", f"bench-{repeat}"))
        finally:
            started = time.perf_counter()
            ray.shutdown()
            shutdowns.append(time.perf_counter() - started)
        r = ray_runs[-1]
        print(
            f"[ray]   direct epoch {median_interval(direct):.2f} s, Ray epoch {median_interval(r):.2f} s, "
            f"Tuner.fit() to first report {r['fit_to_first_report_s']:.1f} s"
        )

    def pooled(runs, key):
        return [e.get(key, math.nan) for run in runs for e in run["epochs"][WARMUP_EPOCHS:]]

    direct_interval = spread([i for run in direct_runs for i in intervals(run["report_times"])])
    ray_interval = spread([i for run in ray_runs for i in intervals(run["report_times"])])
    direct_epoch = spread(pooled(direct_runs, "time/epoch_s"))
    ray_epoch = spread(pooled(ray_runs, "time/epoch_s"))
    ray_iter = spread(pooled(ray_runs, "time_this_iter_s"))
    # time a trial spends per epoch outside fit's epoch: checkpoint bundle, persisting it, the report round trip
    in_worker = [
        e["time_this_iter_s"] - e["time/epoch_s"] for run in ray_runs for e in run["epochs"][WARMUP_EPOCHS:] if "time_this_iter_s" in e
    ]
    per_repeat = [relative(median_interval(r), median_interval(d)) for d, r in zip(direct_runs, ray_runs)]
    overhead = relative(ray_interval["median"], direct_interval["median"])
    return {
        "config": config.to_dict(),
        "epochs_per_run": config.epochs,
        "direct": {
            "report_interval_s": direct_interval,
            "time_epoch_s": direct_epoch,
            "setup_s": spread([r["setup_s"] for r in direct_runs]),
            "total_s": spread([r["total_s"] for r in direct_runs]),
        },
        "ray": {
            "report_interval_s": ray_interval,
            "time_epoch_s": ray_epoch,
            "time_this_iter_s": ray_iter,
            "outside_epoch_s": spread(in_worker),
            "tuner_fit_s": spread([r["tuner_fit_s"] for r in ray_runs]),
        },
        "overhead": {
            "per_epoch": overhead,
            "per_epoch_by_repeat": per_repeat,
            "epoch_compute": relative(ray_epoch["median"], direct_epoch["median"]),
            "target": TARGET_OVERHEAD,
            "within_target": bool(overhead <= TARGET_OVERHEAD) if math.isfinite(overhead) else None,
        },
        "startup": {
            "ray_init_s": spread(inits),
            "fit_to_trial_start_s": spread([r["fit_to_trial_start_s"] for r in ray_runs]),
            "fit_to_first_report_s": spread([r["fit_to_first_report_s"] for r in ray_runs]),
            "trial_start_s": spread([r["trial_start_s"] for r in ray_runs]),
            "last_report_to_fit_end_s": spread([r["last_report_to_fit_end_s"] for r in ray_runs]),
            "ray_shutdown_s": spread(shutdowns),
        },
        "checkpoint": checkpoint,
        "runs": {
            "direct": direct_runs,
            "ray": ray_runs,
        },
    }


def machine(threads: int) -> dict[str, Any]:
    """The machine (bench.harness), the thread counts and the libraries' versions."""
    import numpy
    import torch

    info = {**harness.machine(), "threads": threads, "torch_threads": torch.get_num_threads(), "device": "cpu"}
    info.update(torch_interop_threads=torch.get_num_interop_threads(), torch=torch.__version__, numpy=numpy.__version__)
    info["cores_available"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for package in ("torchvision", "ray"):
        try:
            info[package] = __import__(package).__version__
        except ImportError:
            info[package] = None
    return info


def fmt(s: dict[str, Any], digits: int = 2, scale: float = 1.0) -> str:
    """'median (min-max)' of a spread."""
    if not s or not s.get("n"):
        return "-"
    if s["n"] == 1:
        return f"{s['median'] * scale:.{digits}f}"
    return f"{s['median'] * scale:.{digits}f} ({s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f})"


def pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:+.1f} %"


def busy_note(report: dict[str, Any]) -> list[str]:
    """A warning (and a blank line) when other processes kept the machine busy during the measurements."""
    start, end = report["load_average"].get("start"), report["load_average"].get("end")
    own = report["settings"]["threads"]  # at the end, the benchmark's own threads are part of the load
    if not ((start and start[0] > BUSY_LOAD) or (end and end[0] > own + BUSY_LOAD)):
        return []
    loads = [x[0] for x in (start, end) if x]
    return [
        f"Warning: the machine was busy (1-minute load average up to {max(loads):.1f} on {report['machine']['cores']} cores); "
        "other processes competed for the cores, so these times are not those of a quiet machine.",
        "",
    ]


def markdown(report: dict[str, Any]) -> str:
    m, args = report["machine"], report["settings"]
    lines = [
        "## Training throughput and Ray overhead",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} torch thread(s), torch {m['torch']}, "
        f"torchvision {m['torchvision']}, ray {m['ray']}, Python {m['python']}; load average {report['load_average']['start']} "
        f"at the start, {report['load_average']['end']} at the end; {report['date']}.",
        "",
        *busy_note(report),
        f"Each run trains {args['epochs'] + WARMUP_EPOCHS} epochs and the first ({WARMUP_EPOCHS} warm-up) is left out; "
        f"{args['repeats']} run(s) per measurement. Values are medians over the measured epochs of all runs, "
        "(min-max) in brackets.",
    ]
    throughput = {k: v for k, v in report["results"].items() if k in ("small_cnn", "resnet18")}
    if throughput:
        lines += [
            "",
            "### Throughput of the core (`engine.fit`, study mode, CPU)",
            "",
            "| measurement | data | batch | images/epoch | train images/s | compute images/s "
            "| epoch s | data s | compute s | eval s | other s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in throughput.items():
            lines.append(
                f"| {name} | {r['data']} | {r['batch_size']} | {r['train_images_per_epoch']} | {fmt(r['train_images_per_s'], 0)} | "
                f"{fmt(r['compute_images_per_s'], 0)} | {fmt(r['time_epoch_s'])} | {fmt(r['time_data_s'])} | "
                f"{fmt(r['time_compute_s'])} | {fmt(r['time_eval_s'])} | {fmt(r['time_other_s'])} |"
            )
        lines += [
            "",
            "train images/s: images of an epoch / its training time (data + compute); compute images/s: images / compute alone. "
            "data: waiting for the loader (reading, decoding, augmentation, in the training process); compute: forward, "
            "backward and optimizer step; eval: embedding the validation classes and the retrieval and clustering metrics "
            "(" + ", ".join(f"{n}: {r['eval_images']} images" for n, r in throughput.items()) + "); other: the rest of the epoch.",
        ]
    ray_result = report["results"].get("ray")
    if ray_result:
        d, r, o, s, c = ray_result["direct"], ray_result["ray"], ray_result["overhead"], ray_result["startup"], ray_result["checkpoint"]
        verdict = {True: "within", False: "above", None: "not measured against"}[o["within_target"]]
        lines += [
            "",
            f"### Ray trainable overhead ({ray_result['backbone']}, {ray_result['epochs_per_run']} epochs per run)",
            "",
            "| per epoch | direct `engine.fit` | `train_dml` in Ray Tune | overhead |",
            "|---|---:|---:|---:|",
            f"| wall time between epoch reports, s | {fmt(d['report_interval_s'], 3)} | {fmt(r['report_interval_s'], 3)} | "
            f"{pct(o['per_epoch'])} |",
            f"| time_epoch_s (inside fit), s | {fmt(d['time_epoch_s'], 3)} | {fmt(r['time_epoch_s'], 3)} | {pct(o['epoch_compute'])} |",
            f"| Ray's time_this_iter_s, s | - | {fmt(r['time_this_iter_s'], 3)} | |",
            f"| trial time outside fit's epoch (checkpoint, report), s | - | {fmt(r['outside_epoch_s'], 3)} | |",
            "",
            f"Per-epoch overhead {pct(o['per_epoch'])} ({verdict} the {100 * o['target']:.0f} % target); by repeat: "
            + ", ".join(pct(x) for x in o["per_epoch_by_repeat"])
            + f". One checkpoint bundle: {c['bundle_bytes'] / 1e6:.2f} MB, built and written in {fmt(c['save_s'], 3)} s.",
            "",
            "| Ray start-up | s |",
            "|---|---:|",
            f"| ray.init (fresh local Ray) | {fmt(s['ray_init_s'])} |",
            f"| Tuner.fit() to trial start | {fmt(s['fit_to_trial_start_s'])} |",
            f"| Tuner.fit() to the first epoch report | {fmt(s['fit_to_first_report_s'])} |",
            f"| of which trial start (actor, imports; without the trainable's setup and epoch 1) | {fmt(s['trial_start_s'])} |",
            f"| last report to Tuner.fit() returning | {fmt(s['last_report_to_fit_end_s'])} |",
            f"| ray.shutdown | {fmt(s['ray_shutdown_s'])} |",
            f"| for comparison: setup of a direct fit (data, model) | {fmt(d['setup_s'])} |",
        ]
    return "\n".join(lines) + "\n"


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the same thread count everywhere: this process, its OpenMP/MKL pools and (inherited) Ray's workers
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "command": harness.command("throughput", argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "settings": {
            "epochs": args.epochs,
            "warmup_epochs": WARMUP_EPOCHS,
            "repeats": args.repeats,
            "threads": args.threads,
            "only": args.only,
            "ray_backbone": args.ray_backbone,
        },
        "machine": machine(args.threads),
        "load_average": {"start": harness.load()},
        "results": {},
    }
    epochs = args.epochs + WARMUP_EPOCHS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dml-throughput-") as tmp:
        work = Path(tmp)
        photos = None
        if "resnet18" in args.only or ("ray" in args.only and args.ray_backbone == "resnet18"):
            photos = str(write_photo_folder(work / "photos"))
        photo_data = (
            f"generated RGB folder dataset ({PHOTO_TRAIN_CLASSES} train classes x {PHOTO_PER_CLASS} PNGs of {PHOTO_SIZE} px), 64 px crops"
        )
        if "small_cnn" in args.only:
            result = measure_throughput("small_cnn", hbn_config(epochs), args.data_root, args.repeats)
            report["results"]["small_cnn"] = {"data": "Omniglot, 32 px grayscale", **result}
        if "resnet18" in args.only:
            result = measure_throughput("resnet18", resnet18_config(epochs), photos, args.repeats)
            report["results"]["resnet18"] = {"data": photo_data, **result}
        if "ray" in args.only:
            config, root = (hbn_config(epochs), args.data_root) if args.ray_backbone == "small_cnn" else (resnet18_config(epochs), photos)
            result = measure_ray(config, root, args.repeats, args.threads, work)
            report["results"]["ray"] = {"backbone": args.ray_backbone, **result}
    report["load_average"]["end"] = harness.load()
    report["wall_s"] = time.perf_counter() - started
    out = Path(args.out)
    harness.write(out, json.dumps(jsonable(report), indent=1) + "\n")
    print(f"\n{harness.write(out.with_suffix('.md'), markdown(report)).read_text()}")
    print(f"wrote {out} and {out.with_suffix('.md')} ({report['wall_s']:.0f} s)")
    overhead = report["results"].get("ray", {}).get("overhead", {})
    statement = f"the Ray trainable adds at most {100 * TARGET_OVERHEAD:.0f} % to an epoch ({pct(overhead.get('per_epoch'))})"
    return harness.bound(overhead.get("within_target"), statement)


if __name__ == "__main__":
    sys.exit(main())

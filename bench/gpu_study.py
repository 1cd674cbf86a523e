"""A whole study on one GPU through Ray, then its final model, in one run.

Workload: what bench.gpu_path measures piece by piece, run the way a user runs it: ``python -m study.launch`` on a
CUB-shaped photo set (tests/photo_data.py, generated under --root) with K trials sharing the GPU
(``--gpus-per-trial 1/K --cpus-per-trial CPUs/K``), the default scheduler, the race and the MLflow records, then
``python -m study.final --study NAME`` on the same GPU. The space (``space_yaml``): the default space's two families
and batch search on photos, a fixed backbone and precision, trained from scratch (so the scores say the stack works,
not how good a CUB model gets). For each K it reports the study's own end summary (wall time, trials, epochs, its
slots' utilization, Ray's start-up), the GPU's utilization and memory as ``nvidia-smi`` samples them, epochs per
second of wall time, and the final's wall time and test metrics.

Question: what do a study's overheads (trial start-up, the driver, the records) leave of the GPU's throughput, and
does packing trials on the GPU pay in a whole study?

Bound: every study and final ends with exit status 0, and with K = 1 in ``--pack`` beside larger K, each packed study
trains more epochs per second than one trial at a time.

  python -m bench.gpu_study --root /tmp/gpu_photos --work /tmp/gpu_study --out docs/bench/gpu_study.json \\
      --markdown docs/bench/gpu_study.md
  python -m bench.gpu_study --root /tmp/gs --work /tmp/gsw --scale 0.1 --backbone resnet18 --image-size 64 \\
      --max-classes 6 --trials 2 --epochs 2 --allow-cpu        # a quick look on a machine without a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench import harness
from bench.gpu_path import GpuSampler, environment

SUMMARY = re.compile(r"finished in (?P<wall>\d+) s: (?P<trials>\d+) trials, .* (?P<epochs>\d+) epochs trained")
UTILIZATION = re.compile(r"utilization (?P<util>[\d.]+): .* x (?P<slots>\d+) slots\); Ray start-up (?P<startup>[\d.]+) s")
TEST = re.compile(r"^\s+test_(?P<name>recall_at_1|map_at_r)\s+(?P<value>[\d.]+)", re.MULTILINE)
SEED_TIME = re.compile(r"time per seed\s+(?P<s>[\d.]+) s")


def space_yaml(args: argparse.Namespace) -> dict:
    """The default space's families on photos: heated-up softmax (alpha, heating, normalization) and ICE (scale s), with C x k
    and the learning rate; dataset, backbone, precision and the budget fixed."""
    third = max(1, args.max_classes // 3)
    return {
        "description": "bench.gpu_study: both families on CUB-shaped photos, one GPU",
        "final_budget_factor": 1,
        "fixed": {
            "dataset": "cub200",
            "val_split": "classes",
            "backbone": args.backbone,
            "image_size": args.image_size,
            "precision": args.precision,
            "optimizer": "adam",
            "embedding_dim": 512,
            "epochs": args.epochs,
            "heating_start": 0.75,
            "heating_lr_factor": 0.1,
            "lr_decay_start": 0.75,
        },  # fmt: skip
        "params": {
            "loss": {"type": "categorical", "choices": ["softmax", "ice"]},
            "alpha": {"type": "float", "low": 2, "high": 64, "log": True, "when": {"loss": "softmax"}},
            "heating": {"type": "categorical", "choices": ["none", "two_stage"], "when": {"loss": "softmax"}},
            "heating_target": {
                "type": "float",
                "low": 1,
                "high": {"param": "alpha"},
                "log": True,
                "when": {"loss": "softmax", "heating": ["two_stage"]},
            },
            "normalization": {"type": "categorical", "choices": ["l2", "bn"], "when": {"loss": "softmax"}},
            "ice_scale": {"type": "float", "low": 4, "high": 128, "log": True, "when": {"loss": "ice"}},
            "classes_per_batch": {"type": "int", "low": third, "high": 3 * third, "step": third},
            "samples_per_class": {"type": "categorical", "choices": [2, 3, 4]},
            "lr": {"type": "float", "low": 0.0001, "high": 0.003, "log": True},
        },
    }


def run_logged(command: list[str], cwd: Path, log: Path) -> tuple[int, float, str]:
    """Run ``command`` in ``cwd`` with its output in ``log``: (exit status, wall seconds, output)."""
    started = time.perf_counter()
    with log.open("w") as out:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(harness.ROOT)}  # this checkout's study and core
        code = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    return code, time.perf_counter() - started, log.read_text()


def study_row(args: argparse.Namespace, packed: int, work: Path) -> dict:
    """One study with ``packed`` trials per GPU, then its final model; the summaries and the GPU's samples."""
    cpus = max(1, (os.cpu_count() or 1) // packed)
    name = f"gpu-k{packed}"
    space = work / "space.yaml"
    space.write_text(yaml.safe_dump(space_yaml(args), sort_keys=False))
    launch = [sys.executable, "-m", "study.launch", "--space", str(space), "--data-root", args.root, "--study-name", name,
              "--num-samples", str(args.trials), "--cpus-per-trial", str(cpus), "--seed", "0"]  # fmt: skip
    launch += ["--gpus-per-trial", f"{1 / packed:g}"] if not args.allow_cpu else ["--ray-cpus", str(cpus * packed)]
    with GpuSampler() as gpu:
        code, wall, output = run_logged(launch, work, Path(args.log_dir) / f"{name}.log")
    whole = {k: v for k, v in gpu.summary(0, 0).items() if k in ("util_mean", "util_samples", "mem_max_mib")}  # no steady window
    row = {"packed": packed, "cpus_per_trial": cpus, "launch_exit": code, "launch_s": wall, **whole}
    if (summary := SUMMARY.search(output)) is not None:
        row.update({k: int(v) for k, v in summary.groupdict().items()})
        row["epochs_per_s"] = row["epochs"] / max(row["wall"], 1)
    if (util := UTILIZATION.search(output)) is not None:
        row.update(slot_utilization=float(util["util"]), slots=int(util["slots"]), ray_startup_s=float(util["startup"]))
    if code != 0 or args.final_seeds == 0:
        return row
    final = [sys.executable, "-m", "study.final", "--study", name, "--seeds", str(args.final_seeds)]
    with GpuSampler() as gpu:
        code, wall, output = run_logged(final, work, Path(args.log_dir) / f"{name}-final.log")
    row.update(final_exit=code, final_s=wall, final_util_mean=gpu.summary(0, 0)["util_mean"])
    row.update({f"test_{m['name']}": float(m["value"]) for m in TEST.finditer(output)})
    if (seed := SEED_TIME.search(output)) is not None:
        row["final_seed_s"] = float(seed["s"])
    return row


def markdown(report: dict) -> str:
    env, cell = report["environment"], harness.cell
    header = ["trials per GPU", "CPUs each", "trials", "epochs trained", "command s", "study s", "epochs/s of the study", "slots busy",
              "GPU busy", "GPU MiB max", "Ray start-up s", "final s (seeds)", "final GPU busy", "test R@1"]  # fmt: skip
    rows = []
    for r in report["studies"]:
        final = f"{r['final_s']:.0f} ({report['args']['final_seeds']})" if "final_s" in r else "-"
        rows.append((r["packed"], r["cpus_per_trial"], r.get("trials", "-"), r.get("epochs", "-"), f"{r['launch_s']:.0f}",
                     r.get("wall", "-"), f"{r.get('epochs_per_s', 0):.2f}", f"{r.get('slot_utilization', 0):.2f}",
                     cell(r["util_mean"], ".0f", " %"), cell(r["mem_max_mib"], ",.0f"), f"{r.get('ray_startup_s', 0):.1f}", final,
                     cell(r.get("final_util_mean"), ".0f", " %"), cell(r.get("test_recall_at_1"), ".3f")))  # fmt: skip
    lines = [f"A study on {env['gpu']} ({env['cpus']} CPUs, torch {env['torch']}), {report['data']}.", "", *harness.table(header, rows)]
    return "\n".join(lines) + "\n"


def bound(studies: list[dict]) -> int:
    """Every command ended with 0, and each packed study beat K = 1's epochs per second when K = 1 ran."""
    ended = all(r["launch_exit"] == 0 and r.get("final_exit", 0) == 0 for r in studies)
    one = next((r.get("epochs_per_s", 0) for r in studies if r["packed"] == 1), None)
    faster = [r.get("epochs_per_s", 0) > one for r in studies if r["packed"] > 1] if one is not None else []
    rates = ", ".join(f"K = {r['packed']}: {r.get('epochs_per_s', 0):.2f}" for r in studies)
    faster_than_one = ", each packed study faster than K = 1" if one is not None else ""
    return harness.bound(ended and all(faster), f"every command exits 0{faster_than_one} (epochs/s {rates})")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    from tests.photo_data import make_cub

    if not torch.cuda.is_available() and not args.allow_cpu:
        raise SystemExit("bench.gpu_study: no CUDA device; this bench measures a study on a GPU (--allow-cpu for a look)")
    started = time.perf_counter()
    make_cub(Path(args.root), scale=args.scale, workers=os.cpu_count() or 1)
    report = {"environment": environment(), "args": vars(args), "studies": [], "data_s": time.perf_counter() - started}
    report["data"] = (
        f"CUB-shaped, {args.scale:g} x 11,788 images, {args.backbone} {args.precision}, {args.trials} trials of up to {args.epochs} epochs"
    )
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    for packed in args.pack:
        work = Path(args.work) / f"k{packed}"
        work.mkdir(parents=True, exist_ok=True)
        report["studies"].append(study_row(args, packed, work))
        print(json.dumps(report["studies"][-1]), flush=True)
        if args.out:
            harness.write(args.out, json.dumps(report, indent=1) + "\n")
        if args.markdown:
            harness.write(args.markdown, markdown(report))
    print(markdown(report))
    return bound(report["studies"])


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_study", description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="where the CUB-shaped set is generated (once) and its cache kept")
    parser.add_argument("--work", required=True, help="folder of the studies' runs/ (one sub-folder per K)")
    parser.add_argument("--log-dir", default=None, help="where each command's output is kept (default: --work)")
    parser.add_argument("--scale", type=float, default=1.0, help="of CUB's 11,788 images (default: the full count)")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--image-size", type=int, default=0, help="0: the dataset's default (224 for photos)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a look at the bench itself)")
    parser.add_argument("--out")
    parser.add_argument("--markdown")
    parser.add_argument("--max-classes", type=int, default=60, help="C searched in thirds of it (default: 20, 40, 60)")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--pack", type=int, nargs="+", default=[4], help="trials per GPU, one study each (default: 4)")
    parser.add_argument("--final-seeds", type=int, default=3, help="seeds of study.final (0: no final model)")
    args = parser.parse_args(argv)
    args.log_dir = args.log_dir or args.work
    return args


if __name__ == "__main__":
    sys.exit(main())

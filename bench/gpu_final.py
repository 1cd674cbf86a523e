"""python bench/gpu_final.py: ``study.final --seeds S`` on one GPU host, one seed after another against all at once.

On a machine with one GPU and no ``--address``, study.final trains a configuration's seeds one after another in
its own process (study/seeds.py, ``local_placement``). A local Ray (``ray start --head`` with the host's CPUs and
its one GPU) and ``study.final --address ... --gpus-per-trial 1/S --cpus-per-trial CPUs/S`` place the S seeds on
the GPU at once instead, as the cluster path does. This bench runs both, one after the other, on a CUB-shaped
photo set (bench/photo_data.py, generated under --root, its decoded cache built before either), with the same
fixed configuration, and reports for each:

- the command's wall time (the local Ray's start reported apart, not in it);
- the GPU's mean utilization and peak memory over the command (``nvidia-smi`` samples);
- the seeds' mean test R@1 and MAP@R, so that the two are seen to train the same models' kind.

The configuration is a fixed ResNet-50 ICE model (``config_yaml``), trained from scratch (no weights can be
downloaded on a machine without internet). Needs what the project installs; Ray, MLflow and faiss importable.

  python bench/gpu_final.py --root /tmp/gpu_photos --work /tmp/gpu_final --seeds 3 --epochs 3 \\
      --out docs/bench/gpu_final.json --markdown docs/bench/gpu_final.md
  python bench/gpu_final.py --root /tmp/gf --work /tmp/gfw --scale 0.05 --backbone resnet18 --image-size 64 \\
      --classes 4 --epochs 1 --allow-cpu          # a look at the bench itself on a machine without a GPU (on 2+
                                                  # cores the CPU default trains the seeds at once: the labels are a GPU host's)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_path import GpuSampler, environment  # noqa: E402
from bench.gpu_study import TEST, fmt, parse_photo_bench, photo_bench_parser, run_logged  # noqa: E402
from bench.photo_data import make_cub  # noqa: E402

RAY_PORT = 6391


def config_yaml(args: argparse.Namespace) -> dict:
    """The configuration every variant retrains: ICE (s = 16) on ResNet-50 features, C x k = classes x 3."""
    return {"dataset": "cub200", "backbone": args.backbone, "precision": args.precision, "image_size": args.image_size,
            "loss": "ice", "ice_scale": 16.0, "classes_per_batch": args.classes, "samples_per_class": 3,
            "embedding_dim": 512, "optimizer": "adam", "lr": 0.0003, "epochs": args.epochs, "seed": 0}  # fmt: skip


def build_cache(root: str, image_size: int) -> float:
    """The node's decoded cache of the set, built before the variants so that neither pays for it; seconds taken."""
    from trainables.core.cache import attach_cache
    from trainables.core.data import image_size_for, load_dataset

    started = time.perf_counter()
    splits = load_dataset("cub200", root, image_size)
    attach_cache(splits, image_size_for("cub200", image_size), root, workers=os.cpu_count() or 1)
    return time.perf_counter() - started


def ray_cli(*words: str) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", *words]


def variant(args: argparse.Namespace, work: Path, together: bool) -> dict:
    """One ``study.final`` of the configuration: one seed after another in the command (``together`` False), or
    every seed a task of a local Ray holding 1/S of the GPU and of the CPUs. The command names the local Ray as
    ``auto``, as a user on a head node would: Ray reads its cluster's auth token for ``auto``, not for HOST:PORT."""
    name = "together" if together else "one_after_another"
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "final.yaml"
    config.write_text(yaml.safe_dump(config_yaml(args), sort_keys=False))
    command = [sys.executable, "-m", "study.final", "--config", str(config), "--seeds", str(args.seeds), "--data-root", args.root]
    row: dict = {"variant": name, "seeds": args.seeds}
    if together:
        cpus = max(1, (os.cpu_count() or 1) // args.seeds)
        gpus = 0 if args.allow_cpu else 1
        start = ray_cli("start", "--head", "--port", str(RAY_PORT), "--num-cpus", str(cpus * args.seeds), "--num-gpus", str(gpus),
                        "--include-dashboard=false", "--disable-usage-stats")  # fmt: skip
        began = time.perf_counter()
        subprocess.run(start, cwd=folder, check=True, stdout=subprocess.DEVNULL)
        row["ray_start_s"] = time.perf_counter() - began
        command += ["--address", "auto", "--cpus-per-trial", str(cpus), "--gpus-per-trial", f"{gpus / args.seeds:.4f}"]
        row.update(cpus_per_seed=cpus, gpus_per_seed=round(gpus / args.seeds, 4))
    elif args.allow_cpu:
        command += ["--device", "cpu"]
    try:
        with GpuSampler() as gpu:
            code, wall, output = run_logged(command, folder, Path(args.log_dir) / f"final-{name}.log")
    finally:
        if together:
            subprocess.run(ray_cli("stop", "--force"), cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    whole = gpu.summary(0, 0)
    row.update(exit=code, wall_s=wall, util_mean=whole["util_mean"], mem_max_mib=whole["mem_max_mib"])
    row.update({f"test_{m['name']}": float(m["value"]) for m in TEST.finditer(output)})
    return row


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"study.final --seeds {report['args']['seeds']} on {env['gpu']} ({env['cpus']} CPUs, torch {env['torch']}), {report['data']}.",
             "", "| seeds | wall s | against one after another | GPU busy | GPU MiB max | test R@1 | MAP@R |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    base = next((r["wall_s"] for r in report["variants"] if r["variant"] == "one_after_another"), None)
    for r in report["variants"]:
        label = "one after another (this host's default)" if r["variant"] == "one_after_another" else (
            f"all at once, local Ray ({r['cpus_per_seed']} CPUs, {r['gpus_per_seed']:g} GPU each; its start {r['ray_start_s']:.1f} s apart)"
        )  # fmt: skip
        ratio = f"{r['wall_s'] / base:.2f}x" if base else "-"
        lines.append(f"| {label} | {r['wall_s']:.0f} | {ratio} | {fmt(r['util_mean'], '.0f', ' %')} | {fmt(r['mem_max_mib'], ',.0f')} "
                     f"| {fmt(r.get('test_recall_at_1'), '.4f')} | {fmt(r.get('test_map_at_r'), '.4f')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        raise SystemExit("bench/gpu_final.py: no CUDA device; this bench measures study.final on a GPU (--allow-cpu for a look)")
    make_cub(Path(args.root), scale=args.scale, workers=os.cpu_count() or 1)
    report = {"environment": environment(), "args": vars(args), "variants": [], "cache_s": build_cache(args.root, args.image_size)}
    report["data"] = f"CUB-shaped, {args.scale:g} x 11,788 images, {args.backbone} {args.precision}, {args.epochs} epochs a seed"
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    for together in args.order:
        report["variants"].append(variant(args, Path(args.work), together == "together"))
        print(json.dumps(report["variants"][-1]), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        if args.markdown:
            Path(args.markdown).write_text(markdown(report))
    print(markdown(report))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = photo_bench_parser(__doc__.splitlines()[0], "folder of the variants' runs/ (one sub-folder each)")
    parser.add_argument("--classes", type=int, default=40, help="C of the batches (default: 40)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--order", nargs="+", choices=["alone", "together"], default=["alone", "together"],
                        help="the variants in the order they run: alone = one seed after another (default: alone together)")  # fmt: skip
    return parse_photo_bench(parser, argv)


if __name__ == "__main__":
    main()

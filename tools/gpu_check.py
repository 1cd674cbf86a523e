"""A preset's short study on one GPU, packed 1, 2 and 4 trials to the GPU: what a machine with a GPU gives each trial.

Workload: a photo set of the preset's layout and shape (tests/photo_data.py, generated once under --root at --scale
of the real counts), and for each K of ``--pack`` one ``python -m study.launch`` of the preset (search_spaces/NAME.yaml:
its backbone, precision, crop, families and ranges) with ``--gpus-per-trial 1/K --cpus-per-trial CPUs/K``, --trials
trials of --epochs epochs, C's range cut to the set's fit classes, no race. What changes from the preset: the epochs,
C's upper end, and the ImageNet weights (``--weights none`` by default: the speed is the same, and a machine without
the internet has none). ``--cpu`` skips the GPU parts: small_cnn from scratch at 32 px on a local Ray of this
machine's CPUs, no nvidia-smi, so a test runs the check on any machine.

Output, one row per K (printed, and with ``--out`` / ``--markdown`` as JSON and a Markdown table):

- ``trials per GPU`` K, ``CPUs each``, ``trials`` and ``epochs trained`` as the study's summary prints them, ``study s``;
- ``images/s per trial``: each trial's training images over its epochs' ``time/train_s`` (MLflow), the median of the
  trials, and ``images/s, K trials``: K times it, what the GPU trains in all while K trials run;
- ``GPU busy`` (nvidia-smi's utilization, the mean over the study) and ``GPU MiB max`` (its memory used, the peak).

Question: how fast does a preset train on this GPU, one trial at a time and packed, and how much of the GPU does it
use? Bound: every study exits 0 and every trial reports a training time.

  python -m tools.gpu_check --preset cub200 --root /tmp/gc_data --work /tmp/gc --out gpu_check.json --markdown gpu_check.md
  python -m tools.gpu_check --preset sop --root /tmp/gc --work /tmp/gcw --cpu --scale 0.0016 --pack 1 2 --trials 2 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import yaml

from bench import harness

HEADER = ["trials per GPU", "CPUs each", "trials", "epochs trained", "study s", "images/s per trial", "images/s, K trials",
          "GPU busy", "GPU MiB max"]  # fmt: skip


def check_space(args: argparse.Namespace, fit_classes: int) -> dict:
    """The preset with the check's changes: --epochs, C cut to ``fit_classes``, the weights; with --cpu a small model."""
    from study.search.spaces import SHIPPED

    data = yaml.safe_load((SHIPPED / f"{args.preset}.yaml").read_text())
    fixed = data["fixed"]
    fixed.update(epochs=args.epochs, pretrained=args.weights if not args.cpu else "none")
    if args.cpu:
        fixed.update(backbone="small_cnn", image_size=32)
    c = data["params"]["classes_per_batch"]
    high = min(c["high"], fit_classes)
    if high >= c["low"]:  # the preset's range and step, cut at the fit classes
        c = {**c, "high": c["low"] + (high - c["low"]) // c["step"] * c["step"]}
    else:  # fewer fit classes than the preset's smallest C
        c = {"type": "int", "low": max(2, high // 2), "high": high}
    data["params"]["classes_per_batch"] = c
    data["description"] = f"tools.gpu_check: {args.preset} on a generated set"
    return data


def fit_images(preset: str, root: str) -> dict[str, int]:
    """The generated set's fit classes and images at the preset's validation split."""
    from study.search.spaces import load_space
    from trainables.core.data import load_dataset, validation_split

    fixed = load_space(preset).fixed
    train = load_dataset(preset, root).train
    fit, _ = validation_split(train, fixed.get("val_split", "classes"), fixed["val_fraction"], preset)
    return {"classes": len(fit), "images": len(train.with_classes(fit))}


def trial_rates(runs: Path, study: str, images: int) -> list[float]:
    """Each trial's training images per second of ``time/train_s``: an epoch trains (images // C k) batches of C x k."""
    import mlflow

    from study.records.utilization import every_epoch

    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    rates = []
    for run in client.search_runs(experiments, f"tags.study_name = '{study}' and tags.kind = 'trial'"):
        batch = int(run.data.params["classes_per_batch"]) * int(run.data.params["samples_per_class"])
        seconds = [m.value for m in every_epoch(client, run.info.run_id, "time/train_s")]
        if seconds:
            rates.append(len(seconds) * max(1, images // batch) * batch / sum(seconds))
    return rates


def study_row(args: argparse.Namespace, packed: int, space: dict, images: int) -> dict:
    """One study of the preset with ``packed`` trials per GPU: its summary, its trials' images/s, the GPU's samples."""
    from bench.gpu_study import SUMMARY, run_logged

    cpus = max(1, (os.cpu_count() or 1) // packed) if not args.cpus else args.cpus
    work = Path(args.work) / f"k{packed}"
    work.mkdir(parents=True, exist_ok=True)
    path = work / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    name = f"check-{args.preset}-k{packed}"
    launch = [sys.executable, "-m", "study.launch", "--space", str(path), "--data-root", args.root, "--study-name", name,
              "--num-samples", str(args.trials), "--cpus-per-trial", str(cpus), "--seed", "0", "--confirm-budget", "0",
              "--tracking-uri", f"sqlite:///{work / 'runs' / 'mlflow.db'}"]  # fmt: skip  # where trial_rates reads, whatever the env says
    launch += ["--ray-cpus", str(cpus * packed), "--ray-gpus", "0"] if args.cpu else ["--gpus-per-trial", f"{1 / packed:g}"]
    if args.cpu:
        code, wall, output = run_logged(launch, work, work / f"{name}.log")
        gpu = {"util_mean": None, "mem_max_mib": None}
    else:
        from bench.gpu_path import GpuSampler

        with GpuSampler() as sampler:
            code, wall, output = run_logged(launch, work, work / f"{name}.log")
        gpu = {k: v for k, v in sampler.summary(0, 0).items() if k in ("util_mean", "mem_max_mib")}
    rates = trial_rates(work / "runs", name, images) if code == 0 else []
    row = {"packed": packed, "cpus_per_trial": cpus, "exit": code, "command_s": wall, "trial_rates": rates, **gpu}
    row["per_trial"] = statistics.median(rates) if rates else None
    row["all_trials"] = packed * row["per_trial"] if rates else None
    if (summary := SUMMARY.search(output)) is not None:
        row.update({k: int(v) for k, v in summary.groupdict().items()})
    return row


def markdown(report: dict) -> str:
    cell = harness.cell
    rows = [
        (r["packed"], r["cpus_per_trial"], r.get("trials", "-"), r.get("epochs", "-"), r.get("wall", "-"), cell(r["per_trial"], ",.0f"),
         cell(r["all_trials"], ",.0f"), cell(r["util_mean"], ".0f", " %"), cell(r["mem_max_mib"], ",.0f"))
        for r in report["studies"]
    ]  # fmt: skip
    return "\n".join([report["title"], "", *harness.table(HEADER, rows)]) + "\n"


def bound(studies: list[dict]) -> int:
    held = all(r["exit"] == 0 and r["trial_rates"] and all(rate > 0 for rate in r["trial_rates"]) for r in studies)
    return harness.bound(held, "every study exits 0 and every trial reports a training time")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from tests.photo_data import MAKERS

    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("tools.gpu_check: no CUDA device; --cpu runs the check without the GPU parts")
        gpu_name = torch.cuda.get_device_name()
    started = time.perf_counter()
    if not (Path(args.root) / ".gpu_check_done").is_file():
        MAKERS[args.preset](Path(args.root), scale=args.scale, size_scale=args.size_scale, workers=os.cpu_count() or 1)
        (Path(args.root) / ".gpu_check_done").write_text(args.preset)
    fit = fit_images(args.preset, args.root)
    space = check_space(args, fit["classes"])
    device = "the CPU (--cpu: small_cnn at 32 px)" if args.cpu else gpu_name
    fixed = space["fixed"]
    title = (
        f"tools.gpu_check of {args.preset} on {device}, {harness.machine_line()}: {fixed['backbone']} {fixed['precision']} at "
        f"{fixed['image_size']} px, {fit['images']:,} fit images of {fit['classes']} classes, {args.trials} trials of {args.epochs} epochs"
    )
    command = f"python -m tools.gpu_check {shlex.join(argv or sys.argv[1:])}".rstrip()
    report = {"title": title, "command": command, "machine": harness.machine(),
              "args": vars(args), "fit": fit, "space": space, "studies": [], "data_s": time.perf_counter() - started}  # fmt: skip
    for packed in args.pack:
        report["studies"].append(study_row(args, packed, space, fit["images"]))
        print(json.dumps(report["studies"][-1]), flush=True)
        if args.out:
            harness.write(args.out, json.dumps(report, indent=1) + "\n")
        if args.markdown:
            harness.write(args.markdown, markdown(report))
    print(markdown(report))
    return bound(report["studies"])


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cub200", choices=["cub200", "cars196", "sop", "inshop"])
    parser.add_argument("--root", required=True, help="where the photo set is generated (once) and its decoded cache kept")
    parser.add_argument("--work", required=True, help="folder of the studies' runs/ (one sub-folder per K)")
    parser.add_argument("--scale", type=float, default=0.1, help="of the real image and class counts (default 0.1)")
    parser.add_argument("--size-scale", type=float, default=1.0, help="of the real image sizes (default 1)")
    parser.add_argument("--pack", type=int, nargs="+", default=[1, 2, 4], help="trials per GPU, one study each (default 1 2 4)")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=0, help="CPUs a trial (default: this machine's / K)")
    parser.add_argument("--weights", default="none", choices=["none", "imagenet"], help="the backbone's start (default none)")
    parser.add_argument("--cpu", action="store_true", help="no GPU parts: small_cnn at 32 px on the CPUs, no nvidia-smi")
    parser.add_argument("--out")
    parser.add_argument("--markdown")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())

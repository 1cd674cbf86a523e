"""The CUDA path of the training core on one GPU, piece by piece, in one run.

Workload: a CUB-shaped photo set (tests/photo_data.py, generated under --root; 224 px crops, batches of C x k,
ResNet-50 and GoogLeNet from scratch, ICE), or with ``--config`` a training config's own dataset and backbone:

- **step**: ``engine.train_one_epoch`` over batches already on the GPU (the decoded cache's uint8 batches, normalized
  there), per backbone and precision (fp32, bf16, fp16): images/s of the model's compute alone, peak GPU memory;
- **fit**: ``engine.fit`` in study mode as a trial runs it (the node's decoded cache, or the PIL path with the cache
  off; the DataLoader workers of ``engine.loader_workers``), per precision: train images/s of the epochs after the
  first, the share of the epoch spent waiting for the loader, the evaluation's seconds, and the GPU's utilization as
  ``nvidia-smi`` samples it;
- **pack**: K such fits at once on the GPU, each with 1/K of the CPUs (what ``--gpus-per-trial 1/K`` places on one
  GPU). The processes wait for each other after their first epoch, so the later epochs all overlap: "all at once" is
  their images over the wall time from that barrier to the last end (evaluations included).

Each fit is a process of its own (``--child``), as a trial is; results are written after every stage, so a run cut
short keeps what it measured. ``--baseline CHECKOUT`` trains the fits with that checkout's core instead, alternating.

Question: does the loader feed the GPU, and does packing trials on one GPU buy throughput?

Bound: the decoded cache's fit trains more images/s than the PIL path's at each precision both measured, and K packed
fits train more images/s all at once than one fit alone (what ``--gpus-per-trial 1/K`` rests on).

  python -m bench.gpu_path --root /tmp/gpu_photos --out docs/bench/gpu_path.json --markdown docs/bench/gpu_path.md
  python -m bench.gpu_path --root /tmp/gp --scale 0.05 --backbones resnet18 --epochs 2 --pack 1 2   # a quick look
  python -m bench.gpu_path --root ../shared/data --config configs/omniglot_hbn.yaml --backbones small_cnn \\
      --precisions fp32 bf16 --pack 4 8 16 --epochs 4     # the default study's model: characters at 32 px
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import yaml

from bench import harness
from trainables.core import engine
from trainables.core.config import TrainConfig
from trainables.core.data import load_dataset
from trainables.core.transforms import image_dataset


def config_fields(path: str) -> dict:
    """The keys of a training config file."""
    return yaml.safe_load(Path(path).read_text())


def config_of(args: argparse.Namespace, backbone: str, precision: str) -> TrainConfig:
    """The photo set's ICE config, or ``--config``'s own (its dataset and batch) at ``precision``, with ``backbone``
    (``parse``: the config's own unless --backbones / --backbone name others)."""
    if args.config:
        fields = {**config_fields(args.config), "backbone": backbone, "precision": precision, "epochs": args.epochs}
        return TrainConfig.from_dict(fields, source=args.config)
    return TrainConfig.from_dict(
        {
            "dataset": "cub200",
            "backbone": backbone,
            "precision": precision,
            "loss": "ice",
            "classes_per_batch": args.classes,
            "samples_per_class": args.per_class,
            "embedding_dim": 512,
            "epochs": args.epochs,
            "seed": 0,
        },
        source="bench.gpu_path",
    )


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def gpu_batches(run: engine.Run, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` training batches of ``run`` as the loader makes them, moved to its device once."""
    label_index = {c: i for i, c in enumerate(run.classes)}
    dataset, collate = image_dataset(run.train_set, run.image_size, run.config.augment, label_index)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=run.sampler, collate_fn=collate)
    batches = []
    for images, labels in loader:
        batches.append((images.to(run.device), labels.to(run.device)))
        if len(batches) == count:
            return batches
    return batches * (count // max(len(batches), 1) + 1)


def step_rate(args: argparse.Namespace, backbone: str, precision: str) -> dict:
    """Images/s of ``engine.train_one_epoch`` over batches on the GPU (no loader), after one warm-up pass."""
    run = engine.build_run(config_of(args, backbone, precision), data_root=args.root)
    batches = gpu_batches(run, args.steps)
    kwargs = {"plan": run.plan, "scaler": run.scaler, "kind": run.train_set.kind}
    engine.train_one_epoch(run.model, run.loss_fn, run.optimizer, batches[:3], run.device, **kwargs)
    synchronize()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    engine.train_one_epoch(run.model, run.loss_fn, run.optimizer, batches, run.device, **kwargs)
    synchronize()
    seconds = time.perf_counter() - started
    images = sum(len(labels) for _, labels in batches)
    return {"backbone": backbone, "precision": precision, "images_per_s": images / seconds, "steps": len(batches),
            "peak_gib": peak_gib()}  # fmt: skip


def child_fit(args: argparse.Namespace) -> dict:
    """One ``engine.fit`` (a trial's training), with per-epoch wall times; run in its own process."""
    torch.set_num_threads(args.threads)
    epochs: list[dict] = []

    def on_epoch(epoch: int, metrics: dict[str, float], run: engine.Run) -> None:
        images = len(run.sampler) * run.config.classes_per_batch * run.config.samples_per_class
        epochs.append({"end": time.time(), "images": images, **{k: metrics[k] for k in metrics if k.startswith("time/")}})
        if epoch == 1 and args.barrier:
            wait_at_barrier(Path(args.barrier), args.rank)

    config = config_of(args, args.fit_backbone, args.precision)
    splits = load_dataset(config.dataset, args.root)
    run = engine.fit(config, on_epoch, data_root=args.root, splits=splits, device=torch.device(args.device))
    steady = epochs[1:] or epochs
    rates = [e["images"] / e["time/train_s"] for e in steady]
    return {
        "images_per_s": statistics.median(rates),
        "data_share": sum(e["time/data_s"] for e in steady) / sum(e["time/train_s"] for e in steady),
        "eval_s": epochs[-1].get("time/eval_s"),
        "workers": engine.loader_workers(None, run.train_set, run.device, engine.trial_cpus()),
        "peak_gib": peak_gib(),
        "epochs": epochs,
        "val_recall_at_1": run.metrics.get("val_recall_at_1"),
        "engine": engine.__file__,  # which checkout's core trained
    }


def wait_at_barrier(folder: Path, rank: int, timeout_s: float = 900) -> None:
    """Say this process finished its first epoch (``ready-RANK``), then wait for the parent's ``go``: the epochs
    after it overlap in every process, so their sum is the GPU's throughput with all of them on it."""
    (folder / f"ready-{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{folder}: no 'go' within {timeout_s} s")
        time.sleep(0.02)


def release(folder: Path, copies: int, children: list[subprocess.Popen]) -> float | None:
    """Wait until every child is ready (or one has ended), then write ``go``; the time it was written."""
    while len(list(folder.glob("ready-*"))) < copies:
        if any(child.poll() is not None for child in children):
            return None
        time.sleep(0.02)
    (folder / "go").touch()
    return time.time()


class GpuSampler:
    """``nvidia-smi``'s utilization (%) and memory used (MiB), sampled every 0.2 s while the block runs."""

    def __enter__(self) -> GpuSampler:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "200"]
        self.lines: list[str] = []
        try:
            self.process = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)
        except FileNotFoundError:  # no nvidia-smi: no samples
            self.process = subprocess.Popen(["true"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=lambda: self.lines.extend((time.time(), line) for line in self.process.stdout), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.thread.join(timeout=5)

    def summary(self, start: float, end: float) -> dict:
        """Over the whole block, and between ``start`` and ``end`` (time.time(): while every child trained past its
        first epoch)."""
        samples = [(t, *(float(v) for v in line.split(","))) for t, line in self.lines if line.count(",") == 1]
        steady = [u for t, u, _ in samples if start <= t <= end]
        return {"util_mean": statistics.fmean(u for _, u, _ in samples) if samples else None, "util_samples": len(samples),
                "util_steady": statistics.fmean(steady) if steady else None, "steady_samples": len(steady),
                "mem_max_mib": max((m for _, _, m in samples), default=None)}  # fmt: skip


def child_command(args: argparse.Namespace, precision: str, threads: int) -> list[str]:
    command = [sys.executable, "-m", "bench.gpu_path", "--child", "--root", args.root, "--backbone", args.fit_backbone]
    command += ["--precision", precision, "--threads", str(threads), "--epochs", str(args.epochs), "--classes", str(args.classes)]
    return command + ["--per-class", str(args.per_class), "--device", args.device] + (["--config", args.config] if args.config else [])


def fits(args: argparse.Namespace, precision: str, cached: bool, copies: int, code: str | None = None) -> dict:
    """``copies`` child fits at once, each with the machine's CPUs / copies; their results and the GPU's samples.
    ``code``: a checkout whose training core the children import first (``PYTHONPATH``, the working folder not put
    before it) instead of this one's."""
    threads = max(1, (os.cpu_count() or 1) // copies)
    env = {**os.environ, "DML_CACHE_MAX_GB": os.environ.get("DML_CACHE_MAX_GB", "64") if cached else "0"}
    if code:
        env.update(PYTHONPATH=os.pathsep.join([str(Path(code).resolve()), str(harness.ROOT)]), PYTHONSAFEPATH="1")
    with tempfile.TemporaryDirectory() as barrier, GpuSampler() as gpu:
        command = child_command(args, precision, threads) + ["--barrier", barrier]
        children = [subprocess.Popen(command + ["--rank", str(i)], cwd=harness.ROOT, env=env, stdout=subprocess.PIPE, text=True)
                    for i in range(copies)]  # fmt: skip
        outputs: list[str] = []
        reader = threading.Thread(target=lambda: outputs.extend(child.communicate()[0] for child in children))
        reader.start()
        go = release(Path(barrier), copies, children)
        reader.join()
    if any(child.returncode for child in children) or go is None:
        raise RuntimeError(f"a child fit failed (exit codes {[c.returncode for c in children]})")
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    if code and not all(r["engine"].startswith(str(Path(code).resolve())) for r in results):
        raise RuntimeError(f"a child trained {results[0]['engine']}, not the core of {code}")
    last = max(r["epochs"][-1]["end"] for r in results)
    together = sum(e["images"] for r in results for e in r["epochs"][1:]) / (last - go)  # every epoch after the go
    return {"precision": precision, "cached": cached, "copies": copies, "threads": threads, "code": code or "this checkout",
            "children": results, "images_per_s": sum(r["images_per_s"] for r in results), "together_images_per_s": together,
            **gpu.summary(go, min(r["epochs"][-1]["end"] for r in results))}  # fmt: skip


def save(args: argparse.Namespace, report: dict) -> None:
    if args.out:
        harness.write(args.out, json.dumps(report, indent=1) + "\n")
    if args.markdown:
        harness.write(args.markdown, markdown(report))


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"GPU path on {env['gpu']} ({env['cpus']} CPUs, torch {env['torch']}), {report['data']}.", ""]
    step = ((s["backbone"], s["precision"], f"{s['images_per_s']:,.0f}", f"{s['peak_gib']:.1f}") for s in report["step"])
    lines += harness.table(["step alone: backbone", "precision", "images/s", "peak GiB"], step)
    header = ["engine.fit: code", "images", "precision", "processes", "CPUs each", "workers each", "train images/s (sum)"]
    header += ["waiting for data", "GPU busy after epoch 1", "eval s", "epoch s", "images/s, all at once (wall)"]
    return "\n".join([*lines, "", *harness.table(header, (fit_row(f) for f in report["fit"] + report["pack"]))]) + "\n"


def fit_row(f: dict) -> tuple:
    children = f["children"]
    share = statistics.fmean(c["data_share"] for c in children)
    eval_s = statistics.fmean(c["eval_s"] or 0 for c in children)
    epoch_s = statistics.fmean(statistics.median(e["time/epoch_s"] for e in c["epochs"][1:] or c["epochs"]) for c in children)
    return (f.get("code", "this checkout"), "cache" if f["cached"] else "PIL", f["precision"], f["copies"], f["threads"],
            children[0]["workers"], f"{f['images_per_s']:,.0f}", f"{share:.0%}", harness.cell(f.get("util_steady"), ".0f", " %"),
            f"{eval_s:.2f}", f"{epoch_s:.2f}", f"{f.get('together_images_per_s', 0):,.0f}")  # fmt: skip


def bound(report: dict) -> int:
    """The bound on this run's fits: each PIL fit (train images/s) and each packed one (all at once) against the cached
    fit alone of its precision and core."""
    fits = report["fit"] + report["pack"]
    alone = {(f["precision"], f["code"]): f for f in fits if f["cached"] and f["copies"] == 1}
    checks = []
    for f in fits:
        one = alone.get((f["precision"], f["code"]))
        if one and not f["cached"]:
            rates = one["images_per_s"], f["images_per_s"]
            checks.append((rates[0] > rates[1], f"{f['precision']}: the cache {rates[0]:,.0f}, PIL {rates[1]:,.0f}"))
        elif one and f["copies"] > 1:
            rates = f["together_images_per_s"], one["together_images_per_s"]
            checks.append((rates[0] > rates[1], f"{f['precision']}: {f['copies']} packed {rates[0]:,.0f}, one {rates[1]:,.0f}"))
    held = all(ok for ok, _ in checks) if checks else None
    measured = "; ".join(text for _, text in checks)
    return harness.bound(held, f"the cache's fit faster than PIL's and K packed fits faster all at once than one ({measured})")


def environment() -> dict:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return {"gpu": gpu, "cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        print(json.dumps(child_fit(args)))
        return 0
    if not torch.cuda.is_available() and not args.allow_cpu and args.device == "cuda":
        raise SystemExit("bench.gpu_path: no CUDA device; this bench measures the GPU path")
    started = time.perf_counter()
    report = {"environment": environment(), "args": vars(args), "step": [], "fit": [], "pack": []}
    if args.config:
        config = config_of(args, args.fit_backbone, "fp32")
        batch = f"{config.classes_per_batch} x {config.samples_per_class}"
        report["data"] = f"{config.dataset} from {args.root}, {args.config}: batches of {batch}"
    else:
        from tests.photo_data import make_cub

        make_cub(Path(args.root), scale=args.scale, workers=os.cpu_count() or 1)
        report["data"] = f"CUB-shaped, {args.scale:g} x 11,788 images, batches of {args.classes} x {args.per_class}"
    report["data_s"] = time.perf_counter() - started
    for name, stage in stages(args):
        try:
            report[name].append(stage())
        except Exception as error:  # one failed stage must not cost the others' device time
            report.setdefault("errors", []).append(f"{name}: {type(error).__name__}: {error}")
            print(f"{name}: FAILED {error}", flush=True)
            continue
        report["elapsed_s"] = time.perf_counter() - started
        save(args, report)
        print(f"[{report['elapsed_s']:6.0f} s] {name}: {json.dumps(report[name][-1])[:300]}", flush=True)
    print(markdown(report))
    return bound(report)


def stages(args: argparse.Namespace):
    """(report key, thunk) in the order they run: the fits with the cache first (they build it); with --baseline,
    the pack's precision cached, alone and packed, by the baseline's core and this checkout's, alternating."""
    if args.pack_only:
        yield from (("pack", lambda k=k: fits(args, args.pack_precision, True, k)) for k in args.pack)
        return
    if args.baseline:
        for copies in (1, *args.pack):
            yield from (("fit" if copies == 1 else "pack", lambda k=copies, c=code: fits(args, args.pack_precision, True, k, c))
                        for code in (args.baseline, None))  # fmt: skip
        return
    yield from (("fit", lambda p=p: fits(args, p, True, 1)) for p in args.precisions)
    yield from (("step", lambda b=b, p=p: step_rate(args, b, p)) for b in args.backbones for p in args.precisions)
    if not args.config:  # the characters have no decoded cache to compare with
        yield from (("fit", lambda p=p: fits(args, p, False, 1)) for p in args.precisions[:2])
    yield from (("pack", lambda k=k: fits(args, args.pack_precision, True, k)) for k in args.pack if k > 1)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_path", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        required=True,
        help="where the CUB-shaped set is generated (once) and its cache kept; "
        "with --config, the data root that holds the config's dataset",
    )
    parser.add_argument(
        "--config",
        help="a training config (YAML, e.g. configs/omniglot_hbn.yaml) whose dataset, batch and backbone (unless "
        "--backbones / --backbone name others) the fits and the step train instead of the photo set's ICE config",
    )
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="where the fits train (cpu: the baseline a GPU is compared with, each process with its share of the cores)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="of CUB's 11,788 images (default: the full count)")
    parser.add_argument("--backbones", nargs="+", help="for the step alone (default: resnet50 googlenet; with --config, its own)")
    parser.add_argument("--fit-backbone", "--backbone", dest="fit_backbone", help="of the fits (default: resnet50; with --config, its own)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    parser.add_argument("--pack", type=int, nargs="+", default=[2, 4, 8], help="processes sharing the GPU")
    parser.add_argument("--pack-precision", default="bf16")
    parser.add_argument("--pack-only", action="store_true", help="only the packing, at each --pack count (1 included if given)")
    parser.add_argument("--epochs", type=int, default=3, help="of each fit; the first is left out of its rate")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of the step alone")
    parser.add_argument("--classes", type=int, default=60, help="C of the batches")
    parser.add_argument("--per-class", type=int, default=3, help="k of the batches")
    parser.add_argument("--baseline", help="a checkout whose core to compare with this one's (the fits alone, cached, --pack-precision)")
    parser.add_argument("--out", help="JSON results")
    parser.add_argument("--markdown", help="a Markdown table of the results")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to try the bench's plumbing)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="bf16", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    own = config_fields(args.config).get("backbone", TrainConfig.backbone) if args.config else None
    args.backbones = args.backbones or ([own] if own else ["resnet50", "googlenet"])
    args.fit_backbone = args.fit_backbone or own or "resnet50"
    return args


if __name__ == "__main__":
    sys.exit(main())

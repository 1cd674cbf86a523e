"""python bench/compute_bound.py: small_cnn training on Omniglot against this machine's compute bound (CPU).

Measures, for the HBN config (configs/omniglot_hbn.yaml: small_cnn, 32 px grayscale, batches
of 32 classes x 4 images, heated-up softmax):

- **FLOPs of one training step** (forward, loss, backward) on a real batch, counted by
  ``torch.utils.flop_counter.FlopCounterMode``; by operator. The optimizer step and the
  element-wise layers (batch norm, ReLU, pooling) have no FLOPs there: they are the
  memory-bound rest of the step.
- **The bound**: each convolution and linear layer of the model run alone on its own input
  shape, forward and backward (the first convolution without the input gradient, as in
  training), timed per thread count (1 and 2). Sustained FLOP/s = their FLOPs / their
  seconds; bound images/s = batch x FLOP/s / FLOPs per step. A large fp32 GEMM (1024^3)
  gives the machine's GEMM FLOP/s for reference.
- **The trainable**: ``trainables.core.engine.fit`` in study mode, a warm-up epoch and
  measured epochs per thread count, split by the engine's own timings into data, compute and
  evaluation; train images/s and compute images/s as fractions of the bound.
- **Variants of the compute step** side by side on the same pre-loaded batches (forward,
  loss, backward, Adam step): eager, channels_last, torch.compile (inductor, CPU) and both, and the engine's
  channels_last model with its blocks in the textbook order (ReLU before the pooling; the model pools first),
  per thread count, timed in interleaved rounds; compile time reported apart.

No GPU is used; on a machine without one the GPU parts of issue 12 (bf16, trials per GPU)
are not measured here.

  DML_DATA_ROOT=../shared/data python bench/compute_bound.py                 # about 6 minutes on 2 cores
  python bench/compute_bound.py --threads 1 --epochs 1 --steps 10            # a quick look

Results: docs/bench/compute_bound.json and docs/bench/compute_bound.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from study.records.utilization import epoch_times  # noqa: E402
from trainables.core import engine  # noqa: E402
from trainables.core.config import TrainConfig  # noqa: E402

HBN_CONFIG = ROOT / "configs" / "omniglot_hbn.yaml"
VARIANTS = ("eager", "channels_last", "compile", "compile+channels_last", "channels_last+relu_before_pool")


def relu_before_pool(model: nn.Module) -> nn.Module:
    """``model`` with each small_cnn block in the textbook order conv -> BN -> ReLU -> maxpool (the model pools first:
    trainables.core.models.SmallCNN), the same parameters: the order's cost side by side."""
    for features in (m for m in model.modules() if isinstance(m, nn.Sequential)):
        layers = list(features)
        for i, layer in enumerate(layers[:-1]):
            if isinstance(layer, nn.MaxPool2d) and isinstance(layers[i + 1], nn.ReLU):
                features[i], features[i + 1] = layers[i + 1], layer
    return model


def hbn_config(epochs: int) -> TrainConfig:
    return TrainConfig.from_dict({**yaml.safe_load(HBN_CONFIG.read_text()), "epochs": epochs}, source=str(HBN_CONFIG))


def real_batches(run: engine.Run, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` training batches (images (B, 1, S, S), label indices (B,)) as the engine's loader yields them."""
    from trainables.core.transforms import image_dataset

    index = {c: i for i, c in enumerate(run.classes)}
    dataset, collate = image_dataset(run.train_set, run.image_size, run.config.augment, index)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=run.sampler, collate_fn=collate)
    batches = []
    for images, labels in loader:
        batches.append((images, labels))
        if len(batches) == count:
            break
    return batches


def step(model: nn.Module, loss_fn: nn.Module, optimizer, images: torch.Tensor, labels: torch.Tensor, with_optimizer: bool = True):
    loss = loss_fn(model(images).float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if with_optimizer:
        optimizer.step()
    return loss


def step_flops(run: engine.Run, images: torch.Tensor, labels: torch.Tensor) -> tuple[int, dict[str, int]]:
    """FLOPs of forward + loss + backward on one batch, total and by operator."""
    model, loss_fn = copy.deepcopy(run.model), copy.deepcopy(run.loss_fn)
    counter = FlopCounterMode(display=False)
    with counter:
        loss = loss_fn(model(images).float(), labels)
        loss.backward()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return int(counter.get_total_flops()), by_op


def layer_inputs(model: nn.Module, images: torch.Tensor) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(name, layer, input shape) of every Conv2d and Linear layer in forward order."""
    found: list[tuple[str, nn.Module, tuple[int, ...]]] = []
    hooks = [
        module.register_forward_hook(lambda m, args, out, name=name: found.append((name, m, tuple(args[0].shape))))
        for name, module in model.named_modules()
        if isinstance(module, (nn.Conv2d, nn.Linear))
    ]
    with torch.no_grad():
        model.eval()(images)
    for hook in hooks:
        hook.remove()
    model.train()
    return found


def timed(fn, repeats: int, min_seconds: float = 0.3) -> float:
    """Median seconds of ``fn`` over ``repeats`` timings, each of enough calls to last ``min_seconds`` (after a warm-up)."""
    fn()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < min_seconds / 3:
        fn()
        calls += 1
    calls = max(calls * 3, 1)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - started) / calls)
    return statistics.median(samples)


def isolated_layers(model: nn.Module, images: torch.Tensor, repeats: int) -> list[dict[str, Any]]:
    """Each conv / linear layer alone, forward and backward on its input shape: FLOPs, seconds, FLOP/s."""
    rows = []
    for position, (name, layer, shape) in enumerate(layer_inputs(model, images)):
        layer = copy.deepcopy(layer)
        x = torch.randn(shape, requires_grad=position > 0)  # the image itself needs no gradient

        def fwd_bwd(layer=layer, x=x):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).sum().backward()

        counter = FlopCounterMode(display=False)
        with counter:
            fwd_bwd()
        flops = int(counter.get_total_flops())
        seconds = timed(fwd_bwd, repeats)
        rows.append(
            {
                "layer": name,
                "kind": type(layer).__name__,
                "input": list(shape),
                "flops": flops,
                "seconds": seconds,
                "gflop_s": flops / seconds / 1e9,
            }
        )
    return rows


def gemm_gflop_s(n: int, repeats: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / timed(lambda: a @ b, repeats) / 1e9


def prepare_variant(run: engine.Run, batches, variant: str) -> tuple[Any, float]:
    """A step function ``i -> None`` (forward, loss, backward, Adam on batch ``i``) for one variant, and its compile seconds."""
    model, loss_fn = copy.deepcopy(run.model), copy.deepcopy(run.loss_fn)
    optimizer = torch.optim.Adam(list(model.parameters()) + list(loss_fn.parameters()), lr=1e-4)
    if variant.endswith("relu_before_pool"):
        model = relu_before_pool(model)
    if "channels_last" in variant:
        model = model.to(memory_format=torch.channels_last)
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    if variant.startswith("compile"):
        model = torch.compile(model)

    def one(i: int) -> None:
        x, y = batches[i % len(batches)]
        step(model, loss_fn, optimizer, x, y)

    started = time.perf_counter()
    one(0)  # compiles a compiled variant; a warm-up for the others
    compile_s = time.perf_counter() - started if variant.startswith("compile") else 0.0
    one(1)
    return one, compile_s


def compute_variants(run: engine.Run, batches, variants: list[str], steps: int) -> list[dict[str, Any]]:
    """Images/s of the compute step for each variant, timed in rounds (one step of each variant per round) so drift hits all alike."""
    torch._dynamo.reset()  # inductor's CPU kernels take the thread count at compile time
    prepared, out = {}, {}
    for variant in variants:
        try:
            prepared[variant] = prepare_variant(run, batches, variant)
        except Exception as error:  # torch.compile without a working compiler, an unsupported op: say so, go on
            out[variant] = {"variant": variant, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    seconds: dict[str, list[float]] = {v: [] for v in prepared}
    for i in range(steps):
        for variant, (one, _) in prepared.items():
            started = time.perf_counter()
            one(i)
            seconds[variant].append(time.perf_counter() - started)
    batch = len(batches[0][1])
    for variant, (_, compile_s) in prepared.items():
        median = statistics.median(seconds[variant])
        out[variant] = {"variant": variant, "step_s": median, "images_s": batch / median, "compile_s": compile_s, "steps": steps}
    return [out[v] for v in variants]


def engine_epochs(config: TrainConfig, data_root: str, epochs: int) -> list[dict[str, float]]:
    """The engine's timings of each epoch of ``engine.fit`` (study mode), with the images it trained on."""
    rows: list[dict[str, float]] = []

    def on_epoch(epoch: int, metrics: dict[str, float], run: engine.Run) -> None:
        images = len(run.sampler) * config.classes_per_batch * config.samples_per_class
        rows.append({**epoch_times(metrics), "images": float(images)})

    engine.fit(config, on_epoch, mode="study", data_root=data_root, device=torch.device("cpu"))
    return rows


def median_of(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    run = engine.build_run(hbn_config(args.epochs + 1), mode="study", data_root=args.data_root, device=torch.device("cpu"))
    batches = real_batches(run, 8)
    images, labels = batches[0]
    flops, by_op = step_flops(run, images, labels)
    result: dict[str, Any] = {
        "batch": len(labels),
        "image_shape": list(images.shape[1:]),
        "step_flops": flops,
        "flops_by_op": by_op,
        "per_threads": {},
    }
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"threads {threads}: isolated layers and GEMM", flush=True)
        layers = isolated_layers(run.model, images, args.repeats)
        layer_flops, layer_s = sum(r["flops"] for r in layers), sum(r["seconds"] for r in layers)
        bound_flop_s = layer_flops / layer_s
        bound_images_s = len(labels) * bound_flop_s / flops
        entry: dict[str, Any] = {
            "layers": layers,
            "layers_share_of_step_flops": layer_flops / flops,
            "bound_gflop_s": bound_flop_s / 1e9,
            "bound_images_s": bound_images_s,
            "gemm1024_gflop_s": gemm_gflop_s(1024, args.repeats),
        }
        entry["peak_images_s"] = len(labels) * entry["gemm1024_gflop_s"] * 1e9 / flops  # every FLOP at the large GEMM's rate
        print(f"threads {threads}: compute-step variants", flush=True)
        variants = compute_variants(run, batches, args.variants, args.steps)
        for v in variants:
            if "images_s" in v:
                v["fraction_of_bound"] = v["images_s"] / bound_images_s
            print(f"  {v['variant']}: {v.get('images_s', float('nan')):.0f} images/s {v.get('error', '')}", flush=True)
        entry["compute_variants"] = variants
        print(f"threads {threads}: engine.fit, 1 warm-up + {args.epochs} epochs", flush=True)
        epochs = engine_epochs(hbn_config(args.epochs + 1), args.data_root, args.epochs + 1)[1:]
        imgs = median_of(epochs, "images")
        split = {k: median_of(epochs, k) for k in ("data_s", "compute_s", "train_s", "eval_s", "epoch_s")}
        entry["engine"] = {
            "epochs": epochs,
            "median": split,
            "images_per_epoch": imgs,
            "train_images_s": imgs / split["train_s"],
            "compute_images_s": imgs / split["compute_s"],
            "train_fraction_of_bound": imgs / split["train_s"] / bound_images_s,
            "compute_fraction_of_bound": imgs / split["compute_s"] / bound_images_s,
            "epoch_fraction_of_bound": imgs / split["epoch_s"] / bound_images_s,
            "compute_fraction_of_gemm_peak": imgs / split["compute_s"] / entry["peak_images_s"],
        }
        result["per_threads"][str(threads)] = entry
    return result


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "cuda": torch.cuda.is_available(),
        "loadavg": os.getloadavg(),
        "nice": os.nice(0),
    }


def markdown(payload: dict[str, Any]) -> str:
    r, m = payload["result"], payload["machine"]
    out = [
        "# small_cnn on Omniglot against the compute bound",
        "",
        f"{m['cpus']} CPUs ({m['cpu']}), torch {m['torch']}, GPU: {'yes' if m['cuda'] else 'none'}; code at {m['commit']}; "
        f"load average at the end {', '.join(f'{x:.1f}' for x in m['loadavg'])}, nice {m['nice']}. {payload.get('note', '')}",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"One training step (forward, loss, backward) on a batch of {r['batch']} images {r['image_shape']}: "
        f"**{r['step_flops'] / 1e9:.3f} GFLOP** ({r['step_flops'] / r['batch'] / 1e6:.2f} MFLOP per image). By operator: "
        + ", ".join(f"{op} {n / 1e9:.3f}" for op, n in sorted(r["flops_by_op"].items(), key=lambda kv: -kv[1])),
        "",
        "| threads | GEMM 1024 GFLOP/s | model's conv+linear alone GFLOP/s | bound images/s | engine train images/s | "
        "compute images/s | train / bound | compute / bound | compute / GEMM peak | epoch = data + compute + eval (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for threads, e in r["per_threads"].items():
        g, s = e["engine"], e["engine"]["median"]
        out.append(
            f"| {threads} | {e['gemm1024_gflop_s']:.1f} | {e['bound_gflop_s']:.1f} | {e['bound_images_s']:.0f} | "
            f"{g['train_images_s']:.0f} | {g['compute_images_s']:.0f} | {g['train_fraction_of_bound']:.2f} | "
            f"{g['compute_fraction_of_bound']:.2f} | {g['compute_fraction_of_gemm_peak']:.2f} | "
            f"{s['epoch_s']:.2f} = {s['data_s']:.2f} + {s['compute_s']:.2f} + {s['eval_s']:.2f} |"
        )
    out += ["", "Compute-step variants (forward, loss, backward, Adam) on the same pre-loaded batches, median step:", ""]
    out += ["| threads | variant | images/s | / eager | / bound | compile s |", "|---|---|---|---|---|---|"]
    for threads, e in r["per_threads"].items():
        eager = next((v["images_s"] for v in e["compute_variants"] if v["variant"] == "eager" and "images_s" in v), float("nan"))
        for v in e["compute_variants"]:
            if "error" in v:
                out.append(f"| {threads} | {v['variant']} | failed: {v['error']} | | | |")
            else:
                out.append(
                    f"| {threads} | {v['variant']} | {v['images_s']:.0f} | {v['images_s'] / eager:.2f}x | "
                    f"{v['fraction_of_bound']:.2f} | {v['compile_s']:.1f} |"
                )
    out += ["", "Per layer, alone (forward + backward):", ""]
    out += ["| threads | layer | input | MFLOP | ms | GFLOP/s |", "|---|---|---|---|---|---|"]
    for threads, e in r["per_threads"].items():
        for layer in e["layers"]:
            out.append(
                f"| {threads} | {layer['layer']} | {layer['input']} | {layer['flops'] / 1e6:.1f} | {layer['seconds'] * 1e3:.2f} | "
                f"{layer['gflop_s']:.1f} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(description=doc[0], epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to measure (default 1 2)")
    parser.add_argument("--epochs", type=int, default=2, help="measured engine epochs per thread count, after one warm-up (default 2)")
    parser.add_argument("--steps", type=int, default=20, help="timed compute steps per variant (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per isolated layer (median; default 5)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--data-root", default=os.environ.get("DML_DATA_ROOT") or str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--note", default="", help="a sentence on what else ran on the machine")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "compute_bound.json"))
    args = parser.parse_args(argv)
    started = time.time()
    result = measure(args)
    command = "python bench/compute_bound.py " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"machine": machine(), "command": command, "note": args.note, "seconds": time.time() - started, "result": result}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    out.with_suffix(".md").write_text(markdown(payload))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

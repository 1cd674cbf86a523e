"""One-off experiment: training images/s of a 2-CPU photo trial on the CPU with 0 and with 1 DataLoader worker, side by
side in one run (alternating), to set the rule of ``trainables.core.engine.loader_workers`` on the CPU.

Workload: a CUB-shaped photo set (tests/photo_data.py) read through the decoded cache, the cub200 preset's config with
a backbone that trains on a CPU (small_cnn at 64 px, resnet18 at 224 px, no pretrained weights), 2 torch threads.
Question: does one loader worker (cropping and resizing beside the training process) raise a trial's images/s?
Bound: none; the answer goes to docs/findings.md and this script is deleted.

    python -m bench.loader_workers --root /tmp/lw
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def train_rates(config, root: str, workers: int) -> list[float]:
    """Training images/s of each epoch after the first (data wait + compute; evaluation left out)."""
    import torch

    from trainables.core.engine import fit

    rates: list[float] = []

    def on_epoch(epoch: int, metrics: dict, run) -> None:
        images = len(run.sampler) * config.batch_size
        rates.append(images / (metrics["time/data_s"] + metrics["time/compute_s"]))

    fit(config, on_epoch, mode="study", data_root=root, device=torch.device("cpu"), num_workers=workers)
    return rates[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--scale", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    import torch
    import yaml

    from tests.photo_data import make_cub
    from trainables.core.config import TrainConfig

    torch.set_num_threads(2)
    root = Path(args.root)
    if not (root / "CUB_200_2011").is_dir():
        make_cub(root, scale=args.scale)
    base = yaml.safe_load(Path("configs/cub200.yaml").read_text())
    base.update(pretrained="none", precision="fp32", epochs=args.epochs, val_fraction=0.3, classes_per_batch=8, samples_per_class=4)
    shapes = {
        "small_cnn at 64 px": {"backbone": "small_cnn", "image_size": 64},
        "resnet18 at 224 px": {"backbone": "resnet18", "image_size": 224},
    }
    rows = []
    for label, shape in shapes.items():
        config = TrainConfig.from_dict({**base, **shape}, source=label)
        rates: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(args.repeats):
            for workers in (0, 1):
                rates[workers] += train_rates(config, str(root), workers)
        row = {"shape": label, **{f"workers_{w}": statistics.median(r) for w, r in rates.items()}, "all": rates}
        row["ratio"] = row["workers_1"] / row["workers_0"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("| trial | images/s, 0 workers | images/s, 1 worker | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['workers_0']:.1f} | {r['workers_1']:.1f} | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()

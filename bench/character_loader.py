"""python bench/character_loader.py: the training loader of characters, image by image against batch-wise, side by side.

Omniglot's background set at the study's 32 px (from --data-root, else $DML_DATA_ROOT; synthetic glyphs when
neither has Omniglot), batches of C x k = 32 x 4 drawn by the study's sampler, one torch thread, in one run:

- ``TorchImages`` with ``train_transform``: torchvision's Resize, RandomAffine and Normalize image by image
  (the path every character took before ``CharacterImages``);
- ``CharacterImages``: the same jitter drawn per image and applied to the batch in one ``grid_sample``;
- one training step of small_cnn (forward, loss, backward, Adam) on such a batch: what the loader's time is
  a share of.

The variants alternate round by round; the medians and the ratio go to stdout and, with --out, to a JSON file.

  DML_DATA_ROOT=../shared/data python bench/character_loader.py --rounds 20 --out docs/bench/character_loader.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainables.core import engine  # noqa: E402
from trainables.core.config import TrainConfig  # noqa: E402
from trainables.core.data import DatasetSplits, ImageSet, synthetic_glyphs  # noqa: E402
from trainables.core.transforms import CharacterImages, TorchImages, train_transform  # noqa: E402

CONFIG = {"loss": "softmax", "normalization": "none", "alpha": 1.0, "heating": "none", "classes_per_batch": 32, "samples_per_class": 4}


def splits_of(data_root: str | None) -> tuple[DatasetSplits | None, str]:
    """Omniglot under ``data_root`` at 32 px, or None (the engine then builds synthetic glyphs), and its name."""
    if data_root and (Path(data_root) / "omniglot").is_dir():
        return None, "omniglot"
    glyphs, labels = synthetic_glyphs(200, 20, 32, seed=0)
    train = ImageSet(labels, "characters", arrays=glyphs)
    return DatasetSplits(train=train, test=train.subset(range(0, len(train), 10))), "synthetic"


def timed_ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("DML_DATA_ROOT"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", help="a JSON file for the results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    splits, name = splits_of(args.data_root)
    config = TrainConfig.from_dict({**CONFIG, "dataset": "omniglot" if splits is None else "synthetic", "epochs": 1}, source="bench")
    run = engine.build_run(config, mode="final", data_root=args.data_root, splits=splits, device=torch.device("cpu"))
    index = {c: i for i, c in enumerate(run.classes)}
    per_image = TorchImages(run.train_set, train_transform("characters", run.image_size, 1.0), index)
    batch_wise = CharacterImages(run.train_set, 1.0, index)
    batch = next(iter(run.sampler))  # C x k indices of the training set
    images, labels = batch_wise.__getitems__(batch)

    def train_step() -> None:
        loss = run.loss_fn(run.model(images.contiguous(memory_format=engine.IMAGE_LAYOUT)).float(), labels)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()

    variants = {
        "image by image (TorchImages)": lambda: torch.stack([per_image[i][0] for i in batch]),
        "batch-wise (CharacterImages)": lambda: batch_wise.__getitems__(batch),
        "one training step (small_cnn)": train_step,
    }
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for key, fn in variants.items():
            times[key].append(timed_ms(fn))
    result = {
        "dataset": name, "images": len(run.train_set), "batch": len(batch), "image_size": run.image_size, "threads": 1,
        "rounds": args.rounds, "median_ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
        "load_average": os.getloadavg()[0],
    }  # fmt: skip
    med = result["median_ms"]
    result["batch_wise_over_image_by_image"] = round(med["batch-wise (CharacterImages)"] / med["image by image (TorchImages)"], 3)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

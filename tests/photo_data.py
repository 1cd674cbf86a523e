"""python -m tests.photo_data: synthetic photo datasets in the layouts, counts and image sizes of CUB-200-2011, Cars196, SOP
and In-shop.

Each dataset is written under ``--root`` in the layout ``trainables.core.data`` reads:

- ``cub200``: ``CUB_200_2011/{images.txt,image_class_labels.txt,images/NNN.Bird_N/*.jpg}``, 11,788 images of
  200 classes (classes 1-100 train, 101-200 test), 41 to 60 images per class.
- ``cars196``: ``cars196/{cars_annos.mat,car_ims/NNNNNN.jpg}``, 16,185 images of 196 classes (1-98 / 99-196),
  Stanford's annotation struct (relative_im_path, bbox_x1..y2, class, test).
- ``sop``: ``Stanford_Online_Products/{Ebay_train.txt,Ebay_test.txt,<super>_final/*.JPG}``, 59,551 training
  images of 11,318 classes and 60,502 test images of 11,316 classes, 2 to 12 images per class, 12 super classes.
- ``inshop``: ``inshop/{list_eval_partition.txt,img/<MEN|WOMEN>/<category>/id_NNNNNNNN/*.jpg}``, 25,882 training
  images of 3,997 items and 26,830 test images of 3,985 items, each test item's split about half and half into
  queries and gallery images (the benchmark: 14,218 and 12,612), 2 to 20 images per item, all 256 x 256 as in the
  benchmark's img/ folder.

Images are procedural: a class's template (a two-colour gradient and 2 to 4 shapes of class-seeded colours and
places) drawn at each image's own size with per-image jitter and noise, encoded as JPEG (quality 90). Their
sizes are drawn from log-normal models of each dataset's sizes (long side and aspect ratio; CUB mostly 500 px
wide, Cars from about 100 to 2,500 px and wide, SOP around 500 px and near square, In-shop 256 x 256). The models are
approximations written from the datasets' descriptions, not fitted to the real files (which are not on the
machine that wrote this).

``--scale`` shrinks the image and class counts alike (at least 2 images per class; the tests use tiny scales),
``--size-scale`` the image sizes. The tests write tiny sets; the GPU benchmarks (bench.gpu_path, bench.gpu_study)
write full-size ones. Examples:

  python -m tests.photo_data --root /tmp/photos --datasets sop --scale 0.1      # an SOP-shaped subset (12,005 images)
  python -m tests.photo_data --root /data/synthetic --datasets cub200 cars196 sop --workers 2   # the full sizes
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SOP_SUPER_CLASSES = (
    "bicycle",
    "cabinet",
    "chair",
    "coffee_maker",
    "fan",
    "kettle",
    "lamp",
    "mug",
    "sofa",
    "stapler",
    "table",
    "toaster",
)


@dataclass(frozen=True)
class SizeModel:
    """Image sizes: long side log-normal (median, sigma) clipped to [low, high]; aspect (long / short) log-normal
    (median, sigma) clipped to [1, max_aspect]; ``landscape`` the share of images wider than tall."""

    median_long: float
    sigma_long: float
    low: int
    high: int
    median_aspect: float
    sigma_aspect: float
    max_aspect: float
    landscape: float

    def draw(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        """(n, 2) int (width, height)."""
        long = np.clip(rng.lognormal(np.log(self.median_long), self.sigma_long, n), self.low, self.high) * scale
        aspect = np.clip(rng.lognormal(np.log(self.median_aspect), self.sigma_aspect, n), 1.0, self.max_aspect)
        short = long / aspect
        wide = rng.random(n) < self.landscape
        width, height = np.where(wide, long, short), np.where(wide, short, long)
        return np.maximum(np.stack([width, height], 1).round().astype(int), 8)


SIZES = {
    "cub200": SizeModel(500, 0.08, 120, 500, 1.33, 0.15, 2.5, 0.85),
    "cars196": SizeModel(700, 0.5, 100, 2500, 1.5, 0.2, 3.0, 0.97),
    "sop": SizeModel(500, 0.35, 100, 1600, 1.1, 0.15, 2.5, 0.6),
    "inshop": SizeModel(256, 0.0, 256, 256, 1.0, 0.0, 1.0, 0.5),
}
INSHOP_CATEGORIES = ("MEN/Denim", "MEN/Shirts_Polos", "MEN/Tees_Tanks", "WOMEN/Blouses_Shirts", "WOMEN/Dresses", "WOMEN/Skirts")
INSHOP_VIEWS = ("front", "side", "back", "full", "additional")


def class_counts(rng: np.random.Generator, images: int, classes: int, low: int, high: int) -> np.ndarray:
    """``classes`` counts in [low, high] that sum to ``images`` (spread uniformly at random over the classes)."""
    if not low * classes <= images <= high * classes:
        raise ValueError(f"{images} images do not fit {classes} classes of {low} to {high} images")
    counts = np.full(classes, low)
    while (left := images - counts.sum()) > 0:
        open_ = np.flatnonzero(counts < high)
        counts[open_] = np.minimum(counts[open_] + rng.multinomial(left, np.full(len(open_), 1 / len(open_))), high)
    return counts


def draw_image(label: int, width: int, height: int, seed: int) -> Image.Image:
    """One procedural RGB photo of class ``label``: the class's gradient and shapes, jittered by ``seed``."""
    template = np.random.default_rng([label, 0])
    rng = np.random.default_rng([label, seed])
    top, bottom = template.integers(0, 256, (2, 3))
    ramp = np.linspace(0, 1, height)[:, None, None]
    ground = (top * (1 - ramp) + bottom * ramp).astype(np.float32)
    image = Image.fromarray(np.broadcast_to(ground, (height, width, 3)).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(template.integers(2, 5)):
        kind = template.integers(0, 3)
        colour = tuple(int(c) for c in template.integers(0, 256, 3))
        cx, cy, rx, ry = template.uniform([0.2, 0.2, 0.08, 0.08], [0.8, 0.8, 0.3, 0.3])
        cx, cy = cx + rng.normal(0, 0.05), cy + rng.normal(0, 0.05)
        grow = rng.uniform(0.85, 1.15)
        box = [(cx - rx * grow) * width, (cy - ry * grow) * height, (cx + rx * grow) * width, (cy + ry * grow) * height]
        if kind == 0:
            draw.ellipse(box, fill=colour)
        elif kind == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(box[0], box[3]), ((box[0] + box[2]) / 2, box[1]), (box[2], box[3])], fill=colour)
    noise = rng.normal(0, 6, (height // 4 + 1, width // 4 + 1, 1)).astype(np.float32)
    noise = np.repeat(np.repeat(noise, 4, 0), 4, 1)[:height, :width]
    return Image.fromarray(np.clip(np.asarray(image, np.float32) + noise, 0, 255).astype(np.uint8), "RGB")


def _write(job: tuple[str, int, int, int, int]) -> None:
    path, label, width, height, seed = job
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    draw_image(label, width, height, seed).save(path, "JPEG", quality=90)


def write_images(jobs: list[tuple[str, int, int, int, int]], workers: int) -> None:
    """(path, label, width, height, seed) -> a JPEG each, in ``workers`` processes."""
    if workers <= 1:
        for job in jobs:
            _write(job)
        return
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_write, jobs, chunksize=64))


def plan(rng: np.random.Generator, name: str, classes: int, images: int, high: int, scale: float, size_scale: float):
    """The images of ``classes`` x ``scale`` classes (at least 4): (class 1.. of each image (N,), (N, 2) width, height)."""
    n_classes = max(4, int(round(classes * scale)))
    counts = class_counts(rng, min(max(int(round(images * scale)), 2 * n_classes), high * n_classes), n_classes, 2, high)
    return np.repeat(np.arange(1, n_classes + 1), counts), SIZES[name].draw(rng, int(counts.sum()), size_scale)


def split_label(c: int, classes: int, first_test: int) -> int:
    """Class c of 1..classes as a dataset class id: the first half train (1..), the rest test (first_test..)."""
    return c if c <= classes // 2 else first_test + c - classes // 2 - 1


def make_cub(root: Path, scale: float = 1.0, size_scale: float = 1.0, seed: int = 0, workers: int = 1) -> Path:
    base = root / "CUB_200_2011"
    classes, sizes = plan(np.random.default_rng([seed, 200]), "cub200", 200, 11_788, 60, scale, size_scale)
    jobs, images, labels = [], [], []
    for i, c in enumerate(classes):
        label = split_label(int(c), int(classes[-1]), 101)
        rel = f"{label:03d}.Bird_{label}/Bird_{label}_{i + 1:05d}.jpg"
        jobs.append((str(base / "images" / rel), label, *sizes[i], i))
        images.append(f"{i + 1} {rel}")
        labels.append(f"{i + 1} {label}")
    write_images(jobs, workers)
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    return base


def make_cars(root: Path, scale: float = 1.0, size_scale: float = 1.0, seed: int = 0, workers: int = 1) -> Path:
    from scipy.io import savemat

    base = root / "cars196"
    classes, sizes = plan(np.random.default_rng([seed, 196]), "cars196", 196, 16_185, 200, scale, size_scale)
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    table = np.zeros((1, len(classes)), dtype=[(f, object) for f in fields])
    jobs = []
    for i, c in enumerate(classes):
        label = split_label(int(c), int(classes[-1]), 99)
        rel = f"car_ims/{i + 1:06d}.jpg"
        width, height = sizes[i]
        jobs.append((str(base / rel), label, width, height, i))
        box = [np.array([[v]], dtype=np.uint16) for v in (1, 1, width, height)]
        table[0, i] = (rel, *box, np.array([[label]], dtype=np.uint8), np.array([[int(label > 98)]], dtype=np.uint8))
    write_images(jobs, workers)
    savemat(base / "cars_annos.mat", {"annotations": table})
    return base


def make_sop(root: Path, scale: float = 1.0, size_scale: float = 1.0, seed: int = 0, workers: int = 1) -> Path:
    base = root / "Stanford_Online_Products"
    rng = np.random.default_rng([seed, 22634])
    jobs, first_class, image_id = [], 1, 1
    for name, images, classes in (("Ebay_train.txt", 59_551, 11_318), ("Ebay_test.txt", 60_502, 11_316)):
        labels, sizes = plan(rng, "sop", classes, images, 12, scale, size_scale)
        lines = ["image_id class_id super_class_id path"]
        for k, c in enumerate(labels + first_class - 1):
            super_id = int(c) % len(SOP_SUPER_CLASSES)
            rel = f"{SOP_SUPER_CLASSES[super_id]}_final/{100_000_000_000 + int(c)}_{k}.JPG"
            jobs.append((str(base / rel), int(c), *sizes[k], image_id))
            lines.append(f"{image_id} {c} {super_id + 1} {rel}")
            image_id += 1
        first_class += int(labels[-1])
        base.mkdir(parents=True, exist_ok=True)
        (base / name).write_text("\n".join(lines) + "\n")
    write_images(jobs, workers)
    return base


def make_inshop(root: Path, scale: float = 1.0, size_scale: float = 1.0, seed: int = 0, workers: int = 1) -> Path:
    base = root / "inshop"
    rng = np.random.default_rng([seed, 7982])
    jobs, rows, first_item = [], [], 1
    for part, images, items in (("train", 25_882, 3_997), ("test", 26_830, 3_985)):
        labels, sizes = plan(rng, "inshop", items, images, 20, scale, size_scale)
        shown, totals = np.zeros(int(labels.max()) + 1, dtype=int), np.bincount(labels)  # per item: its images so far, in all
        for k, c in enumerate(labels):
            item = first_item + int(c) - 1
            n = shown[c]
            shown[c] += 1
            # a test item's images alternate query, gallery, its last one a gallery image: every item has both
            status = part if part == "train" else ("query" if n % 2 == 0 and n < totals[c] - 1 else "gallery")
            rel = f"img/{INSHOP_CATEGORIES[item % len(INSHOP_CATEGORIES)]}/id_{item:08d}/{n + 1:02d}_{n % 5 + 1}_{INSHOP_VIEWS[n % 5]}.jpg"
            jobs.append((str(base / rel), item, *sizes[k], len(jobs)))
            rows.append(f"{rel} id_{item:08d} {status}")
        first_item += int(labels[-1])
    write_images(jobs, workers)
    (base / "list_eval_partition.txt").write_text("\n".join([str(len(rows)), "image_name item_id evaluation_status", *rows]) + "\n")
    return base


MAKERS: dict[str, Callable[..., Path]] = {"cub200": make_cub, "cars196": make_cars, "sop": make_sop, "inshop": make_inshop}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, type=Path, help="data root to write the dataset folders into (use as --data-root)")
    parser.add_argument("--datasets", nargs="+", choices=sorted(MAKERS), default=sorted(MAKERS))
    parser.add_argument("--scale", type=float, default=1.0, help="share of the real image and class counts (1: the real counts)")
    parser.add_argument("--size-scale", type=float, default=1.0, help="factor on every image's width and height (1: the real sizes)")
    parser.add_argument("--seed", type=int, default=0)
    cpus = len(os.sched_getaffinity(0))
    parser.add_argument("--workers", type=int, default=cpus, help="encoding processes (default: this process's CPUs)")
    args = parser.parse_args(argv)
    for name in args.datasets:
        start = time.perf_counter()
        base = MAKERS[name](args.root, args.scale, args.size_scale, args.seed, args.workers)
        files = sum(1 for p in base.rglob("*") if p.suffix.lower() == ".jpg")
        size = sum(p.stat().st_size for p in base.rglob("*") if p.is_file())
        print(f"{name}: {files} images, {size / 2**20:.0f} MiB in {base} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()

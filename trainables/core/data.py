"""Datasets and class-disjoint splits (numpy and PIL; the torch side is ``transforms``).

Every dataset yields two class-disjoint :class:`ImageSet` s: ``train`` (the
dataset's standard training classes) and ``test`` (its standard held-out
classes; for In-shop, ``test`` holds the queries and ``gallery`` the gallery).
:func:`split_classes` then cuts the training classes into *fit* and
*validation* classes (the project's protocol): studies train on fit and are
scored on validation; only final training touches the test classes.

Datasets are found under a data root (``--data-root`` or the ``DML_DATA_ROOT``
environment variable) in their standard on-disk layouts:

- ``omniglot``: ``<root>/omniglot/images_background_small1.zip`` and
  ``images_background_small2.zip`` (zips or their extracted folders). Train on
  the 136 characters of small1, test on the 106 characters of the small2
  alphabets small1 lacks (Japanese (katakana), Sanskrit, Tagalog).
- ``cub200``: ``<root>/CUB_200_2011/{images.txt,image_class_labels.txt,images/}``;
  classes 1-100 train, 101-200 test.
- ``cars196``: ``<root>/cars196/{cars_annos.mat,car_ims/}``; classes 1-98 train,
  99-196 test.
- ``sop``: ``<root>/Stanford_Online_Products/{Ebay_train.txt,Ebay_test.txt}``.
- ``inshop``: ``<root>/inshop/{list_eval_partition.txt,img/}``; test = query and
  gallery.
- ``folder``: ``<root>/{train,test}/<class>/<image>``: one sub-folder per class.
- ``synthetic``: generated glyph-like images, for tests and smoke runs.

Hidden files and folders (names starting with ``.``: Jupyter's
``.ipynb_checkpoints/``, macOS's ``._name.jpg`` and ``.DS_Store``) are never
images of a dataset: every layout skips an image with one on its path, and
:func:`load_dataset` logs how many it skipped.
"""

from __future__ import annotations

import io
import logging
import os
import urllib.request
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from trainables.core.config import DATA_ROOT_ENV, held_out_classes

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
OMNIGLOT_URL = "https://raw.githubusercontent.com/brendenlake/omniglot/master/python/{name}.zip"
OMNIGLOT_TEST_ALPHABETS = ("Japanese_(katakana)", "Sanskrit", "Tagalog")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class DatasetError(ValueError):
    """A dataset is missing or malformed; the message says what was expected where."""


@dataclass(frozen=True)
class Decoded:
    """An ImageSet's rows of a decoded cache (``cache.attach_cache``).

    ``pixels`` (M, R, R, 3) uint8, every image of the dataset squashed to R x R (a read-only np.memmap);
    ``shapes`` (M, 2) int64, each image's original (height, width); ``rows`` (N,) int64, the set's rows.
    """

    pixels: np.ndarray
    shapes: np.ndarray
    rows: np.ndarray

    @property
    def size(self) -> int:
        return self.pixels.shape[1]

    def __reduce__(self):
        # a DataLoader worker started by spawn or forkserver gets the map's file, not a copy of the whole cache
        pixels = self.pixels
        if isinstance(pixels, np.memmap) and pixels.filename is not None:
            return _mapped, (pixels.filename, pixels.offset, pixels.shape, self.shapes, self.rows)
        return Decoded, (pixels, self.shapes, self.rows)


def _mapped(filename: str, offset: int, shape: tuple[int, ...], shapes: np.ndarray, rows: np.ndarray) -> Decoded:
    return Decoded(np.memmap(filename, np.uint8, "r", offset=offset, shape=shape), shapes, rows)


@dataclass
class ImageSet:
    """Labelled images, either decoded in memory or read from files on demand.

    ``labels`` (N,) int64 are the dataset's class ids. ``kind`` is
    ``characters`` (grayscale glyphs, dark strokes on light ground) or
    ``photos`` (RGB). Exactly one of ``arrays`` ((N, H, W) uint8, already at
    the training size) and ``paths`` is set. Photos may also have ``decoded``:
    their rows of the node's decoded cache, which the training loader reads
    instead of the files.
    """

    labels: np.ndarray
    kind: str
    arrays: np.ndarray | None = None
    paths: list[str] | None = None
    names: dict[int, str] = field(default_factory=dict)
    decoded: Decoded | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def classes(self) -> np.ndarray:
        return np.unique(self.labels)

    def subset(self, index: np.ndarray) -> ImageSet:
        index = np.asarray(index, dtype=np.int64)
        return ImageSet(
            labels=self.labels[index],
            kind=self.kind,
            arrays=None if self.arrays is None else self.arrays[index],
            paths=None if self.paths is None else [self.paths[i] for i in index],
            names=self.names,
            decoded=None if self.decoded is None else replace(self.decoded, rows=self.decoded.rows[index]),
        )

    def with_classes(self, classes: np.ndarray) -> ImageSet:
        return self.subset(np.flatnonzero(np.isin(self.labels, classes)))

    def load(self, i: int) -> np.ndarray:
        """The i-th image as a uint8 array: (H, W) for characters, (H, W, 3) for photos."""
        if self.arrays is not None:
            return self.arrays[i]
        return read_image(self.paths[i], self.kind)


@dataclass
class DatasetSplits:
    train: ImageSet
    test: ImageSet
    gallery: ImageSet | None = None  # query/gallery evaluation (In-shop): test holds the queries
    recall_ks: tuple[int, ...] = (1, 2, 4, 8)
    default_image_size: int = 224
    skipped_hidden: int = 0  # images left out because a file or folder on their path is hidden (is_hidden)


# What decoding a broken or hostile file raises: OSError (UnidentifiedImageError is one), a plugin's SyntaxError,
# ValueError or EOFError, and Pillow's decompression-bomb guard (its warning is made an error: between one and
# two times Image.MAX_IMAGE_PIXELS Pillow only warns and decodes gigabytes).
BAD_IMAGE = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError, Image.DecompressionBombWarning)


def decode_image(source: str | io.BytesIO, where: str, mode: str, size: int | None = None) -> np.ndarray:
    """One image file -> uint8 array in PIL ``mode`` (L or RGB), resized to size x size if given; DatasetError naming ``where``."""
    return decode_sized(source, where, mode, size)[0]


def decode_sized(source: str | io.BytesIO, where: str, mode: str, size: int | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """:func:`decode_image` and the image's original (height, width).

    A JPEG is decoded at the smallest of 1/1, 1/2, 1/4, 1/8 of its size that is at least size x size (Pillow's
    ``draft``: the DCT scales it, several times faster than decoding it whole), then resized.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as image:
                width, height = image.size
                if size:
                    image.draft(mode, (size, size))
                image = image.convert(mode)
                if size:
                    image = image.resize((size, size), Image.Resampling.BILINEAR)
                return np.asarray(image, dtype=np.uint8).copy(), (height, width)
    except BAD_IMAGE as error:
        raise DatasetError(f"{where}: unreadable image ({error.__class__.__name__}: {error})") from None


def source_size(image_size: int) -> int:
    """The side photos are resized to before a crop of ``image_size``: 256 for 224, as in the papers' evaluation."""
    return int(round(image_size * 256 / 224))


def read_image(path: str, kind: str) -> np.ndarray:
    return decode_image(path, path, "L" if kind == "characters" else "RGB")


# ----------------------------------------------------------------------------- loaders
def is_hidden(path: str) -> bool:
    """Whether a path below a dataset's folder (``/``-separated) passes through a hidden file or folder, one named ``.*``."""
    return any(part.startswith(".") and part not in (".", "..") for part in PurePosixPath(path).parts)


def _visible(rows: list[list[str]], column: int) -> tuple[list[list[str]], int]:
    """The rows of a list file whose path (``column``) is not :func:`is_hidden`, and how many were."""
    kept = [row for row in rows if not is_hidden(row[column])]
    return kept, len(rows) - len(kept)


def _need(path: Path, what: str, folder: bool = False) -> Path:
    if not path.exists():
        raise DatasetError(f"{path}: not found; expected {what}")
    if folder and not path.is_dir():
        raise DatasetError(f"{path}: not a folder; expected {what}")
    return path


def _resize_gray(data: bytes | str, size: int, where: str) -> np.ndarray:
    return decode_image(io.BytesIO(data) if isinstance(data, bytes) else data, where, "L", size)


def _omniglot_part(base: Path, name: str, image_size: int, skip: tuple[str, ...], download: bool):
    """Decode one Omniglot background set; classes are alphabet/character."""
    folder, archive = base / name, base / f"{name}.zip"
    if not folder.is_dir() and not archive.is_file():
        if not download:
            raise DatasetError(
                f"{archive}: not found; expected Omniglot's {name}.zip (or its extracted folder) "
                f"under the data root (--data-root or ${DATA_ROOT_ENV}), or pass --download"
            )
        base.mkdir(parents=True, exist_ok=True)
        log.info("downloading %s", OMNIGLOT_URL.format(name=name))
        urllib.request.urlretrieve(OMNIGLOT_URL.format(name=name), archive)
    # (path below the set's folder, where, read, hidden)
    entries: list[tuple[str, str, Callable[[], bytes | str], bool]] = []
    if folder.is_dir():
        for path in sorted(folder.glob("*/*/*.png")):
            rel = path.relative_to(folder).as_posix()
            entries.append((rel, str(path), lambda p=path: str(p), is_hidden(rel)))
        zf = None
    else:
        try:
            zf = zipfile.ZipFile(archive)
        except zipfile.BadZipFile:
            raise DatasetError(f"{archive}: not a readable zip file; expected Omniglot's {name}.zip") from None
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.filename.endswith(".png") and "/" in info.filename:
                rel = info.filename.split("/", 1)[1]  # a hidden top folder (not the set's) hides its entries too
                entries.append((rel, f"{archive}:{info.filename}", lambda i=info: zf.read(i), is_hidden(info.filename)))
    images, names, skipped = [], [], 0
    for rel, where, read, hidden in entries:
        parts = rel.split("/")
        if hidden:
            skipped += 1
            continue
        if len(parts) != 3 or parts[0] in skip:
            continue
        images.append(_resize_gray(read(), image_size, where))
        names.append(f"{parts[0]}/{parts[1]}")
    if zf is not None:
        zf.close()
    if not images:
        raise DatasetError(f"{folder if folder.is_dir() else archive}: no <alphabet>/<character>/*.png images found")
    return np.stack(images), names, skipped


def load_omniglot(root: Path, image_size: int, download: bool = False) -> DatasetSplits:
    base = root / "omniglot"
    train_x, train_names, train_hidden = _omniglot_part(base, "images_background_small1", image_size, (), download)
    train_alphabets = {n.split("/")[0] for n in train_names}
    skip = tuple(train_alphabets)  # Greek and Latin appear in both sets: keep the test classes unseen
    test_x, test_names, test_hidden = _omniglot_part(base, "images_background_small2", image_size, skip, download)
    if {n.split("/")[0] for n in test_names} & train_alphabets:
        raise DatasetError(f"{base}: the test alphabets overlap the training alphabets")
    return _from_names(train_x, train_names, test_x, test_names, "characters", (1, 2, 4, 8), 32, train_hidden + test_hidden)


def _from_names(train_x, train_names, test_x, test_names, kind, ks, size, skipped) -> DatasetSplits:
    vocabulary = {name: i for i, name in enumerate(sorted(set(train_names) | set(test_names)))}
    names = {i: name for name, i in vocabulary.items()}
    train = ImageSet(np.array([vocabulary[n] for n in train_names], dtype=np.int64), kind, arrays=train_x, names=names)
    test = ImageSet(np.array([vocabulary[n] for n in test_names], dtype=np.int64), kind, arrays=test_x, names=names)
    return DatasetSplits(train, test, recall_ks=ks, default_image_size=size, skipped_hidden=skipped)


def _split_by_class(paths: list[str], labels: list[int], first_test_class: int, ks, skipped: int) -> DatasetSplits:
    labels_a = np.asarray(labels, dtype=np.int64)
    is_test = labels_a >= first_test_class
    train = ImageSet(labels_a[~is_test], "photos", paths=[p for p, t in zip(paths, is_test) if not t])
    test = ImageSet(labels_a[is_test], "photos", paths=[p for p, t in zip(paths, is_test) if t])
    if len(train) == 0 or len(test) == 0:
        raise DatasetError(f"{Path(paths[0]).parent if paths else 'dataset'}: expected images in both the train and the test classes")
    return DatasetSplits(train, test, recall_ks=ks, skipped_hidden=skipped)


def _read_table(path: Path, columns: int, what: str, skip: int = 0) -> list[list[str]]:
    rows = []
    for number, line in enumerate(_need(path, what).read_text().splitlines()[skip:], start=skip + 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) < columns:
            raise DatasetError(f"{path}:{number}: expected {columns} columns ({what}), got {line!r}")
        rows.append(parts)
    if not rows:
        raise DatasetError(f"{path}: empty; expected {what}")
    return rows


def _int(value: str, path: Path, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DatasetError(f"{path}: {value!r} is not an integer ({what})") from None


def load_cub200(root: Path, image_size: int, download: bool = False) -> DatasetSplits:
    base = _need(root / "CUB_200_2011", "the CUB_200_2011 folder (images.txt, image_class_labels.txt, images/)")
    images, skipped = _visible(_read_table(base / "images.txt", 2, "'<image id> <relative path>' per line"), 1)
    labels_rows = _read_table(base / "image_class_labels.txt", 2, "'<image id> <class id 1-200>' per line")
    label_of = {r[0]: _int(r[1], base / "image_class_labels.txt", "class id") for r in labels_rows}
    missing = [r[0] for r in images if r[0] not in label_of]
    if missing:
        raise DatasetError(f"{base / 'image_class_labels.txt'}: no label for image id {missing[0]} of images.txt")
    paths = [str(base / "images" / r[1]) for r in images]
    return _split_by_class(paths, [label_of[r[0]] for r in images], 101, (1, 2, 4, 8), skipped)


def load_cars196(root: Path, image_size: int, download: bool = False) -> DatasetSplits:
    from scipy.io import loadmat

    base = _need(root / "cars196", "the cars196 folder (cars_annos.mat, car_ims/)")
    annos = _need(base / "cars_annos.mat", "Stanford Cars' cars_annos.mat")
    try:
        table = loadmat(annos)["annotations"][0]
        rows = [[str(a["relative_im_path"][0]), int(np.asarray(a["class"]).ravel()[0])] for a in table]
    except (KeyError, ValueError, IndexError, TypeError) as error:
        raise DatasetError(f"{annos}: expected an 'annotations' struct with relative_im_path and class ({error})") from None
    rows, skipped = _visible(rows, 0)
    return _split_by_class([str(base / rel) for rel, _ in rows], [label for _, label in rows], 99, (1, 2, 4, 8), skipped)


def load_sop(root: Path, image_size: int, download: bool = False) -> DatasetSplits:
    base = _need(root / "Stanford_Online_Products", "the Stanford_Online_Products folder (Ebay_train.txt, Ebay_test.txt)")
    what = "'image_id class_id super_class_id path' per line after a header"
    sets, skipped = [], 0
    for name in ("Ebay_train.txt", "Ebay_test.txt"):
        rows, hidden_rows = _visible(_read_table(base / name, 4, what, skip=1), 3)
        skipped += hidden_rows
        labels = np.array([_int(r[1], base / name, "class_id") for r in rows], dtype=np.int64)
        sets.append(ImageSet(labels, "photos", paths=[str(base / r[3]) for r in rows]))
    train, test = sets
    if np.intersect1d(train.classes, test.classes).size:
        raise DatasetError(f"{base}: Ebay_train.txt and Ebay_test.txt share classes; expected class-disjoint splits")
    return DatasetSplits(train, test, recall_ks=(1, 10, 100), skipped_hidden=skipped)


def load_inshop(root: Path, image_size: int, download: bool = False) -> DatasetSplits:
    base = _need(root / "inshop", "the inshop folder (list_eval_partition.txt, img/)")
    table = base / "list_eval_partition.txt"
    rows = _read_table(table, 3, "'image_name item_id evaluation_status' per line after two header lines", skip=2)
    items = sorted({r[1] for r in rows})
    index = {item: i for i, item in enumerate(items)}
    parts: dict[str, tuple[list[str], list[int]]] = {"train": ([], []), "query": ([], []), "gallery": ([], [])}
    skipped = 0
    for number, row in enumerate(rows, start=3):
        if row[2] not in parts:
            raise DatasetError(f"{table}:{number}: evaluation_status {row[2]!r}; expected train, query or gallery")
        if is_hidden(row[0]):
            skipped += 1
            continue
        parts[row[2]][0].append(str(base / row[0]))
        parts[row[2]][1].append(index[row[1]])
    train, query, gallery = (
        ImageSet(np.array(parts[k][1], dtype=np.int64), "photos", paths=parts[k][0]) for k in ("train", "query", "gallery")
    )
    if min(len(train), len(query), len(gallery)) == 0:
        raise DatasetError(f"{table}: expected train, query and gallery images")
    return DatasetSplits(train, query, gallery=gallery, recall_ks=(1, 10, 20, 30), skipped_hidden=skipped)


def _folder_set(folder: Path) -> tuple[list[str], list[str], int]:
    """The images of ``folder``/<class>/ (paths, class names) and how many were :func:`is_hidden`."""
    paths, names, skipped = [], [], 0
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        for image in sorted(class_dir.iterdir()):
            if image.suffix.lower() not in IMAGE_EXTENSIONS:
                continue
            if is_hidden(f"{class_dir.name}/{image.name}"):
                skipped += 1
                continue
            paths.append(str(image))
            names.append(class_dir.name)
    if not paths:
        raise DatasetError(f"{folder}: no images; expected one sub-folder per class holding {'/'.join(IMAGE_EXTENSIONS)} files")
    return paths, names, skipped


def load_folder(root: Path, image_size: int, download: bool = False) -> DatasetSplits:
    splits = []
    for part in ("train", "test"):
        splits.append(_folder_set(_need(root / part, f"a {part}/ folder with one sub-folder per class", folder=True)))
    (train_p, train_n, train_hidden), (test_p, test_n, test_hidden) = splits
    shared = sorted(set(train_n) & set(test_n))
    if shared:
        raise DatasetError(f"{root}: class {shared[0]!r} is in both train/ and test/; expected class-disjoint folders")
    vocabulary = {name: i for i, name in enumerate(sorted(set(train_n) | set(test_n)))}
    names = {i: n for n, i in vocabulary.items()}
    train = ImageSet(np.array([vocabulary[n] for n in train_n]), "photos", paths=train_p, names=names)
    test = ImageSet(np.array([vocabulary[n] for n in test_n]), "photos", paths=test_p, names=names)
    return DatasetSplits(train, test, recall_ks=(1, 2, 4, 8), skipped_hidden=train_hidden + test_hidden)


def synthetic_glyphs(num_classes: int, per_class: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random stroke glyphs, one template per class plus per-image jitter and noise.

    Returns images (num_classes * per_class, size, size) uint8 (dark strokes on
    a light ground, like Omniglot) and labels (N,).
    """
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, 3 * size)[:, None]
    images, labels = [], []
    for c in range(num_classes):
        points = rng.uniform(0.2 * size, 0.8 * size, size=(4, 2))
        for _ in range(per_class):
            jittered = points + rng.normal(0, 0.09 * size, size=points.shape)
            line = np.concatenate([a + t * (b - a) for a, b in zip(jittered[:-1], jittered[1:])])
            rows, cols = np.clip(np.round(line).astype(int), 0, size - 1).T
            ink = np.zeros((size + 2, size + 2), np.float32)
            ink[rows + 1, cols + 1] = 1.0
            # thicken the one-pixel stroke with a 3 x 3 max filter
            ink = np.max([ink[1 + dy : size + 1 + dy, 1 + dx : size + 1 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)
            ink = np.clip(ink + rng.normal(0, 0.15, ink.shape), 0, 1)
            images.append((255 * (1 - ink)).astype(np.uint8))
            labels.append(c)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def load_synthetic(root: Path | None, image_size: int, download: bool = False) -> DatasetSplits:
    x, y = synthetic_glyphs(40, 10, image_size, seed=1234)
    is_test = y >= 30
    train = ImageSet(y[~is_test], "characters", arrays=x[~is_test])
    test = ImageSet(y[is_test], "characters", arrays=x[is_test])
    return DatasetSplits(train, test, recall_ks=(1, 2, 4, 8), default_image_size=32)


# config.dataset -> loader (root, image_size, download) -> DatasetSplits; its keys are the values TrainConfig allows
DATASETS: dict[str, Callable[..., DatasetSplits]] = {
    "omniglot": load_omniglot,
    "cub200": load_cub200,
    "cars196": load_cars196,
    "sop": load_sop,
    "inshop": load_inshop,
    "folder": load_folder,
    "synthetic": load_synthetic,
}
IN_MEMORY = {"omniglot": 32, "synthetic": 32}  # datasets decoded at load time, and their default size


def resolve_data_root(data_root: str | os.PathLike | None) -> Path | None:
    value = data_root or os.environ.get(DATA_ROOT_ENV)
    return Path(value).expanduser() if value else None


def image_size_for(dataset: str, image_size: int) -> int:
    return image_size or IN_MEMORY.get(dataset, 224)


def load_dataset(name: str, data_root: str | os.PathLike | None, image_size: int = 0, download: bool = False) -> DatasetSplits:
    """Load ``name`` from the data root; raises DatasetError naming what is missing where."""
    if name not in DATASETS:
        raise DatasetError(f"dataset {name!r} is unknown; expected one of {', '.join(DATASETS)}")
    root = resolve_data_root(data_root)
    if root is None and name != "synthetic":
        raise DatasetError(f"dataset {name!r} needs a data root: pass --data-root DIR or set ${DATA_ROOT_ENV}")
    if root is not None and name != "synthetic" and not root.is_dir() and not download:
        raise DatasetError(f"{root}: data root is not a directory (from --data-root or ${DATA_ROOT_ENV})")
    splits = DATASETS[name](root, image_size_for(name, image_size), download)
    if splits.skipped_hidden:
        log.info(
            "dataset %r: skipped %d hidden images (a file or folder named '.*' on their path) under %s", name, splits.skipped_hidden, root
        )
    for part, images in (("train", splits.train), ("test", splits.test)):
        if len(images.classes) < 2:
            raise DatasetError(f"{root}: the {part} split of {name!r} has {len(images.classes)} class; expected at least 2")
    return splits


# ----------------------------------------------------------------------------- splits
def split_classes(labels: np.ndarray, val_fraction: float, seed: int = 0, fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Cut the training classes into (fit classes, validation classes), seeded; ``fold`` picks which classes.

    The N classes are put in a seeded random order and cut into ``class_folds`` class-disjoint folds of
    n = round(val_fraction x N) consecutive classes each (the last N mod n classes are in no fold: always fit);
    fold f validates on the f-th of them and fits on the rest. Fold 0 is the split every trial of a study is
    scored on; the others hold out other classes for its confirmation re-runs (study.search.race). The split
    depends only on the classes, the fraction, ``seed`` and ``fold`` (not on a trial's training seed).
    """
    classes = np.unique(labels)
    n_val = held_out_classes(len(classes), val_fraction)
    if n_val < 2 or len(classes) - n_val < 2:
        raise DatasetError(
            f"val_fraction={val_fraction} of {len(classes)} training classes leaves {n_val} validation and "
            f"{len(classes) - n_val} fit classes; expected at least 2 of each"
        )
    _check_fold(fold, len(classes) // n_val, f"val_fraction={val_fraction} of {len(classes)} training classes")
    order = np.random.default_rng(seed).permutation(classes)
    held_out = order[fold * n_val : (fold + 1) * n_val]
    return np.sort(np.setdiff1d(classes, held_out)), np.sort(held_out)


def _check_fold(fold: int, folds: int, what: str) -> None:
    if not 0 <= fold < folds:
        raise DatasetError(f"val_fold={fold}: {what} gives {folds} validation fold(s); expected val_fold in 0..{folds - 1}")


def alphabets(images: ImageSet) -> dict[int, str] | None:
    """Class id -> alphabet for Omniglot-style names ("alphabet/character"), else None."""
    names = {int(c): images.names.get(int(c), "") for c in images.classes}
    if not names or not all("/" in n for n in names.values()):
        return None
    return {c: n.split("/")[0] for c, n in names.items()}


def alphabet_folds(alphabet_of: dict[int, str], val_fraction: float, seed: int = 0) -> list[list[str]]:
    """The validation folds of whole alphabets: class-disjoint groups of consecutive alphabets in a seeded order.

    From the start of the order, each fold takes the next m >= 1 alphabets whose share of the classes is closest
    to ``val_fraction`` (the smaller m on a tie), while at least one alphabet is left to fit on. Folds follow one
    another until the alphabets left hold less than half a fold's share; those are in no fold (always fit).
    Fold 0 is the first group: the split of every trial of a study.
    """
    counts = Counter(alphabet_of.values())
    names = sorted(counts)
    order = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    target, folds, start = val_fraction * len(alphabet_of), [], 0
    while start < len(order) and (not folds or sum(counts[a] for a in order[start:]) >= target / 2):
        sizes = np.cumsum([counts[a] for a in order[start:]])
        if start == 0:
            sizes = sizes[:-1]  # fold 0 leaves an alphabet to fit on
        if len(sizes) == 0:
            break
        m = 1 + int(np.argmin(np.abs(sizes - target)))
        folds.append(order[start : start + m])
        start += m
    return folds


def split_alphabets(alphabet_of: dict[int, str], val_fraction: float, seed: int = 0, fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Cut the training classes into (fit classes, validation classes) along whole alphabets, seeded.

    The validation classes are those of ``alphabet_folds``' fold ``fold`` (at least 2 alphabets are needed;
    :func:`validation_split` says so to the user). Validation then measures what the test measures: retrieval
    among the characters of an alphabet never trained on.
    """
    folds = alphabet_folds(alphabet_of, val_fraction, seed)
    _check_fold(fold, len(folds), f"val_split=alphabets at val_fraction={val_fraction} of {len(set(alphabet_of.values()))} alphabets")
    held_out = set(folds[fold])
    val = np.array(sorted(c for c, a in alphabet_of.items() if a in held_out), dtype=np.int64)
    fit = np.array(sorted(c for c, a in alphabet_of.items() if a not in held_out), dtype=np.int64)
    return fit, val


def validation_folds(train: ImageSet, val_split: str, val_fraction: float) -> int:
    """How many class-disjoint validation folds the training set has (``val_fold`` takes 0 to this less 1)."""
    if val_split == "classes":
        n = len(train.classes)
        return n // max(held_out_classes(n, val_fraction), 1)
    alphabet_of = alphabets(train)
    return len(alphabet_folds(alphabet_of, val_fraction)) if alphabet_of else 0


def validation_split(train: ImageSet, val_split: str, val_fraction: float, where: str, fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(fit classes, validation classes) of a study's training set by config keys ``val_split`` and ``val_fold``
    (``fold``); ``where`` names the data."""
    if val_split == "classes":
        return split_classes(train.labels, val_fraction, fold=fold)
    alphabet_of = alphabets(train)
    if alphabet_of is None:
        raise DatasetError(
            f"{where}: val_split=alphabets needs class names 'alphabet/character' (as omniglot's); expected val_split: classes"
        )
    if len(set(alphabet_of.values())) < 2:
        raise DatasetError(f"{where}: val_split=alphabets needs at least 2 training alphabets; expected val_split: classes")
    fit, val = split_alphabets(alphabet_of, val_fraction, fold=fold)
    if len(val) < 2:
        raise DatasetError(f"{where}: val_split=alphabets holds out {len(val)} class; expected at least 2 validation classes")
    return fit, val


def dataset_label(name: str, data_root: str | os.PathLike | None) -> str:
    """How errors name a dataset: ``dataset 'folder' under /data``."""
    return f"dataset {name!r}" + (f" under {data_root}" if data_root and name != "synthetic" else "")


def check_retrieval_set(images: ImageSet, gallery: ImageSet | None, what: str) -> None:
    """The evaluated images must give retrieval metrics a value: raises DatasetError naming ``what`` otherwise.

    Without a gallery (every image queries the others) each class needs at least 2 images: a class of one
    has nothing to retrieve, is left out of R@k and MAP@R, and with only such classes the metrics are NaN.
    With a gallery, some query's class must be in it.
    """
    if gallery is not None:
        if not np.isin(images.labels, gallery.labels).any():
            raise DatasetError(f"{what}: no query class has an image in the gallery; expected the query classes in the gallery")
        return
    classes, counts = np.unique(images.labels, return_counts=True)
    lone = classes[counts < 2]
    if len(lone):
        shown = ", ".join(repr(images.names.get(int(c), int(c))) for c in lone[:3]) + (", ..." if len(lone) > 3 else "")
        raise DatasetError(
            f"{what}: {len(lone)} of {len(classes)} classes have a single image ({shown}); expected at least 2 images "
            "per evaluated class (retrieval metrics need another image of the query's class)"
        )

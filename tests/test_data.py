"""Tests of trainables.core.data: loaders on fabricated standard layouts, errors, splits, transforms.

Every dataset is fabricated in ``tmp_path`` in its standard on-disk layout with tiny images
(12x10 px photos, 105x105 grayscale glyphs), so the tests run in seconds and need no downloads.
The real Omniglot minimal split is checked too when the shared data folder (or
``$DML_DATA_ROOT``) holds it.
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import loadmat, savemat

from trainables.core.config import ConfigError, TrainConfig
from trainables.core.data import (
    DATASETS,
    DatasetError,
    DatasetSplits,
    ImageSet,
    alphabet_folds,
    load_dataset,
    split_alphabets,
    split_classes,
    synthetic_glyphs,
    validation_folds,
    validation_split,
)
from trainables.core.transforms import (
    CharacterImages,
    TorchImages,
    affine_batch,
    character_jitter,
    draw_jitter,
    eval_transform,
    image_dataset,
    keep_batch,
    preprocess_batch,
    to_tensor,
    train_transform,
)

# -- helpers ---------------------------------------------------------------------------------


def write_photo(path: Path, seed: int, size: tuple[int, int] = (12, 10)) -> None:
    """A tiny random-colour RGB image (width x height = size); format from the suffix."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(path)


def glyph_png(seed: int, size: int = 105) -> bytes:
    """A 105x105 'L' PNG: white ground with a dark random rectangle (an Omniglot-like glyph)."""
    rng = np.random.default_rng(seed)
    pixels = np.full((size, size), 255, dtype=np.uint8)
    y, x = rng.integers(10, size - 40, size=2)
    pixels[y : y + 30, x : x + 8] = 0
    buffer = io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, format="PNG")
    return buffer.getvalue()


def assert_one_line(error: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def assert_class_disjoint(splits: DatasetSplits) -> None:
    assert np.intersect1d(splits.train.classes, splits.test.classes).size == 0
    assert len(splits.train) > 0 and len(splits.test) > 0
    assert splits.train.labels.dtype == np.int64 and splits.test.labels.dtype == np.int64


# -- CUB-200-2011 ----------------------------------------------------------------------------

CUB_CLASSES = (1, 2, 100, 101, 150, 200)


def make_cub(root: Path, classes=CUB_CLASSES, per_class: int = 2) -> Path:
    base = root / "CUB_200_2011"
    images, labels = [], []
    image_id = 0
    for c in classes:
        folder = f"{c:03d}.Bird_{c}"
        for k in range(per_class):
            image_id += 1
            rel = f"{folder}/Bird_{c}_{k:04d}.jpg"
            write_photo(base / "images" / rel, seed=image_id)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {c}")
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    return base


def test_cub200_standard_split(tmp_path):
    base = make_cub(tmp_path)
    splits = load_dataset("cub200", tmp_path)
    assert_class_disjoint(splits)
    assert list(splits.train.classes) == [1, 2, 100]
    assert list(splits.test.classes) == [101, 150, 200]
    assert len(splits.train) == 6 and len(splits.test) == 6
    assert splits.train.kind == "photos" and splits.train.arrays is None
    assert splits.gallery is None
    assert splits.recall_ks == (1, 2, 4, 8)
    assert splits.default_image_size == 224
    # paths point at existing files of the right class, and load as (H, W, 3) uint8
    for images in (splits.train, splits.test):
        for i, path in enumerate(images.paths):
            assert Path(path).is_file()
            assert Path(path).parent.name == f"{images.labels[i]:03d}.Bird_{images.labels[i]}"
            assert Path(path).is_relative_to(base / "images")
        image = images.load(0)
        assert image.dtype == np.uint8 and image.shape == (10, 12, 3)


def test_cub200_malformed_images_txt(tmp_path):
    base = make_cub(tmp_path)
    lines = (base / "images.txt").read_text().splitlines()
    lines[2] = "3"  # the path column is missing
    (base / "images.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError) as error:
        load_dataset("cub200", tmp_path)
    assert_one_line(error, str(base / "images.txt"), ":3:", "expected 2 columns")


def test_cub200_missing_label(tmp_path):
    base = make_cub(tmp_path)
    lines = (base / "image_class_labels.txt").read_text().splitlines()
    del lines[4]  # image id 5 has no label
    (base / "image_class_labels.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError) as error:
        load_dataset("cub200", tmp_path)
    assert_one_line(error, str(base / "image_class_labels.txt"), "no label for image id 5")


def test_cub200_non_integer_class(tmp_path):
    base = make_cub(tmp_path)
    lines = (base / "image_class_labels.txt").read_text().splitlines()
    lines[0] = "1 one"
    (base / "image_class_labels.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError) as error:
        load_dataset("cub200", tmp_path)
    assert_one_line(error, str(base / "image_class_labels.txt"), "'one'", "not an integer")


def test_cub200_missing_table(tmp_path):
    base = make_cub(tmp_path)
    (base / "images.txt").unlink()
    with pytest.raises(DatasetError) as error:
        load_dataset("cub200", tmp_path)
    assert_one_line(error, str(base / "images.txt"), "not found")


def test_cub200_only_training_classes(tmp_path):
    make_cub(tmp_path, classes=(1, 2, 3))
    with pytest.raises(DatasetError) as error:
        load_dataset("cub200", tmp_path)
    assert_one_line(error, "expected images in both the train and the test classes")


# -- Cars196 ---------------------------------------------------------------------------------

CARS_CLASSES = (1, 2, 98, 99, 150, 196)


def make_cars(root: Path, classes=CARS_CLASSES, per_class: int = 2, extra: tuple[tuple[str, int], ...] = ()) -> Path:
    """Stanford Cars' layout; ``extra`` adds (relative path, class) rows after the standard ones."""
    base = root / "cars196"
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    rows = [(f"car_ims/{i + 1:06d}.jpg", c) for i, c in enumerate(c for c in classes for _ in range(per_class))]
    rows += extra
    table = np.zeros((1, len(rows)), dtype=[(f, object) for f in fields])
    for i, (rel, c) in enumerate(rows):
        write_photo(base / rel, seed=100 + i)
        table[0, i] = (
            rel,
            np.array([[1]], dtype=np.uint8),
            np.array([[1]], dtype=np.uint8),
            np.array([[11]], dtype=np.uint8),
            np.array([[9]], dtype=np.uint8),
            np.array([[c]], dtype=np.uint8),
            np.array([[i % 2]], dtype=np.uint8),
        )
    savemat(base / "cars_annos.mat", {"annotations": table})
    return base


def test_cars196_fixture_matches_stanford_format(tmp_path):
    base = make_cars(tmp_path)
    annotations = loadmat(base / "cars_annos.mat")["annotations"]
    assert annotations.shape == (1, 12)
    assert annotations[0][0]["relative_im_path"][0] == "car_ims/000001.jpg"
    assert annotations[0][0]["class"].shape == (1, 1) and annotations[0][0]["class"][0, 0] == 1


def test_cars196_standard_split(tmp_path):
    base = make_cars(tmp_path)
    splits = load_dataset("cars196", tmp_path)
    assert_class_disjoint(splits)
    assert list(splits.train.classes) == [1, 2, 98]
    assert list(splits.test.classes) == [99, 150, 196]
    assert len(splits.train) == 6 and len(splits.test) == 6
    assert splits.recall_ks == (1, 2, 4, 8)
    assert splits.train.paths[0] == str(base / "car_ims" / "000001.jpg")
    assert splits.test.paths[0] == str(base / "car_ims" / "000007.jpg")
    assert all(Path(p).is_file() for p in splits.train.paths + splits.test.paths)
    assert splits.test.load(5).shape == (10, 12, 3)


def test_cars196_wrong_mat(tmp_path):
    base = tmp_path / "cars196"
    base.mkdir()
    savemat(base / "cars_annos.mat", {"something_else": np.zeros((2, 2))})
    with pytest.raises(DatasetError) as error:
        load_dataset("cars196", tmp_path)
    assert_one_line(error, str(base / "cars_annos.mat"), "annotations")


def test_cars196_missing_mat(tmp_path):
    (tmp_path / "cars196").mkdir()
    with pytest.raises(DatasetError) as error:
        load_dataset("cars196", tmp_path)
    assert_one_line(error, str(tmp_path / "cars196" / "cars_annos.mat"), "not found")


# -- Stanford Online Products ----------------------------------------------------------------

SOP_HEADER = "image_id class_id super_class_id path"


def make_sop(root: Path, train_classes=(1, 2, 3), test_classes=(4, 5), per_class: int = 2) -> Path:
    base = root / "Stanford_Online_Products"
    image_id = 0
    for name, classes in (("Ebay_train.txt", train_classes), ("Ebay_test.txt", test_classes)):
        rows = [SOP_HEADER]
        for c in classes:
            super_name = "bicycle_final" if c % 2 else "chair_final"
            for k in range(per_class):
                image_id += 1
                rel = f"{super_name}/{111085122870 + c}_{k}.JPG"
                write_photo(base / rel, seed=200 + image_id)
                rows.append(f"{image_id} {c} {1 + c % 2} {rel}")
        (base / name).write_text("\n".join(rows) + "\n")
    return base


def test_sop_standard_split(tmp_path):
    base = make_sop(tmp_path)
    splits = load_dataset("sop", tmp_path)
    assert_class_disjoint(splits)
    assert list(splits.train.classes) == [1, 2, 3]
    assert list(splits.test.classes) == [4, 5]
    assert len(splits.train) == 6 and len(splits.test) == 4
    assert splits.recall_ks == (1, 10, 100)
    assert splits.train.paths[0] == str(base / "bicycle_final" / "111085122871_0.JPG")
    assert all(Path(p).is_file() for p in splits.train.paths + splits.test.paths)
    assert splits.train.load(0).shape == (10, 12, 3)


def test_sop_overlapping_classes(tmp_path):
    base = make_sop(tmp_path, train_classes=(1, 2, 3), test_classes=(3, 4))
    with pytest.raises(DatasetError) as error:
        load_dataset("sop", tmp_path)
    assert_one_line(error, str(base), "share classes")


def test_sop_short_row(tmp_path):
    base = make_sop(tmp_path)
    text = (base / "Ebay_test.txt").read_text().splitlines()
    text[2] = "8 4 1"
    (base / "Ebay_test.txt").write_text("\n".join(text) + "\n")
    with pytest.raises(DatasetError) as error:
        load_dataset("sop", tmp_path)
    assert_one_line(error, f"{base / 'Ebay_test.txt'}:3:", "expected 4 columns")


# -- In-shop ---------------------------------------------------------------------------------

INSHOP_ROWS = [
    ("img/WOMEN/Dresses/id_00000002/02_1_front.jpg", "id_00000002", "train"),
    ("img/WOMEN/Dresses/id_00000002/02_2_side.jpg", "id_00000002", "train"),
    ("img/MEN/Denim/id_00000003/01_1_front.jpg", "id_00000003", "train"),
    ("img/MEN/Denim/id_00000003/01_2_side.jpg", "id_00000003", "train"),
    ("img/WOMEN/Tees_Tanks/id_00000010/01_1_front.jpg", "id_00000010", "query"),
    ("img/WOMEN/Tees_Tanks/id_00000010/01_2_side.jpg", "id_00000010", "gallery"),
    ("img/WOMEN/Tees_Tanks/id_00000010/01_3_back.jpg", "id_00000010", "gallery"),
    ("img/MEN/Shirts_Polos/id_00000012/02_1_front.jpg", "id_00000012", "query"),
    ("img/MEN/Shirts_Polos/id_00000012/02_2_side.jpg", "id_00000012", "query"),
    ("img/MEN/Shirts_Polos/id_00000012/02_4_full.jpg", "id_00000012", "gallery"),
]


def make_inshop(root: Path, rows=INSHOP_ROWS) -> Path:
    base = root / "inshop"
    lines = [str(len(rows)), "image_name item_id evaluation_status"]
    for i, (rel, item, status) in enumerate(rows):
        write_photo(base / rel, seed=300 + i)
        lines.append(f"{rel} {item} {status}")
    (base / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return base


def test_inshop_query_gallery_split(tmp_path):
    base = make_inshop(tmp_path)
    splits = load_dataset("inshop", tmp_path)
    assert splits.recall_ks == (1, 10, 20, 30)
    assert splits.gallery is not None

    def expected(status):
        return [str(base / rel) for rel, _, s in INSHOP_ROWS if s == status]

    assert splits.train.paths == expected("train")
    assert splits.test.paths == expected("query")
    assert splits.gallery.paths == expected("gallery")
    # the same item id gets the same label in query and gallery; train items are other items
    item_of = {str(base / rel): item for rel, item, _ in INSHOP_ROWS}
    label_of_item = {}
    for images in (splits.train, splits.test, splits.gallery):
        for path, label in zip(images.paths, images.labels):
            assert label_of_item.setdefault(item_of[path], int(label)) == int(label)
    assert len(set(label_of_item.values())) == 4
    assert set(splits.test.classes) == set(splits.gallery.classes)
    assert np.intersect1d(splits.train.classes, splits.test.classes).size == 0
    assert np.intersect1d(splits.train.classes, splits.gallery.classes).size == 0
    assert splits.gallery.load(0).shape == (10, 12, 3)


def test_inshop_bad_status(tmp_path):
    rows = [*INSHOP_ROWS[:3], (INSHOP_ROWS[3][0], INSHOP_ROWS[3][1], "val"), *INSHOP_ROWS[4:]]
    base = make_inshop(tmp_path, rows)
    with pytest.raises(DatasetError) as error:
        load_dataset("inshop", tmp_path)
    # data row 4 is line 6 of the file (after the count and the header)
    assert_one_line(error, f"{base / 'list_eval_partition.txt'}:6:", "'val'", "train, query or gallery")


def test_inshop_without_gallery(tmp_path):
    base = make_inshop(tmp_path, [r for r in INSHOP_ROWS if r[2] != "gallery"])
    with pytest.raises(DatasetError) as error:
        load_dataset("inshop", tmp_path)
    assert_one_line(error, str(base / "list_eval_partition.txt"), "gallery")


# -- folder ----------------------------------------------------------------------------------


def make_folder(root: Path, train=("cat", "dog", "eel"), test=("fox", "gnu"), per_class: int = 2) -> Path:
    seed = 400
    for part, classes in (("train", train), ("test", test)):
        (root / part).mkdir(parents=True, exist_ok=True)
        for c in classes:
            for k in range(per_class):
                seed += 1
                write_photo(root / part / c / f"{k}.png", seed=seed)
    return root


def test_folder_split(tmp_path):
    make_folder(tmp_path)
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "train" / "README").write_text("a file, not a class folder")
    splits = load_dataset("folder", tmp_path)
    assert_class_disjoint(splits)
    assert len(splits.train) == 6 and len(splits.test) == 4
    assert len(splits.train.classes) == 3 and len(splits.test.classes) == 2
    assert splits.recall_ks == (1, 2, 4, 8)
    names = splits.train.names
    assert sorted(names[int(c)] for c in splits.train.classes) == ["cat", "dog", "eel"]
    assert sorted(names[int(c)] for c in splits.test.classes) == ["fox", "gnu"]
    for images in (splits.train, splits.test):
        for path, label in zip(images.paths, images.labels):
            assert Path(path).parent.name == names[int(label)]
            assert Path(path).suffix == ".png"
    assert splits.test.load(0).shape == (10, 12, 3)


def test_folder_empty_train(tmp_path):
    make_folder(tmp_path, train=())
    with pytest.raises(DatasetError) as error:
        load_dataset("folder", tmp_path)
    assert_one_line(error, str(tmp_path / "train"), "no images")


def test_folder_missing_test(tmp_path):
    make_folder(tmp_path, test=())
    (tmp_path / "test").rmdir()
    with pytest.raises(DatasetError) as error:
        load_dataset("folder", tmp_path)
    assert_one_line(error, str(tmp_path / "test"), "not found")


def test_folder_class_in_both(tmp_path):
    make_folder(tmp_path, train=("cat", "dog"), test=("dog", "fox"))
    with pytest.raises(DatasetError) as error:
        load_dataset("folder", tmp_path)
    assert_one_line(error, str(tmp_path), "'dog'", "both train/ and test/")


def test_folder_single_test_class(tmp_path):
    make_folder(tmp_path, test=("fox",))
    with pytest.raises(DatasetError) as error:
        load_dataset("folder", tmp_path)
    assert_one_line(error, "test split", "1 class", "at least 2")


def test_folder_test_is_a_file(tmp_path):
    make_folder(tmp_path, test=())
    (tmp_path / "test").rmdir()
    (tmp_path / "test").write_text("not a folder")
    with pytest.raises(DatasetError) as error:
        load_dataset("folder", tmp_path)
    assert_one_line(error, str(tmp_path / "test"))


def test_corrupt_image_raises_on_load(tmp_path):
    make_folder(tmp_path)
    bad = tmp_path / "train" / "dog" / "9.png"
    bad.write_bytes(b"\x00garbage, not a PNG\xff" * 7)
    splits = load_dataset("folder", tmp_path)  # files are read on demand
    index = splits.train.paths.index(str(bad))
    with pytest.raises(DatasetError) as error:
        splits.train.load(index)
    assert_one_line(error, str(bad), "unreadable image")
    # the torch dataset surfaces the same error
    with pytest.raises(DatasetError):
        TorchImages(splits.train, eval_transform("photos", 8))[index]


# -- data root / unknown dataset -------------------------------------------------------------


def test_missing_data_root(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as error:
        load_dataset("cub200", missing)
    assert_one_line(error, str(missing), "not a directory")


def test_no_data_root(monkeypatch):
    monkeypatch.delenv("DML_DATA_ROOT", raising=False)
    with pytest.raises(DatasetError) as error:
        load_dataset("sop", None)
    assert_one_line(error, "--data-root", "DML_DATA_ROOT")


def test_data_root_from_environment(tmp_path, monkeypatch):
    make_sop(tmp_path)
    monkeypatch.setenv("DML_DATA_ROOT", str(tmp_path))
    assert list(load_dataset("sop", None).test.classes) == [4, 5]


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("cub200", "CUB_200_2011"),
        ("cars196", "cars196"),
        ("sop", "Stanford_Online_Products"),
        ("inshop", "inshop"),
        ("omniglot", "omniglot"),
    ],
)
def test_missing_dataset_folder(tmp_path, name, folder):
    with pytest.raises(DatasetError) as error:
        load_dataset(name, tmp_path)
    assert_one_line(error, str(tmp_path / folder))


def test_unknown_dataset(tmp_path):
    with pytest.raises(DatasetError) as error:
        load_dataset("imagenet", tmp_path)
    assert_one_line(error, "'imagenet'", "omniglot")


def test_config_allows_exactly_the_registered_datasets():
    for name in DATASETS:
        assert TrainConfig.from_dict({"dataset": name}).dataset == name
    with pytest.raises(ConfigError, match="dataset='imagenet'.*one of " + ", ".join(DATASETS)):
        TrainConfig.from_dict({"dataset": "imagenet"})


def test_dataset_error_is_value_error():
    assert issubclass(DatasetError, ValueError)


# -- synthetic -------------------------------------------------------------------------------


def test_synthetic_without_data_root(monkeypatch):
    monkeypatch.delenv("DML_DATA_ROOT", raising=False)
    splits = load_dataset("synthetic", None)
    assert_class_disjoint(splits)
    assert splits.gallery is None
    assert splits.default_image_size == 32
    for images in (splits.train, splits.test):
        assert images.kind == "characters" and images.paths is None
        assert images.arrays.dtype == np.uint8
        assert images.arrays.shape == (len(images), 32, 32)
        assert images.load(0).shape == (32, 32)
    assert len(splits.train.classes) >= 2 and len(splits.test.classes) >= 2
    assert set(splits.train.classes.tolist()) | set(splits.test.classes.tolist()) == set(range(40))


def test_synthetic_glyphs_deterministic_and_dark_on_light():
    x, y = synthetic_glyphs(3, 2, 16, seed=5)
    assert x.shape == (6, 16, 16) and x.dtype == np.uint8
    assert y.tolist() == [0, 0, 1, 1, 2, 2]
    np.testing.assert_array_equal(x, synthetic_glyphs(3, 2, 16, seed=5)[0])
    assert not np.array_equal(x, synthetic_glyphs(3, 2, 16, seed=6)[0])
    assert np.median(x) > 200 and x.min() < 100  # light ground, dark strokes


# -- Omniglot --------------------------------------------------------------------------------

SMALL1 = ("Greek", "Latin", "Balinese")
SMALL2 = ("Greek", "Latin", "Tagalog", "Sanskrit")
CHARACTERS, DRAWINGS = 2, 3


def omniglot_entries(name: str, alphabets) -> dict[str, bytes]:
    entries = {}
    seed = 0 if name.endswith("1") else 1000
    for alphabet in alphabets:
        for c in range(1, CHARACTERS + 1):
            for d in range(1, DRAWINGS + 1):
                seed += 1
                entries[f"{name}/{alphabet}/character{c:02d}/{c:04d}_{d:02d}.png"] = glyph_png(seed)
    return entries


def make_omniglot(root: Path, extracted: bool = False) -> Path:
    base = root / "omniglot"
    base.mkdir(parents=True, exist_ok=True)
    for name, alphabets in (("images_background_small1", SMALL1), ("images_background_small2", SMALL2)):
        entries = omniglot_entries(name, alphabets)
        if extracted:
            for rel, data in entries.items():
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                (base / rel).write_bytes(data)
        else:
            with zipfile.ZipFile(base / f"{name}.zip", "w") as zf:
                directories = sorted({rel.rsplit("/", i)[0] + "/" for rel in entries for i in (1, 2, 3)})
                for directory in directories:  # like the real zips: directory entries too
                    zf.writestr(directory, b"")
                for rel, data in entries.items():
                    zf.writestr(rel, data)
    return base


def class_names(images: ImageSet) -> list[str]:
    return sorted(images.names[int(c)] for c in images.classes)


EXPECTED_TRAIN = sorted(f"{a}/character{c:02d}" for a in SMALL1 for c in range(1, CHARACTERS + 1))
EXPECTED_TEST = sorted(f"{a}/character{c:02d}" for a in ("Tagalog", "Sanskrit") for c in range(1, CHARACTERS + 1))


def check_omniglot(splits: DatasetSplits) -> None:
    assert_class_disjoint(splits)
    assert class_names(splits.train) == EXPECTED_TRAIN
    assert class_names(splits.test) == EXPECTED_TEST
    assert len(splits.train) == len(SMALL1) * CHARACTERS * DRAWINGS
    assert len(splits.test) == 2 * CHARACTERS * DRAWINGS
    for images in (splits.train, splits.test):
        assert images.kind == "characters" and images.paths is None
        assert images.arrays.dtype == np.uint8
        assert images.arrays.shape == (len(images), 32, 32)
        # white ground with dark ink survives the resize
        assert images.arrays[:, 0, 0].min() == 255
        assert images.arrays.reshape(len(images), -1).min(axis=1).max() < 128
        assert np.bincount(images.labels)[images.classes].tolist() == [DRAWINGS] * len(images.classes)
    assert splits.default_image_size == 32


def test_omniglot_zips(tmp_path):
    make_omniglot(tmp_path)
    check_omniglot(load_dataset("omniglot", tmp_path))


def test_omniglot_extracted_folders_give_the_same_classes(tmp_path):
    make_omniglot(tmp_path / "zipped")
    make_omniglot(tmp_path / "extracted", extracted=True)
    zipped = load_dataset("omniglot", tmp_path / "zipped")
    extracted = load_dataset("omniglot", tmp_path / "extracted")
    check_omniglot(extracted)
    for part in ("train", "test"):
        a, b = getattr(zipped, part), getattr(extracted, part)
        assert class_names(a) == class_names(b)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.arrays, b.arrays)


def test_omniglot_image_size(tmp_path):
    make_omniglot(tmp_path)
    splits = load_dataset("omniglot", tmp_path, image_size=28)
    assert splits.train.arrays.shape[1:] == (28, 28)
    assert splits.test.arrays.shape[1:] == (28, 28)


def test_omniglot_zip_missing(tmp_path):
    base = make_omniglot(tmp_path)
    (base / "images_background_small2.zip").unlink()
    with pytest.raises(DatasetError) as error:
        load_dataset("omniglot", tmp_path)
    assert_one_line(error, "images_background_small2.zip", "--data-root", "--download")


def test_omniglot_not_a_zip(tmp_path):
    base = make_omniglot(tmp_path)
    (base / "images_background_small1.zip").write_bytes(b"this is not a zip archive" * 10)
    with pytest.raises(DatasetError) as error:
        load_dataset("omniglot", tmp_path)
    assert_one_line(error, str(base / "images_background_small1.zip"), "zip")


def test_omniglot_corrupt_png_in_zip(tmp_path):
    base = tmp_path / "omniglot"
    make_omniglot(tmp_path)
    entries = omniglot_entries("images_background_small1", SMALL1)
    bad = "images_background_small1/Latin/character01/0001_02.png"
    entries[bad] = b"garbage bytes"
    with zipfile.ZipFile(base / "images_background_small1.zip", "w") as zf:
        for rel, data in entries.items():
            zf.writestr(rel, data)
    with pytest.raises(DatasetError) as error:
        load_dataset("omniglot", tmp_path)
    assert_one_line(error, "Latin/character01/0001_02.png", "unreadable image")


def test_omniglot_corrupt_png_in_extracted_folder_names_the_file(tmp_path):
    base = make_omniglot(tmp_path, extracted=True)
    bad = base / "images_background_small1" / "Latin" / "character01" / "0001_02.png"
    bad.write_bytes(b"garbage bytes")
    with pytest.raises(DatasetError) as error:
        load_dataset("omniglot", tmp_path)
    assert_one_line(error, "unreadable image")
    assert str(error.value).startswith(f"{bad}:")
    assert ".zip" not in str(error.value)


def test_omniglot_zip_with_top_level_png(tmp_path):
    base = make_omniglot(tmp_path)
    with zipfile.ZipFile(base / "images_background_small1.zip", "a") as zf:
        zf.writestr("stray.png", glyph_png(0))
    try:
        splits = load_dataset("omniglot", tmp_path)
    except DatasetError as error:  # rejecting the layout is fine too, as a DatasetError
        assert "images_background_small1.zip" in str(error)
    else:
        check_omniglot(splits)  # or the stray entry is skipped like other off-layout entries


# -- hidden files and folders (names starting with '.') are never images of the dataset -------------------------------
# Jupyter's .ipynb_checkpoints/ beside the class folders became a class of its own; macOS's ._name.jpg metadata files
# are listed beside the images they describe and do not decode.


def hidden_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trainables.core.data" and "hidden" in r.getMessage()]


def load_logged(caplog: pytest.LogCaptureFixture, name: str, root: Path) -> DatasetSplits:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainables.core.data"):
        return load_dataset(name, root)


def assert_skipped(caplog: pytest.LogCaptureFixture, count: int, root: Path) -> None:
    """One line for the load says how many hidden images it skipped, and under which data root."""
    lines = hidden_lines(caplog)
    assert len(lines) == 1, lines
    assert f"skipped {count} hidden images" in lines[0] and str(root) in lines[0], lines[0]


def test_folder_skips_hidden_files_and_folders(tmp_path, caplog):
    make_folder(tmp_path)
    load_logged(caplog, "folder", tmp_path)
    assert hidden_lines(caplog) == []  # nothing hidden: nothing said
    for k in range(3):
        write_photo(tmp_path / "train" / ".ipynb_checkpoints" / f"{k}-checkpoint.png", seed=900 + k)
    (tmp_path / "train" / "cat" / "._0.png").write_bytes(b"\x00\x05\x16\x07 macOS metadata, not a PNG")
    write_photo(tmp_path / "test" / ".Trash" / "0.png", seed=903)
    (tmp_path / "test" / "fox" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")  # not an image: not counted
    splits = load_logged(caplog, "folder", tmp_path)
    assert class_names(splits.train) == ["cat", "dog", "eel"] and class_names(splits.test) == ["fox", "gnu"]
    assert len(splits.train) == 6 and len(splits.test) == 4
    assert not any("/." in path for path in splits.train.paths + splits.test.paths)
    assert_skipped(caplog, 5, tmp_path)  # 3 checkpoints + ._0.png + .Trash/0.png


OMNIGLOT_HIDDEN = {
    "images_background_small1/.ipynb_checkpoints/character01/0001_01.png": glyph_png(901),  # alphabet '.ipynb_checkpoints'
    "images_background_small1/Latin/.ipynb_checkpoints/0001_01-checkpoint.png": glyph_png(902),  # character of Latin
    "images_background_small2/Tagalog/character01/._0001_01.png": b"\x00\x05\x16\x07 macOS metadata, not a PNG",
}


@pytest.mark.parametrize("extracted", [False, True], ids=["zips", "folders"])
def test_omniglot_skips_hidden_files_and_folders(tmp_path, caplog, extracted):
    base = make_omniglot(tmp_path, extracted=extracted)
    for rel, data in OMNIGLOT_HIDDEN.items():
        if extracted:
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_bytes(data)
        else:
            with zipfile.ZipFile(base / f"{rel.split('/')[0]}.zip", "a") as zf:
                zf.writestr(rel, data)
    check_omniglot(load_logged(caplog, "omniglot", tmp_path))
    assert_skipped(caplog, 3, tmp_path)


# cub200, cars196, sop and inshop list their images: a listed path through a hidden file or folder is skipped


def list_hidden(base: Path, table: str, rows: dict[str, str], images: str = ".") -> None:
    """Append ``rows`` ({image path below ``base/images``: its row}) to the list file ``base/table``; each image is readable."""
    for seed, rel in enumerate(rows, start=910):
        write_photo(base / images / rel, seed=seed)
    with (base / table).open("a") as f:
        f.write("".join(f"{row}\n" for row in rows.values()))


def test_cub200_skips_listed_hidden_files(tmp_path, caplog):
    cub = make_cub(tmp_path)
    hidden = ("001.Bird_1/.ipynb_checkpoints/Bird_1_0000-checkpoint.jpg", "150.Bird_150/._Bird_150_0000.jpg")
    list_hidden(cub, "images.txt", {hidden[0]: f"13 {hidden[0]}", hidden[1]: f"14 {hidden[1]}"}, images="images")
    (cub / "image_class_labels.txt").write_text((cub / "image_class_labels.txt").read_text() + "13 1\n14 150\n")
    splits = load_logged(caplog, "cub200", tmp_path)
    assert (len(splits.train), len(splits.test)) == (6, 6)
    assert_skipped(caplog, 2, tmp_path)


def test_cars196_skips_listed_hidden_files(tmp_path, caplog):
    make_cars(tmp_path, extra=(("car_ims/.ipynb_checkpoints/000001-checkpoint.jpg", 1), ("car_ims/._000012.jpg", 196)))
    splits = load_logged(caplog, "cars196", tmp_path)
    assert (len(splits.train), len(splits.test)) == (6, 6)
    assert_skipped(caplog, 2, tmp_path)


def test_sop_skips_listed_hidden_files(tmp_path, caplog):
    rel = "bicycle_final/.ipynb_checkpoints/111085122871_0-checkpoint.JPG"
    list_hidden(make_sop(tmp_path), "Ebay_train.txt", {rel: f"99 1 2 {rel}"})
    splits = load_logged(caplog, "sop", tmp_path)
    assert (len(splits.train), len(splits.test)) == (6, 4)
    assert_skipped(caplog, 1, tmp_path)


def test_inshop_skips_listed_hidden_files(tmp_path, caplog):
    hidden = [
        ("img/WOMEN/Dresses/id_00000002/.ipynb_checkpoints/02_1_front-checkpoint.jpg", "id_00000002", "train"),
        ("img/MEN/Shirts_Polos/id_00000012/._02_1_front.jpg", "id_00000012", "query"),
    ]
    base = make_inshop(tmp_path, INSHOP_ROWS[:5] + hidden + INSHOP_ROWS[5:])
    splits = load_logged(caplog, "inshop", tmp_path)
    assert splits.train.paths == [str(base / rel) for rel, _, s in INSHOP_ROWS if s == "train"]
    assert splits.test.paths == [str(base / rel) for rel, _, s in INSHOP_ROWS if s == "query"]
    assert_skipped(caplog, 2, tmp_path)


def shared_data_root() -> Path | None:
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    if (shared / "omniglot").is_dir():
        return shared
    env = os.environ.get("DML_DATA_ROOT")
    if env and (Path(env) / "omniglot").is_dir():
        return Path(env)
    return None


@pytest.mark.skipif(shared_data_root() is None, reason="no real Omniglot under shared/data or $DML_DATA_ROOT")
def test_real_omniglot_minimal_split():
    splits = load_dataset("omniglot", shared_data_root())
    assert_class_disjoint(splits)
    assert len(splits.train.classes) == 136 and len(splits.train) == 2720
    assert len(splits.test.classes) == 106 and len(splits.test) == 2120
    test_alphabets = {splits.test.names[int(c)].split("/")[0] for c in splits.test.classes}
    assert test_alphabets == {"Japanese_(katakana)", "Sanskrit", "Tagalog"}
    train_alphabets = {splits.train.names[int(c)].split("/")[0] for c in splits.train.classes}
    assert not train_alphabets & test_alphabets
    assert splits.train.arrays.shape == (2720, 32, 32) and splits.train.arrays.dtype == np.uint8
    assert splits.test.arrays.shape == (2120, 32, 32)


# -- split_classes ---------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "fraction"), [(10, 0.2), (20, 0.25), (136, 0.2), (7, 0.5)])
def test_split_classes_disjoint_and_complete(n, fraction):
    labels = np.repeat(np.arange(100, 100 + n), 3)
    fit, val = split_classes(labels, fraction, seed=3)
    assert np.intersect1d(fit, val).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([fit, val])), np.arange(100, 100 + n))
    assert len(val) == round(fraction * n)
    assert np.all(np.diff(fit) > 0) and np.all(np.diff(val) > 0)


def test_split_classes_seeded():
    labels = np.arange(50)
    fit_a, val_a = split_classes(labels, 0.3, seed=7)
    fit_b, val_b = split_classes(labels, 0.3, seed=7)
    np.testing.assert_array_equal(fit_a, fit_b)
    np.testing.assert_array_equal(val_a, val_b)
    _, val_c = split_classes(labels, 0.3, seed=8)
    assert not np.array_equal(val_a, val_c)


def test_split_classes_depends_only_on_classes():
    a = split_classes(np.repeat(np.arange(20), 2), 0.25, seed=1)
    b = split_classes(np.arange(20)[::-1], 0.25, seed=1)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize(("n", "fraction"), [(3, 0.5), (10, 0.05), (10, 0.9), (2, 0.5)])
def test_split_classes_too_few(n, fraction):
    with pytest.raises(DatasetError) as error:
        split_classes(np.arange(n), fraction)
    assert_one_line(error, "val_fraction", "at least 2")


# -- validation folds (config key val_fold; the race of study.search.race) -------------------------------------------


def test_class_folds_are_class_disjoint_seeded_and_fold_0_is_the_studys_split():
    labels = np.repeat(np.arange(200, 336), 2)  # 136 classes, val_fraction 0.2: folds of 27, 136 // 27 = 5 folds
    classes = np.arange(200, 336)
    images = ImageSet(labels, "characters", arrays=np.zeros((272, 4, 4), np.uint8))
    assert validation_folds(images, "classes", 0.2) == 5
    vals = []
    for fold in range(5):
        fit, val = split_classes(labels, 0.2, seed=3, fold=fold)
        assert len(val) == 27 and np.intersect1d(fit, val).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([fit, val])), classes)
        vals.append(set(val.tolist()))
    assert all(not vals[i] & vals[j] for i in range(5) for j in range(i + 1, 5))  # class-disjoint folds
    assert len(set().union(*vals)) == 135  # one class (136 mod 27) is in no fold: always fit
    # fold 0 is the split every trial is scored on: the first 27 of the seeded order, as before folds existed
    assert vals[0] == set(np.random.default_rng(3).permutation(classes)[:27].tolist())
    assert split_classes(labels, 0.2, seed=3, fold=2)[1].tolist() == split_classes(labels, 0.2, seed=3, fold=2)[1].tolist()
    assert split_classes(labels, 0.2, seed=4, fold=2)[1].tolist() != split_classes(labels, 0.2, seed=3, fold=2)[1].tolist()
    with pytest.raises(DatasetError) as error:
        split_classes(labels, 0.2, fold=5)
    assert_one_line(error, "val_fold=5", "5 validation fold(s)", "0..4")


def test_alphabet_folds_hold_out_whole_alphabets_one_group_after_another():
    alphabet_of = alphabet_classes({name: 2 for name in "ABCDE"})  # 10 classes, 0.2: one alphabet per fold
    images = ImageSet(
        np.array(sorted(alphabet_of)), "characters", arrays=np.zeros((10, 4, 4), np.uint8),
        names={c: f"{a}/c{c}" for c, a in alphabet_of.items()},
    )  # fmt: skip
    assert validation_folds(images, "alphabets", 0.2) == 5
    held = [{alphabet_of[int(c)] for c in split_alphabets(alphabet_of, 0.2, seed=1, fold=f)[1]} for f in range(5)]
    assert all(len(h) == 1 for h in held) and set().union(*held) == set("ABCDE")  # each alphabet held out once
    order = [sorted("ABCDE")[i] for i in np.random.default_rng(1).permutation(5)]
    assert held == [{a} for a in order]  # fold f: the f-th alphabet of the seeded order; fold 0 as before folds existed
    with pytest.raises(DatasetError) as error:
        split_alphabets(alphabet_of, 0.2, fold=5)
    assert_one_line(error, "val_fold=5", "val_split=alphabets")


def test_alphabet_folds_leave_a_short_tail_to_fit_on():
    # 12 classes, 0.25: a fold's share is 3 classes. Alphabets of 3, 3, 3, 1, 1, 1 classes in some seeded order:
    # every fold is near 3 classes and what is left after the last fold holds under 1.5
    alphabet_of = alphabet_classes({"A": 3, "B": 3, "C": 3, "D": 1, "E": 1, "F": 1})
    for seed in range(8):
        folds = alphabet_folds(alphabet_of, 0.25, seed=seed)
        flat = [a for fold in folds for a in fold]
        assert len(flat) == len(set(flat))  # disjoint
        sizes = [sum(3 if a in "ABC" else 1 for a in fold) for fold in folds]
        assert all(2 <= size <= 4 for size in sizes), (seed, folds)
        assert sum(3 if a in "ABC" else 1 for a in set("ABCDEF") - set(flat)) < 1.5


# -- ImageSet --------------------------------------------------------------------------------


def test_imageset_subset_and_with_classes():
    arrays = np.arange(6 * 4 * 4, dtype=np.uint8).reshape(6, 4, 4)
    images = ImageSet(np.array([5, 5, 7, 7, 9, 9]), "characters", arrays=arrays, names={5: "a"})
    sub = images.with_classes(np.array([7, 9]))
    assert sub.labels.tolist() == [7, 7, 9, 9]
    np.testing.assert_array_equal(sub.arrays, arrays[2:])
    assert sub.names == {5: "a"} and sub.kind == "characters"
    paths = ImageSet(np.array([1, 2, 3]), "photos", paths=["a", "b", "c"]).subset(np.array([2, 0]))
    assert paths.paths == ["c", "a"] and paths.labels.tolist() == [3, 1] and paths.arrays is None
    np.testing.assert_array_equal(images.classes, [5, 7, 9])
    assert len(images) == 6


# -- transforms ------------------------------------------------------------------------------


def test_preprocess_characters():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(4, 105, 105), dtype=np.uint8)
    out = preprocess_batch(images, "characters", 32)
    assert out.shape == (4, 1, 32, 32) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    # normalized with mean 0.5, std 0.5: inside [-1, 1]
    assert out.min() >= -1.0 - 1e-5 and out.max() <= 1.0 + 1e-5


def test_preprocess_blank_characters_are_minus_one():
    out = preprocess_batch(np.full((2, 105, 105), 255, dtype=np.uint8), "characters", 32)
    torch.testing.assert_close(out, torch.full((2, 1, 32, 32), -1.0))


@pytest.mark.parametrize(("h", "w", "size"), [(10, 12, 16), (300, 200, 224), (64, 64, 32)])
def test_preprocess_photos(h, w, size):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(3, h, w, 3), dtype=np.uint8)
    out = preprocess_batch(images, "photos", size)
    assert out.shape == (3, 3, size, size) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_preprocess_rejects_non_uint8_and_bad_shapes():
    with pytest.raises(ValueError):
        preprocess_batch(np.zeros((2, 32, 32), dtype=np.float32), "characters", 32)
    with pytest.raises(ValueError):
        preprocess_batch(np.zeros((32, 32), dtype=np.uint8), "characters", 32)
    with pytest.raises(ValueError):
        preprocess_batch(np.zeros((1, 2, 8, 8, 3), dtype=np.uint8), "photos", 8)


def test_to_tensor_inverts_characters():
    array = np.array([[255, 0], [128, 255]], dtype=np.uint8)
    out = to_tensor(array, "characters")
    assert out.shape == (1, 2, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out[0], torch.tensor([[0.0, 1.0], [127 / 255, 0.0]]))


def test_to_tensor_photos():
    gray = np.full((4, 5), 51, dtype=np.uint8)
    out = to_tensor(gray, "photos")
    assert out.shape == (3, 4, 5)
    torch.testing.assert_close(out, torch.full((3, 4, 5), 0.2))
    rgba = np.zeros((4, 5, 4), dtype=np.uint8)
    rgba[..., 0] = 255
    out = to_tensor(rgba, "photos")
    assert out.shape == (3, 4, 5)
    assert out[0].eq(1).all() and out[1:].eq(0).all()
    rgb = np.zeros((4, 5, 3), dtype=np.uint8)
    rgb[..., 2] = 255
    out = to_tensor(rgb, "photos")
    assert out[2].eq(1).all() and out[:2].eq(0).all()


# -- TorchImages -----------------------------------------------------------------------------


def test_torch_images_maps_labels():
    arrays = np.full((4, 20, 20), 255, dtype=np.uint8)
    images = ImageSet(np.array([10, 10, 30, 30]), "characters", arrays=arrays)
    dataset = TorchImages(images, eval_transform("characters", 16), label_index={10: 0, 30: 1})
    assert len(dataset) == 4
    image, label = dataset[2]
    assert isinstance(label, int) and label == 1
    assert image.shape == (1, 16, 16)
    # without a label_index the dataset's own class id comes back
    assert TorchImages(images, eval_transform("characters", 16))[3][1] == 30


def test_torch_images_reads_photo_files(tmp_path):
    make_folder(tmp_path)
    splits = load_dataset("folder", tmp_path)
    index = {int(c): i for i, c in enumerate(splits.test.classes)}
    dataset = TorchImages(splits.test, eval_transform("photos", 8), label_index=index)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 8, 8)
    assert sorted(set(labels.tolist())) == [0, 1]


# -- augmentation strength (config key augment) --------------------------------------------------


def ink_centroids(strength: float, draws: int, size: int = 32) -> np.ndarray:
    """(draws, 2) x, y ink centroids of a 6 x 6 square centred in a size x size glyph, each jittered once."""
    glyph = np.full((size, size), 255, np.uint8)
    glyph[size // 2 - 3 : size // 2 + 3, size // 2 - 3 : size // 2 + 3] = 0
    transform = train_transform("characters", size, strength)
    torch.manual_seed(0)
    ink = torch.stack([transform(to_tensor(glyph, "characters"))[0] for _ in range(draws)]) * 0.5 + 0.5  # undo Normalize
    ink = ink.clamp(min=0)
    grid = torch.arange(size, dtype=torch.float32)
    total = ink.sum(dim=(1, 2))
    return torch.stack([(ink.sum(dim=1) * grid).sum(dim=1) / total, (ink.sum(dim=2) * grid).sum(dim=1) / total], 1).numpy()


def test_augment_zero_prepares_training_images_as_evaluation_images():
    glyph = synthetic_glyphs(2, 1, 32, seed=0)[0][0]
    torch.manual_seed(1)
    got = train_transform("characters", 32, 0.0)(to_tensor(glyph, "characters"))
    torch.testing.assert_close(got, eval_transform("characters", 32)(to_tensor(glyph, "characters")))
    photo = np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    as_tensor = to_tensor(photo, "photos")
    torch.testing.assert_close(train_transform("photos", 16, 0.0)(as_tensor), eval_transform("photos", 16)(as_tensor))


def test_augment_scales_the_shift_of_characters():
    """A centred square moves only by the jitter's shift (rotation, scale and shear are about the centre):
    at most 8 % of 32 px = 2.56 px at strength 1 and 5.12 px at strength 2, rounded to whole pixels by
    torchvision, plus interpolation; 300 draws at strength 2 reach beyond strength 1's range."""
    reference = ink_centroids(0.0, 1)[0]
    for strength, bound in ((1.0, 3), (2.0, 5)):
        shifts = np.abs(ink_centroids(strength, 300) - reference)
        assert shifts.max() <= bound + 0.75, (strength, shifts.max())
        if strength == 2.0:
            assert shifts.max() >= 3.5
    assert np.abs(ink_centroids(0.0, 5) - reference).max() < 1e-4


def test_augment_crops_photos_less_at_lower_strength():
    transform = train_transform("photos", 16, 0.25)  # crops of at least 1 - 0.92 / 4 = 77 % of the area
    crop = next(step for step in transform.transforms if type(step).__name__ == "RandomResizedCrop")
    assert crop.scale == pytest.approx((0.77, 1.0))
    standard = next(step for step in train_transform("photos", 16, 3.0).transforms if type(step).__name__ == "RandomResizedCrop")
    assert standard.scale == pytest.approx((0.08, 1.0))


# -- characters batch-wise (CharacterImages) -------------------------------------------------------


def torchvision_affine(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """The reference: torchvision's own affine, image by image, with RandomAffine's defaults (nearest, fill 0)."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as tvf

    return torch.stack([
        tvf.affine(image, angle=float(a), translate=[float(tx), float(ty)], scale=float(s), shear=[float(sh), 0.0],
                   interpolation=InterpolationMode.NEAREST, fill=0)
        for image, (a, tx, ty, s, sh) in zip(images, params.tolist())
    ])  # fmt: skip


@pytest.mark.parametrize(("size", "strength"), [(32, 1.0), (27, 1.0), (32, 3.0)])
def test_batch_jitter_moves_each_character_as_torchvisions_affine_does(size, strength):
    """Odd and even sizes (the centre between pixels or on one), the standard jitter and one three times as strong."""
    glyphs, _ = synthetic_glyphs(4, 6, size, seed=1)
    ink = torch.from_numpy(255 - glyphs).unsqueeze(1).float().div(255)
    params = draw_jitter(len(ink), character_jitter(strength), size, generator=torch.Generator().manual_seed(7))
    got = affine_batch(ink, params)
    assert not torch.equal(got, ink)
    torch.testing.assert_close(got, torchvision_affine(ink, params), rtol=0, atol=0)


def test_batch_jitter_moves_by_hand_computed_amounts():
    """A 90 degree turn of a 4 x 4 image and a whole-pixel shift, by hand: no library in the loop."""
    image = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4)
    turn = affine_batch(image, torch.tensor([[90.0, 0, 0, 1, 0]], dtype=torch.float64))
    # a positive angle turns clockwise on screen (torchvision's convention): the top row is the first column, read
    # from the bottom
    torch.testing.assert_close(turn[0, 0], torch.rot90(image[0, 0], k=-1), rtol=0, atol=0)
    assert turn[0, 0, 0].tolist() == [12, 8, 4, 0]
    moved = affine_batch(image, torch.tensor([[0.0, 1, -1, 1, 0]], dtype=torch.float64))  # one right, one up
    want = torch.zeros(4, 4)
    want[:3, 1:] = image[0, 0, 1:, :3]
    torch.testing.assert_close(moved[0, 0], want, rtol=0, atol=0)


def test_batch_jitter_draws_in_random_affines_ranges():
    size, jitter = 32, character_jitter(1.0)
    params = draw_jitter(20_000, jitter, size, generator=torch.Generator().manual_seed(0)).numpy()
    lows = [-10, -round(0.08 * size), -round(0.08 * size), 0.9, -5]
    highs = [10, round(0.08 * size), round(0.08 * size), 1.1, 5]
    for column, low, high in zip(params.T, lows, highs):
        assert low <= column.min() and column.max() <= high
        assert column.min() < low + 0.01 * (high - low) and column.max() > high - 0.01 * (high - low)  # the whole range
        assert abs(column.mean() - (low + high) / 2) < 0.02 * (high - low)
    shifts = params[:, 1:3]
    np.testing.assert_array_equal(shifts, np.round(shifts))  # whole pixels, as torchvision rounds them
    # a shift of +-2.56 px rounds to -3..3 with the end values drawn only beyond +-2.5: 0.06 / 2.56 of the draws each
    assert abs((np.abs(shifts) == 3).mean() - 0.06 / 2.56) < 0.005
    assert draw_jitter(3, character_jitter(0.0), size).numpy().tolist() == [[0, 0, 0, 1, 0]] * 3


def test_character_batches_without_jitter_equal_the_evaluation_transform_and_map_labels():
    glyphs, labels = synthetic_glyphs(3, 4, 20, seed=2)
    images = ImageSet(labels + 10, "characters", arrays=glyphs)
    index = {10: 2, 11: 0, 12: 1}
    reference = torch.stack([eval_transform("characters", 20)(to_tensor(g, "characters")) for g in glyphs])
    for strength in (None, 0.0):
        batch, got_labels = CharacterImages(images, strength, index).__getitems__(list(range(len(glyphs))))
        torch.testing.assert_close(batch, reference, rtol=0, atol=0)
        assert got_labels.tolist() == [index[int(c)] for c in labels + 10]
    image, label = CharacterImages(images)[5]
    assert image.shape == (1, 20, 20) and label == int(labels[5]) + 10


def test_image_dataset_reads_characters_at_the_size_batch_wise_and_others_image_by_image():
    glyphs, labels = synthetic_glyphs(2, 4, 16, seed=0)
    images = ImageSet(labels, "characters", arrays=glyphs)
    dataset, collate = image_dataset(images, 16, 1.0)
    assert isinstance(dataset, CharacterImages) and collate is keep_batch
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=collate)
    batch, batch_labels = next(iter(loader))
    assert batch.shape == (8, 1, 16, 16) and batch.dtype == torch.float32 and batch_labels.tolist() == labels.tolist()
    other, collate = image_dataset(images, 12, 1.0)  # not at the size: resized image by image
    assert isinstance(other, TorchImages) and collate is None


# -- validation split by alphabet (config key val_split) -------------------------------------------


def alphabet_classes(sizes: dict[str, int]) -> dict[int, str]:
    """{class id: alphabet} with ``sizes[name]`` consecutive class ids per alphabet."""
    names = [name for name, size in sizes.items() for _ in range(size)]
    return {100 + i: name for i, name in enumerate(names)}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_split_alphabets_holds_out_whole_alphabets_nearest_the_fraction(seed):
    alphabet_of = alphabet_classes({"A": 2, "B": 2, "C": 2, "D": 2, "E": 2})
    fit, val = split_alphabets(alphabet_of, 0.4, seed=seed)  # 4 of 10 classes: exactly two alphabets
    held_out = {alphabet_of[int(c)] for c in val}
    assert len(held_out) == 2 and len(val) == 4
    assert not held_out & {alphabet_of[int(c)] for c in fit}
    np.testing.assert_array_equal(np.sort(np.concatenate([fit, val])), np.arange(100, 110))
    _, tie = split_alphabets(alphabet_of, 0.5, seed=seed)  # 5 classes: 4 and 6 are as near; the smaller wins
    assert len(tie) == 4


def test_split_alphabets_leaves_an_alphabet_to_fit_on_and_holds_out_at_least_one():
    alphabet_of = alphabet_classes({"A": 3, "B": 3, "C": 3})
    fit, val = split_alphabets(alphabet_of, 0.99)
    assert len(val) == 6 and len(fit) == 3
    fit, val = split_alphabets(alphabet_of, 0.01)
    assert len(val) == 3 and len(fit) == 6


def test_split_alphabets_is_seeded_and_depends_on_the_seed():
    alphabet_of = alphabet_classes({name: 2 for name in "ABCDEFGH"})
    picks = {tuple(split_alphabets(alphabet_of, 0.25, seed=seed)[1]) for seed in range(6)}
    assert split_alphabets(alphabet_of, 0.25, seed=4)[1].tolist() == split_alphabets(alphabet_of, 0.25, seed=4)[1].tolist()
    assert len(picks) > 1


def test_validation_split_by_alphabet_needs_alphabet_names():
    labels, arrays = np.repeat(np.arange(4), 2), np.zeros((8, 4, 4), np.uint8)
    images = ImageSet(labels, "characters", arrays=arrays, names={i: f"c{i}" for i in range(4)})
    with pytest.raises(DatasetError) as error:
        validation_split(images, "alphabets", 0.5, "dataset 'folder' under /d")
    assert_one_line(error, "dataset 'folder' under /d", "val_split=alphabets", "alphabet/character")
    one_alphabet = ImageSet(labels, "characters", arrays=arrays, names={i: f"Latin/c{i}" for i in range(4)})
    with pytest.raises(DatasetError) as error:
        validation_split(one_alphabet, "alphabets", 0.5, "dataset 'folder' under /d")
    assert_one_line(error, "at least 2 training alphabets")
    fit, val = validation_split(images, "classes", 0.5, "unused")
    np.testing.assert_array_equal(np.sort(np.concatenate([fit, val])), np.arange(4))


@pytest.mark.skipif(shared_data_root() is None, reason="no real Omniglot under shared/data or $DML_DATA_ROOT")
def test_real_omniglot_validation_alphabet():
    splits = load_dataset("omniglot", shared_data_root())
    fit, val = validation_split(splits.train, "alphabets", 0.2, "omniglot")
    held_out = {splits.train.names[int(c)].split("/")[0] for c in val}
    assert len(held_out) == 1 and len(val) in (22, 24, 26)  # one alphabet near 0.2 x 136 = 27 classes
    assert len(fit) + len(val) == 136
    assert validation_folds(splits.train, "classes", 0.2) == 5  # 136 // 27
    assert validation_folds(splits.train, "alphabets", 0.2) >= 3

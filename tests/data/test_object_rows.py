"""Dataset objects go through vitlab's reader and its limits as folders do: a `datasets.Dataset`'s rows are decoded
by vitlab (the image budget before decoding, in bounded memory), path rows are read only inside the dataset's folder
and a missing file is a skipped row, not a raw FileNotFoundError; images without pixels, a __len__ that fails or is
beyond any dataset, and an item that cannot be read are one line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.data.test_image_budget import RGB8, STATUS, zeros_png
from vitlab.data import build_datasets
from vitlab.data.sources import DECODE_ERRORS
from vitlab.errors import DataError

datasets = pytest.importorskip("datasets")
TIMEOUT_S = 300  # a hang check, never a speed assertion
SRC = str(Path(vitlab.__file__).parents[1])


class Items:
    """A map-style dataset of (image, label) whose __len__ and images are chosen by the test."""

    def __init__(self, images: list, length: object = None):
        self.images, self.length = images, length

    def __len__(self):
        return len(self.images) if self.length is None else self.length

    def __getitem__(self, i):
        return self.images[i], i % 2


def grey(value: int, size: tuple[int, int] = (8, 8)) -> Image.Image:
    return Image.new("RGB", size, (value,) * 3)


def pngs(folder: Path, n: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        grey(30 * i).save(folder / f"{i}.png")
    return [str(folder / f"{i}.png") for i in range(n)]


def hf(paths_or_images: list, image_feature: bool = True):
    features = datasets.Features({"image": datasets.Image() if image_feature else datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    return datasets.Dataset.from_dict({"image": paths_or_images, "label": [i % 2 for i in range(len(paths_or_images))]},
                                      features=features)


def unreadable(split) -> dict[int, str]:
    """{index: error} of the items the loader would skip."""
    out = {}
    for i in range(len(split)):
        try:
            split.load(i)
        except DECODE_ERRORS as err:
            out[i] = f"{type(err).__name__}: {err}"
    return out


def test_a_bomb_row_of_a_hugging_face_dataset_is_refused_by_the_budget(tmp_path):
    """A 12,000 x 12,000 PNG as a row's bytes and as a row's path: ImageTooLarge for that row (skipped and counted
    by the loader), the other rows read; `datasets` itself would decode it (432 MB) and train on it."""
    paths = pngs(tmp_path, 4)
    big = zeros_png(tmp_path / "big.png", 12_000, 12_000, RGB8)
    for rows in ([*paths[:3], str(big)], [*(Path(p).read_bytes() for p in paths[:3]), big.read_bytes()]):
        ds = build_datasets(hf(rows), val_fraction=0.5)
        split = ds.train if any(int(r) == 3 for r in ds.train.rows) else ds.val
        bad = unreadable(split)
        assert list(bad.values()) == ["ImageTooLarge: 12,000 x 12,000 = 144,000,000 pixels, over the budget of "
                                      "67,108,864 pixels an image may have; raise it with VITLAB_MAX_IMAGE_PIXELS=N "
                                      "if this image is wanted"], bad


ROW_PEAK = STATUS + """
import json, sys, datasets
from vitlab.data import build_datasets
from vitlab.data.sources import DECODE_ERRORS
paths = sys.argv[1:]
features = datasets.Features({'image': datasets.Image(), 'label': datasets.ClassLabel(names=['a', 'b'])})
ds = datasets.Dataset.from_dict({'image': paths, 'label': [i % 2 for i in range(len(paths))]}, features=features)
floor = status('VmHWM')
splits = build_datasets(ds, val_fraction=0.5)
errors = []
for split in (splits.train, splits.val):
    for i in range(len(split)):
        try:
            split.load(i)
        except DECODE_ERRORS as err:
            errors.append(type(err).__name__)
print(json.dumps({'errors': errors, 'grown': status('VmHWM') - floor}))
"""


def test_a_bomb_row_costs_no_memory(tmp_path):
    """The row above in a subprocess: refused with the peak grown by less than 64 MiB."""
    paths = [*pngs(tmp_path, 3), str(zeros_png(tmp_path / "big.png", 12_000, 12_000, RGB8))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", ROW_PEAK, *paths], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == ["ImageTooLarge"] and out["grown"] < 64 * 2**20, out


def test_path_rows_are_read_inside_the_dataset_folder_only(tmp_path):
    """A dataset saved to disk whose image column holds paths: a path inside its folder is read, one outside
    (absolute, or climbing out with ..) is a skipped row naming it; a missing file in an in-memory dataset is a
    skipped row too, never a raw FileNotFoundError."""
    saved = tmp_path / "saved"
    inside = pngs(saved / "images", 2)
    outside = pngs(tmp_path / "elsewhere", 2)
    hf([inside[0], outside[0], "images/1.png", "../elsewhere/1.png"], image_feature=False).save_to_disk(str(saved))
    ds = build_datasets(datasets.load_from_disk(str(saved)), val_fraction=0.5)
    bad = {**{f"train {k}": v for k, v in unreadable(ds.train).items()},
           **{f"val {k}": v for k, v in unreadable(ds.val).items()}}
    assert len(bad) == 2 and all("outside the dataset folder" in v for v in bad.values()), bad
    assert {v.split(" refers to ")[1].split(",")[0] for v in bad.values()} == {outside[0], "../elsewhere/1.png"}
    memory = build_datasets(hf([*pngs(tmp_path / "m", 3), str(tmp_path / "missing.png")]), val_fraction=0.5)
    errors = [*unreadable(memory.train).values(), *unreadable(memory.val).values()]
    assert len(errors) == 1 and errors[0].startswith("FileNotFoundError") and "missing.png" in errors[0]


@pytest.mark.parametrize("image", [grey(0, (0, 0)), grey(0, (5, 0)), np.zeros((0, 5, 3), np.uint8),
                                   torch.zeros(3, 4, 0, dtype=torch.uint8)])
def test_an_image_without_pixels_is_refused_in_one_line(image):
    """A 0 x 0 (or 5 x 0) image is refused where a dataset is opened (item 0) and skipped and counted elsewhere;
    it was trained on, resized from nothing."""
    with pytest.raises(DataError, match=r"^data: \[0\]|^train\[0\]: \d+ x \d+ pixels: an image without pixels"):
        build_datasets(Items([image, grey(10), grey(20), grey(30)]), val_fraction=0.5)
    ds = build_datasets(Items([grey(10), grey(20), image, grey(30)]), val_fraction=0.5)
    errors = [*unreadable(ds.train).values(), *unreadable(ds.val).values()]
    assert len(errors) == 1 and errors[0].startswith("ValueError: ") and "an image without pixels" in errors[0]


def test_an_image_over_the_budget_is_refused_for_objects_too(monkeypatch):
    monkeypatch.setenv("VITLAB_MAX_IMAGE_PIXELS", "100")
    ds = build_datasets(Items([grey(10), grey(20), grey(0, (11, 10)), grey(30)]), val_fraction=0.5)
    errors = [*unreadable(ds.train).values(), *unreadable(ds.val).values()]
    assert len(errors) == 1 and errors[0].startswith("ImageTooLarge: ") and "11 x 10 = 110 pixels" in errors[0]


class Broken:
    def __init__(self, length):
        self.length = length

    def __len__(self):
        if isinstance(self.length, Exception):
            raise self.length
        return self.length

    def __getitem__(self, i):
        if i >= 4:
            raise IndexError(i)
        return grey(10 * i), i % 2


@pytest.mark.parametrize(("length", "said"), [
    (-1, "Broken fails (ValueError: __len__() should return >= 0)"),
    (2.5, "Broken fails (TypeError: 'float' object cannot be interpreted as an integer)"),
    (RuntimeError("no length"), "Broken fails (RuntimeError: no length)"),
    (10**12, "Broken says it has 1,000,000,000,000 items, more than vitlab reads from one dataset object"),
    (6, "[4]: reading the item raised IndexError: 4 (len() says 6 items)"),
])
def test_a_dataset_with_an_odd_len_is_one_line(length, said):
    """A __len__ that fails, is negative, is not an int, is beyond any dataset (10^12 items, which vitlab read
    one by one), or is longer than the items: one DataError naming the problem."""
    with pytest.raises(DataError) as err:
        build_datasets(Broken(length), val_fraction=0.5)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_an_iterable_dataset_is_refused_in_one_line(tmp_path):
    """A torch IterableDataset (no __len__, no indexing): one line saying what vitlab reads."""

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield grey(0), 0

    with pytest.raises((TypeError, DataError)) as err:
        vitlab.fit(data=Stream(), out=str(tmp_path / "r"), model="ViT-Ti/4", image_size=8, steps=1)
    assert "IterableDataset" in str(err.value) and "map-style" in str(err.value) and "\n" not in str(err.value)


def test_an_image_folder_object_is_read_by_vitlabs_reader(tmp_path):
    """A torchvision ImageFolder holding a 12,000 x 12,000 PNG: its files are read as a folder's, so the bomb is an
    ImageTooLarge for that item (skipped and counted) where torchvision's loader would decode 432 MB."""
    from torchvision.datasets import ImageFolder

    for name in ("a", "b"):
        pngs(tmp_path / "tv" / name, 2)
    zeros_png(tmp_path / "tv" / "b" / "big.png", 12_000, 12_000, RGB8)
    ds = build_datasets(ImageFolder(str(tmp_path / "tv")), val_fraction=0.5)
    errors = [*unreadable(ds.train).values(), *unreadable(ds.val).values()]
    assert errors == ["ImageTooLarge: 12,000 x 12,000 = 144,000,000 pixels, over the budget of 67,108,864 pixels an "
                      "image may have; raise it with VITLAB_MAX_IMAGE_PIXELS=N if this image is wanted"]
    assert ds.train.describe(0).startswith(str(tmp_path / "tv"))  # an item is named by its file

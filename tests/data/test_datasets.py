"""vitlab.data: embedded sets, image folders, pre-processing, deterministic samplers, bad inputs."""

from __future__ import annotations

import logging
import random
import re

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.data import (
    DataError,
    EvalTransform,
    ShardSampler,
    StepSampler,
    TrainTransform,
    TransformedSplit,
    build_datasets,
    load_split,
    make_loader,
    normalize,
)
from vitlab.data.transforms import subpixel_inception_box, tf_inception_box


def write_image(path, size=(12, 10), color=(255, 0, 0), fmt=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(abs(hash(str(path))) % 2**31)
    arr = (rng.rand(size[1], size[0], 3) * 64 + np.array(color) * 0.75).astype(np.uint8)
    Image.fromarray(arr).save(path, format=fmt)


def make_folder(root, classes=("cat", "dog", "emu"), per_class=4, splits=("train", "val")):
    for split in splits:
        for c, name in enumerate(classes):
            for i in range(per_class):
                ext = ["png", "jpg", "webp"][i % 3]
                write_image(root / split / name / f"{i}.{ext}", color=[(255, 0, 0), (0, 255, 0), (0, 0, 255)][c])
    return root


# --- embedded datasets -----------------------------------------------------------------------------------
def test_digits_fixed_stratified_split():
    a, b = build_datasets("digits"), build_datasets("digits")
    assert (len(a.train), len(a.val)) == (1438, 359)
    assert a.class_names == [str(d) for d in range(10)]
    assert np.array_equal(a.val.arrays, b.val.arrays)  # the same test images every time
    counts = np.bincount(a.val.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # 20% of each class
    train_keys = {x.tobytes() for x in a.train.arrays}
    assert sum(x.tobytes() in train_keys for x in a.val.arrays) < 5  # (digits has a few duplicate images)


def test_mnist_subset_split():
    ds = build_datasets("mnist")
    assert (len(ds.train), len(ds.val)) == (4000, 1000)
    assert ds.train.arrays.shape[1:] == (28, 28) and ds.train.arrays.dtype == np.uint8
    assert np.bincount(ds.val.labels).tolist() == [100] * 10


def test_labelled_subset_takes_k_per_class_nested_with_the_same_test_split():
    whole, small, large = (build_datasets(d) for d in ("mnist", "mnist:10", "mnist:100"))
    assert np.bincount(small.train.labels).tolist() == [10] * 10
    assert np.bincount(large.train.labels).tolist() == [100] * 10
    assert np.array_equal(small.val.arrays, whole.val.arrays)  # the fixed test split, whatever K
    keys = {x.tobytes() for x in large.train.arrays}
    assert all(x.tobytes() in keys for x in small.train.arrays)  # mnist:10 is part of mnist:100
    whole_keys = {x.tobytes() for x in whole.train.arrays}
    assert all(x.tobytes() in whole_keys for x in large.train.arrays)  # drawn from the train split only


@pytest.mark.parametrize("data, message", [("mnist:0", "K must be 1 to 400"), ("mnist:401", "K must be 1 to 400"),
                                           ("mnist:ten", "training images per class, e.g. mnist:100")])
def test_labelled_subset_refuses_a_k_it_cannot_draw(data, message):
    with pytest.raises(DataError, match=message):
        build_datasets(data)


def test_val_fraction_holds_out_of_train():
    ds = build_datasets("digits", val_fraction=0.1)
    assert len(ds.train) + len(ds.val) == 1438
    assert 130 <= len(ds.val) <= 150


# --- transforms --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", [tf_inception_box, subpixel_inception_box])
def test_inception_box_respects_ranges(sampler):
    rng = random.Random(0)
    for _ in range(200):
        left, top, right, bottom = sampler(40, 30, (0.05, 1.0), (3 / 4, 4 / 3), rng)
        assert 0 <= left < right <= 40 and 0 <= top < bottom <= 30
        area = (right - left) * (bottom - top) / 1200
        assert 0.05 - 1e-9 <= area <= 1.0 + 1e-9
        if sampler is tf_inception_box:
            assert all(isinstance(v, int) for v in (left, top, right, bottom))


@pytest.mark.parametrize("crop", ["inception", "inception-subpixel", "resize-random-crop"])
def test_train_transform_is_seeded_and_sized(crop):
    img = Image.fromarray((np.random.RandomState(0).rand(30, 40, 3) * 255).astype(np.uint8))
    t = TrainTransform((16, 16), crop=crop)
    a, b = t(img, random.Random(5)), t(img, random.Random(5))
    assert a.shape == (16, 16, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
    assert any(not np.array_equal(a, t(img, random.Random(s))) for s in range(6, 10))


def test_normalize_official_range():
    x = torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 1, 2).expand(1, 3, 1, 2)
    y = normalize(x, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert torch.allclose(y[0, :, 0, 0], torch.tensor(-1.0)) and torch.allclose(y[0, :, 0, 1], torch.tensor(1.0))


def test_jpeg_draft_mode_decodes_smaller(tmp_path):
    path = tmp_path / "big.jpg"
    write_image(path, size=(800, 600))
    split = load_split(str(make_folder(tmp_path / "f", per_class=1)), "train")
    split.paths[0] = str(path)
    small = split.load(0, min_size=64)
    assert 64 <= min(small.size) <= 150  # decoded at 1/4 or 1/8 scale, never below the request
    assert split.load(0).size == (800, 600)


# --- image folders -----------------------------------------------------------------------------------------
def test_folder_train_val(tmp_path):
    ds = build_datasets(str(make_folder(tmp_path)))
    assert ds.class_names == ["cat", "dog", "emu"]
    assert len(ds.train) == len(ds.val) == 12
    assert ds.train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    img = ds.train.load(0)
    assert img.mode == "RGB"


def test_folder_without_val_uses_fraction(tmp_path):
    root = make_folder(tmp_path, per_class=10, splits=("train",))
    ds = build_datasets(str(root), val_fraction=0.2)
    assert (len(ds.train), len(ds.val)) == (24, 6)
    flat = make_folder(tmp_path / "flat", per_class=5, splits=("",))
    assert len(build_datasets(str(flat), val_fraction=0.2).val) == 3


@pytest.mark.parametrize(
    "layout, message",
    [
        ("missing_val", "missing split: .* has no val/ folder; .*--val-fraction"),
        ("only_val", "missing split: .* has val/ but no train/"),
        ("empty_class", "class folder .*dog has no images"),
        ("nothing", "does not exist"),
        ("unknown_val_class", "class folders unknown to the 3 training classes: zebra"),
        ("no_classes", "has no class folders"),
    ],
)
def test_folder_errors(tmp_path, layout, message):
    root = tmp_path / "data"
    if layout == "missing_val":
        make_folder(root, splits=("train",))
    elif layout == "only_val":
        make_folder(root, splits=("val",))
    elif layout == "empty_class":
        make_folder(root)
        for f in (root / "train" / "dog").iterdir():
            f.unlink()
    elif layout == "unknown_val_class":
        make_folder(root)
        write_image(root / "val" / "zebra" / "0.png")
    elif layout == "no_classes":
        (root / "train").mkdir(parents=True)
        (root / "val").mkdir()
    with pytest.raises(DataError, match=message):
        build_datasets(str(root))


def test_the_training_half_of_a_pair_is_answered_with_the_pair(tmp_path):
    """--data photos/train beside photos/val: the fix is --data photos (a validation folder by another name: renamed
    to val/ first), never a val/ inside the class tree; a lone class tree gets --val-fraction."""
    root = make_folder(tmp_path / "photos", per_class=1)
    message = (f"missing split: {root / 'train'} is a training split and {root / 'val'} is beside it: pass --data "
               f"{root} (vitlab reads {root}/train/ and {root}/val/), or hold out part of the training images with "
               "--val-fraction 0.1")
    with pytest.raises(DataError) as err:
        build_datasets(str(root / "train"))
    assert str(err.value) == message
    other = make_folder(tmp_path / "other", per_class=1, splits=("training", "validation"))
    renames = (f"rename {other / 'training'} to {other / 'train'} and {other / 'validation'} to {other / 'val'}, "
               f"then pass --data {other}")
    with pytest.raises(DataError, match=re.escape(renames)):
        build_datasets(str(other / "training"))
    lone = make_folder(tmp_path / "lone", per_class=1, splits=("",))
    with pytest.raises(DataError, match=re.escape(f"{lone} holds the classes and no validation split; hold out part "
                                                  "of the training images with --val-fraction 0.1")):
        build_datasets(str(lone))


def test_unreadable_files_skipped_and_counted(tmp_path, caplog):
    root = make_folder(tmp_path)
    for i in range(5):
        (root / "train" / "cat" / f"bad{i}.jpg").write_bytes(b"not an image at all")
    with caplog.at_level(logging.WARNING, logger="vitlab.data"):
        ds = build_datasets(str(root))
    assert len(ds.skipped) == 5 and len(ds.train) == 12
    assert "skipping 5 unreadable image(s)" in caplog.text and "and 2 more" in caplog.text
    with pytest.raises(DataError, match=r"5 unreadable image\(s\) in .*bad0.jpg.*\(--strict\)"):
        build_datasets(str(root), strict=True)


def test_class_with_only_unreadable_files(tmp_path):
    root = make_folder(tmp_path)
    for f in (root / "train" / "dog").iterdir():
        f.write_bytes(b"garbage")
    with pytest.raises(DataError, match="class folder .*dog has no readable images"):
        build_datasets(str(root))


def test_truncated_jpeg_substituted_at_load_time(tmp_path):
    root = make_folder(tmp_path)
    bad = root / "train" / "cat" / "1.jpg"
    write_image(bad, size=(64, 64))
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) * 2 // 3])  # header intact, data cut off
    ds = build_datasets(str(root))
    index = ds.train.paths.index(str(bad))
    training = TransformedSplit(ds.train, EvalTransform((8, 8)), skip_unreadable=False)
    batch = training.__getitems__([(index, 0), (0, 0)])
    assert batch["bad"] == [str(bad)]
    assert batch["images"].shape == (2, 3, 8, 8)
    assert batch["labels"][0] == ds.train.labels[index + 1]  # the next image took its place


# --- samplers and loaders ----------------------------------------------------------------------------------
def test_step_sampler_shards_union_is_global_batch():
    one = list(StepSampler(50, 12, seed=3, start_step=0, total_steps=10))
    two = [list(StepSampler(50, 12, 3, 0, 10, rank=r, world=2, accum=3)) for r in range(2)]
    for step in range(10):
        shards = [key for r in range(2) for key in sum(two[r][3 * step : 3 * step + 3], [])]
        assert sorted(shards) == sorted(one[step])


def test_step_sampler_resume_and_epochs():
    full = list(StepSampler(50, 12, seed=1, start_step=0, total_steps=20))
    assert list(StepSampler(50, 12, seed=1, start_step=7, total_steps=20)) == full[7:]
    stream = [i for batch in full for i, _ in batch]
    assert sorted(stream[:50]) == list(range(50)) and sorted(stream[50:100]) == list(range(50))
    seeds = [s for batch in full for _, s in batch]
    assert len(set(seeds)) == len(seeds)  # every draw has its own augmentation seed
    with pytest.raises(ValueError, match="not divisible"):
        StepSampler(50, 10, 0, 0, 1, world=3)


def test_shard_sampler_pads_to_equal_length():
    shards = [list(ShardSampler(11, 4, rank=r, world=3)) for r in range(3)]
    assert [len(s) for s in shards] == [1, 1, 1]
    keys = [k for s in shards for b in s for k in b]
    assert sorted(i for i, seed in keys if seed >= 0) == list(range(11))
    assert sum(seed < 0 for _, seed in keys) == 1


@pytest.mark.parametrize("crop", ["inception", "inception-subpixel"])
def test_loader_workers_do_not_change_batches(crop):
    ds = build_datasets("digits")
    data = TransformedSplit(ds.train, TrainTransform((16, 16), crop_scale=(0.5, 1.0), flip=False, crop=crop))
    batches = []
    for workers in (0, 1):
        loader = make_loader(data, StepSampler(len(ds.train), 16, 0, 0, 3), workers, torch.device("cpu"))
        batches.append([b["images"] for b in loader])
    assert all(torch.equal(a, b) for a, b in zip(*batches, strict=True))

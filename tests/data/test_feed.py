"""The CPU side that feeds a GPU: the uint8 tensor resize of the training transform, and the loader workers'
default."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.data.transforms import TrainTransform, model_transform
from vitlab.train.config import TrainConfig, validate
from vitlab.train.distributed import Dist
from vitlab.train.trainer import default_workers


def photo_like(width: int = 120, height: int = 90, seed: int = 0) -> Image.Image:
    """Smooth colour gradients plus fine noise: both the low and the high frequencies a resize filters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width * 200, y / height * 180, (x + y) / (width + height) * 255], axis=2)
    arr = np.clip(base + rng.normal(0, 25, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


@pytest.mark.parametrize("crop", ["inception", "resize-random-crop"])
@pytest.mark.parametrize("size", [32, 200])  # 32: the crops are shrunk; 200: most are enlarged
def test_tensor_resize_within_one_grey_level_of_pil(crop, size):
    img = photo_like()
    pil, tensor = TrainTransform((size, size), crop=crop), TrainTransform((size, size), crop=crop, resize="tensor")
    flipped = 0
    for k in range(12):
        a, b = pil(img, random.Random(k)), tensor(img, random.Random(k))
        assert a.shape == b.shape == (size, size, 3) and b.dtype == np.uint8
        diff = np.abs(a.astype(int) - b.astype(int))
        assert diff.max() <= 1, f"draw {k}: {diff.max()} grey levels apart"
        assert diff.mean() < 0.5  # most pixels identical: both round a fixed-point sum, at their own precision
        # the same flip was drawn: a mirrored output would differ by far more than one level
        flipped += int(np.abs(a.astype(int) - b[:, ::-1].astype(int)).max() > 1)
    assert flipped == 12


def test_tensor_resize_of_a_grayscale_image_gives_rgb():
    img = photo_like().convert("L")
    a = TrainTransform((24, 24))(img, random.Random(3))
    b = TrainTransform((24, 24), resize="tensor")(img, random.Random(3))
    assert b.shape == (24, 24, 3) and (b[:, :, 0] == b[:, :, 2]).all()
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_tensor_resize_is_a_named_option_with_clear_errors():
    assert model_transform(16, (0.5,) * 3, (0.5,) * 3, train=True, resize="tensor").base.resize == "tensor"
    with pytest.raises(ValueError, match="unknown train resize 'cv2'"):
        TrainTransform((16, 16), resize="cv2")
    with pytest.raises(ValueError, match="integer crop boxes"):
        TrainTransform((16, 16), crop="inception-subpixel", resize="tensor")
    with pytest.raises(ValueError, match="--train-resize tensor resamples integer crop boxes"):
        validate(TrainConfig(train_resize="tensor", train_crop="inception-subpixel"))
    with pytest.raises(ValueError, match="unknown --train-resize 'cv2'"):
        validate(TrainConfig(train_resize="cv2"))
    assert validate(TrainConfig(train_resize="tensor")).train_resize == "tensor"


def _dist(device: str, local_world: int = 1) -> Dist:
    return Dist(rank=0, world=local_world, local_rank=0, local_world=local_world, device=torch.device(device),
                owns_group=False)


@pytest.mark.parametrize(("cpus", "device", "local_world", "expected"), [
    (16, "cuda", 1, 15),  # every core but the one driving the GPU loads: no cap at 8
    (16, "cpu", 1, 8),  # on CPU the other cores compute
    (16, "cuda", 2, 7),  # two processes share the 16 cores
    (2, "cpu", 1, 1),  # the demo's machine: one worker, one compute thread
    (1, "cuda", 1, 0),
])
def test_default_workers_follow_the_cores_available(monkeypatch, cpus, device, local_world, expected):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert default_workers(_dist(device, local_world)) == expected


def test_train_resize_reaches_the_training_loader(tmp_path):
    """--train-resize picks the loader's resampling: the same batch within one grey level, not the same bytes."""
    from vitlab.data import build_datasets
    from vitlab.train.trainer import make_loaders

    seed = 0
    for split, n in (("train", 4), ("val", 1)):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(n):
                seed += 1
                photo_like(60, 45, seed=seed).save(tmp_path / split / c / f"{i}.png")
    data = build_datasets(str(tmp_path))
    batches = {}
    for resize in ("pil", "tensor"):
        cfg = TrainConfig(data=str(tmp_path), image_size=32, batch_size=8, steps=1, workers=0, train_resize=resize)
        loader, _, _ = make_loaders(cfg, data, 0, _dist("cpu"))
        batches[resize] = next(iter(loader))["images"].int()
    diff = (batches["pil"] - batches["tensor"]).abs()
    assert batches["pil"].shape == (8, 3, 32, 32) and diff.max() == 1  # resampled apart, by one level at most

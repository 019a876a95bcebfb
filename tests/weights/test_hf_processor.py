"""`vitlab convert --to hf` writes the image processor that feeds the model its own evaluation pixels: for a timm
name, the short side to floor(size / crop_pct), the centre crop, timm's interpolation and the weights' mean/std; for
vitlab's own resizes, what `vitlab.transforms` does. Checked on real photographs against `vitlab.transforms`, and
through `transformers.pipeline("image-classification")`, whose top-5 and scores are vitlab's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.parity.test_eval_pixels import _photos, as_uint8
from vitlab.cli import main

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.parity

SHORT_SIDES = (150, 224, 333, 500)  # below the model size to over twice it
CLASSES = [f"class {c}" for c in "abcdefghij"]


def _photo_images() -> list[Image.Image]:
    images = []
    for arr in _photos().values():
        img = Image.fromarray(arr)
        for short in SHORT_SIDES:
            scale = short / min(img.size)
            images.append(img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.LANCZOS))
    return images


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    return _photo_images()


def _converted(tmp_path, model) -> str:
    torch.nn.init.normal_(model.head.weight, std=0.5)  # a zero head would tie every score
    model.class_names = CLASSES
    vitlab.save(model, tmp_path / "m.safetensors")
    folder = tmp_path / "hf"
    assert main(["convert", str(tmp_path / "m.safetensors"), str(folder), "--to", "hf"]) == 0
    return str(folder)


def _crop_offsets_agree(img: Image.Image, size: int, crop_pct: float) -> bool:
    """Whether transformers' centre crop (offset floored) cuts timm's box (torchvision: rounded half to even)."""
    short = math.floor(size / crop_pct)
    long = int(short * max(img.size) / min(img.size))
    return (long - size) // 2 == int(round((long - size) / 2.0))


@pytest.fixture(scope="module")
def timm_named(tmp_path_factory):
    torch.manual_seed(0)
    model = vitlab.create_model("vit_tiny_patch16_224", depth=1, num_classes=len(CLASSES))
    assert model.eval_resize == "timm:bicubic:0.9"
    return model, _converted(tmp_path_factory.mktemp("timm_named"), model)


def test_processor_of_a_timm_name_crops_as_timm(timm_named):
    """The processor states timm's pre-processing of the name, and reading the folder back gives the same pixels."""
    model, folder = timm_named
    with open(f"{folder}/preprocessor_config.json") as f:
        pre = json.load(f)
    assert pre["size"] == {"shortest_edge": 248} and pre["crop_size"] == {"height": 224, "width": 224}
    assert pre["resample"] == int(Image.Resampling.BICUBIC) and pre["do_center_crop"]
    assert pre["image_mean"] == list(model.config.mean) and pre["image_std"] == list(model.config.std)
    back = vitlab.load(folder)
    photo = _photo_images()[0]
    assert torch.equal(vitlab.transforms(back)(photo), vitlab.transforms(model)(photo))


@pytest.mark.parametrize("backend", ["pil", "torchvision"])
def test_processor_pixels_are_vitlabs_on_photos(timm_named, photos, backend):
    """Every value within one grey level of `vitlab.transforms` (PIL backend: equal) on 24 photos, except where
    transformers' floored crop offset starts one pixel before timm's rounded one: there the pixels are vitlab's
    shifted by one column or row, which this also checks, and which the docs state."""
    from transformers import AutoImageProcessor

    model, folder = timm_named
    processor = AutoImageProcessor.from_pretrained(folder, backend=backend)
    ours_fn, mean, std = vitlab.transforms(model), model.config.mean, model.config.std
    off, total, shifted = 0, 0, 0
    for img in photos:
        ours = as_uint8(ours_fn(img), mean, std).astype(int)
        theirs = as_uint8(processor(img, return_tensors="pt").pixel_values[0], mean, std).astype(int)
        if not _crop_offsets_agree(img, 224, 0.9):
            shifted += 1
            dy, dx = (0, 1) if img.width > img.height else (1, 0)  # the long side is cropped
            ours, theirs = ours[:, : 224 - dy, : 224 - dx], theirs[:, dy:, dx:]  # theirs starts one pixel before
        diff = np.abs(ours - theirs)
        assert diff.max() <= (0 if backend == "pil" else 2), img.size
        off, total = off + int((diff > 1).sum()), total + diff.size
    assert off / total < 0.01
    assert 0 < shifted < len(photos) // 2  # both cases met


def test_pipeline_gives_vitlabs_top5_and_scores(timm_named, photos):
    """transformers.pipeline("image-classification") on the converted folder: vitlab's top-5 classes and scores
    (float32), on photos where both crops cut the same box."""
    from transformers import pipeline

    model, folder = timm_named
    classify = pipeline("image-classification", model=folder, device="cpu")
    same_box = [img for img in photos if _crop_offsets_agree(img, 224, 0.9)][:4]
    for img in same_box:
        with torch.no_grad():
            probs = model.eval()(vitlab.transforms(model)(img)[None]).softmax(-1)[0]
        top = probs.topk(5)
        theirs = classify(img, top_k=5)
        assert [t["label"] for t in theirs] == [CLASSES[i] for i in top.indices]
        np.testing.assert_allclose([t["score"] for t in theirs], top.values.numpy(), rtol=0, atol=2e-3)


def test_processor_of_vitlab_resizes(tmp_path, photos):
    """vitlab's own resizes: "official" squashes the whole image (ViTImageProcessor), pixel for pixel; big_vision's
    resize-and-crop becomes the short side and centre crop, within one grey level but for a rounded long side."""
    from transformers import AutoImageProcessor

    model = vitlab.create_model("ViT-Ti/16", depth=1, num_classes=len(CLASSES))
    (tmp_path / "official").mkdir()
    folder = _converted(tmp_path / "official", model)
    processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
    assert type(processor).__name__.startswith("ViTImageProcessor")
    ours_fn, mean, std = vitlab.transforms(model), model.config.mean, model.config.std
    for img in photos[:8]:
        theirs = processor(img, return_tensors="pt").pixel_values[0]
        assert np.array_equal(as_uint8(ours_fn(img), mean, std), as_uint8(theirs, mean, std))
    model.eval_resize = "big_vision"
    (tmp_path / "bv").mkdir()
    folder = _converted(tmp_path / "bv", model)
    with open(f"{folder}/preprocessor_config.json") as f:
        pre = json.load(f)
    assert pre["size"] == {"shortest_edge": 256} and pre["crop_size"] == {"height": 224, "width": 224}
    assert vitlab.load(folder).eval_resize.startswith("timm:bilinear:0.875")

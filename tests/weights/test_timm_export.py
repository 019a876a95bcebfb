"""timm exports of any size (vitlab convert --to timm): the folder loads in timm with the same logits, its
pre-processing in timm's terms makes timm's own transform factory compute vitlab's eval input, and what timm cannot
build is refused. References: timm's model factory and transform factory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import vitlab
from vitlab import create_model
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.weights.convert import convert

try:
    import timm
    import timm.data
except ImportError:
    timm = None
needs_timm = pytest.mark.skipif(timm is None, reason="timm is the reference")

TOL = 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


NONSTANDARD = [
    ("ViT-S/16", {"image_size": 96, "depth": 2}),  # timm's name at another size and depth
    ("ViT-Ti/16", {"image_size": 16, "patch_size": 4, "width": 128, "depth": 2, "num_heads": 4, "mlp_dim": 256}),
    ("ViT-Ti/16-gap", {"image_size": 48, "width": 96, "depth": 1, "num_heads": 3, "mlp_dim": 200}),
]


@needs_timm
@pytest.mark.parity
@pytest.mark.parametrize(("name", "kw"), NONSTANDARD, ids=["S16-96px-depth2", "demo-width128-patch4", "gap-w96"])
def test_timm_export_of_nonstandard_size_loads_in_timm(name, kw, tmp_path):
    model = create_model(name, num_classes=5, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    vitlab.save(model.eval(), tmp_path / "m.safetensors")
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "hub"), "--to", "timm"]) == 0
    ref = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    size = kw["image_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_err(model(x), ref(x)) <= TOL


def test_refuses_mlp_width_timm_cannot_build(tmp_path, random_tiny_vit):
    model = random_tiny_vit(0, width=56, num_heads=2, mlp_dim=61)  # int(56 * (61 / 56)) == 60 in floating point
    vitlab.save(model, tmp_path / "m.safetensors")
    with pytest.raises(WeightsError, match="MLP width 61"):
        convert(tmp_path / "m.safetensors", tmp_path / "hub", to="timm")


def timm_pipeline(folder: Path):
    """timm's own eval transform for an exported folder, built the way timm's scripts build it."""
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    data_cfg = timm.data.resolve_data_config(pretrained_cfg=cfg)
    return timm.data.create_transform(**data_cfg), cfg


@needs_timm
@pytest.mark.parity
@pytest.mark.parametrize(("resize", "size", "crop"), [("official", 32, (1.0, "squash")),
                                                      ("resize-short-crop", 32, (1.0, "center")),
                                                      ("big_vision", 224, (0.875, "center"))])  # fmt: skip
def test_timm_export_preprocessing_is_vitlabs(resize, size, crop, tmp_path, random_tiny_vit, noise_image):
    """interpolation/crop_pct/crop_mode of the export make timm's transform factory compute vitlab's eval
    input. A 400x300 image keeps timm's integer rounding (int, round-half-even) and vitlab's in step."""
    model = random_tiny_vit(0, image_size=size, patch_size=16 if size == 224 else 4)
    model.eval_resize = resize
    convert_src = tmp_path / "m.safetensors"
    vitlab.save(model, convert_src)
    convert(convert_src, tmp_path / "hub", to="timm")
    pipeline, cfg = timm_pipeline(tmp_path / "hub")
    assert (cfg["interpolation"], cfg["crop_pct"], cfg["crop_mode"]) == ("bilinear", *crop)
    # resize-short-crop resamples the central box in one step (timm: resize, then crop): equal on square images
    shape = (300, 300) if resize == "resize-short-crop" else (400, 300)
    img = Image.open(noise_image(tmp_path / "x.png", shape))
    assert (vitlab.transforms(convert_src)(img) - pipeline(img)).abs().max().item() <= TOL


def test_big_vision_crop_pct_reaches_the_resize_side():
    """timm resizes to floor(S / crop_pct): the written crop_pct must land on vitlab's side exactly."""
    from vitlab.data.transforms import resize_before_crop
    from vitlab.weights.timm_arch import timm_eval_crop

    for side in (16, 32, 37, 96, 224, 256, 384, 448, 512):
        pct = timm_eval_crop((side, side), "big_vision")["crop_pct"]
        assert int(side / pct) == resize_before_crop(side), side
    assert timm_eval_crop((384, 384), "big_vision")["crop_pct"] == 0.857  # 448: big_vision's transfer resize

"""A timm model's state dict, saved as timm saves it, loads into vitlab both ways: `vitlab.load(file, arch=NAME)` and
timm's own `timm.models.load_checkpoint(vitlab.create_model(NAME), file)` (vitlab's model takes timm's tensor
names), with timm's logits (relative L2 error <= 1e-5) and the same pre-processing config however the model was
made: timm's pipeline for the name (its pretrained cfg's normalisation, interpolation and crop). Random weights,
small images, timm models built with pretrained=False: nothing is downloaded."""

import pytest
import torch

import vitlab
from tests.parity.test_timm_weights import match_timm_hybrid_numerics, randomize, rel_err
from vitlab.constants import IMAGENET_MEAN, IMAGENET_STD, OFFICIAL_MEAN, OFFICIAL_STD
from vitlab.models import resnet

timm = pytest.importorskip("timm")
from timm.models import get_pretrained_cfg, load_checkpoint  # noqa: E402

TOL = 1e-5
# (timm name, image size, timm's mean/std for its weights): the families whose state dicts, heads or normalisation
# differed (plain ViTs and the register models: tests/parity/test_timm_weights.py), at their real width and depth
# (a bare state dict read with arch= has the name's) on a small image.
CASES = [
    ("deit_tiny_patch16_224", 32, IMAGENET_MEAN, IMAGENET_STD),
    ("vit_small_patch8_224", 32, IMAGENET_MEAN, IMAGENET_STD),  # default tag: DINO
    ("vit_tiny_r_s16_p8_224", 64, OFFICIAL_MEAN, OFFICIAL_STD),  # hybrid, ResNet root only
    ("vit_small_r26_s32_224", 64, OFFICIAL_MEAN, OFFICIAL_STD),  # hybrid with ResNet stages
    ("vit_small_patch14_dinov2", 28, IMAGENET_MEAN, IMAGENET_STD),
    ("vit_small_patch14_reg4_dinov2", 28, IMAGENET_MEAN, IMAGENET_STD),
]
PREPROCESSING = ("mean", "std", "interpolation", "crop_pct", "crop_mode")


def preprocessing(model: torch.nn.Module) -> dict:
    cfg = model.pretrained_cfg
    return {k: tuple(cfg[k]) if k in ("mean", "std") else cfg[k] for k in PREPROCESSING}


@pytest.mark.parametrize(("name", "size", "mean", "std"), CASES, ids=[c[0] for c in CASES])
def test_timm_state_dict_loads_both_ways_with_one_preprocessing(name, size, mean, std, tmp_path):
    """timm's model of the name at a small image size with random weights, its state dict saved by torch.save:
    the same logits through timm's load_checkpoint and through vitlab.load(arch=); timm's head size; timm's
    pipeline for the name (its pretrained cfg: normalisation, interpolation, crop_pct, crop_mode;
    docs/coming-from-timm.md) from create_model, load(arch=) and a file vitlab converted."""
    ref = randomize(timm.create_model(name, pretrained=False, img_size=size))
    match_timm_hybrid_numerics(ref)
    path = tmp_path / f"{name}.pth"
    torch.save(ref.state_dict(), path)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))

    created = vitlab.create_model(name, img_size=size).eval()
    assert created.num_classes == ref.num_classes  # DINOv2's and DINO's: no head, as timm's
    load_checkpoint(created, str(path))  # strict: every timm tensor name is taken
    loaded = vitlab.load(path, arch=name)
    with torch.no_grad():
        expected = ref(x)
        assert rel_err(created(x), expected) <= TOL
        assert rel_err(loaded(x), expected) <= TOL

    vitlab.save(loaded, tmp_path / "converted.safetensors")
    converted = vitlab.load(tmp_path / "converted.safetensors")
    timm_cfg = get_pretrained_cfg(name)
    rule = {"mean": mean, "std": std, "interpolation": timm_cfg.interpolation, "crop_pct": timm_cfg.crop_pct,
            "crop_mode": timm_cfg.crop_mode}
    assert preprocessing(created) == preprocessing(loaded) == preprocessing(converted) == rule


def test_hybrid_features_differ_from_timm_by_the_weight_standardisation_eps(monkeypatch):
    """The hybrid's features miss timm's tolerance (rtol 1e-3, atol 1e-4) on timm's own weights only through the
    weight-standardisation constant: the official (w - mean) / (std + 1e-5) (vit_jax models_resnet.py, what the
    weights were trained with), where timm computes (w - mean) / sqrt(var + 1e-8). With timm's constant (and its
    GroupNorm eps 1e-5) vitlab's stem gives timm's features within its tolerance."""
    torch.manual_seed(0)
    small = dict(depth=1, embed_dim=32, num_heads=2, img_size=32, mlp_ratio=4.0)
    ref = timm.create_model("vit_small_r26_s32_224", pretrained=False, **small).eval()
    with torch.no_grad():  # trained-like GroupNorm affines: the zero-initialised last scale hides the stem
        for key, p in ref.named_parameters():
            if "backbone" in key and "norm" in key:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if key.endswith("weight") else 0.0))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = ref.forward_features(x)

    def features() -> torch.Tensor:
        model = vitlab.create_model("vit_small_r26_s32_224", **small).eval()
        model.load_state_dict(ref.state_dict())
        with torch.no_grad():
            return model.forward_features(x)

    official = features()
    assert not torch.allclose(official, expected, rtol=1e-3, atol=1e-4)
    assert torch.allclose(official, expected, rtol=1e-2, atol=1e-3)

    def timm_standardisation(conv: resnet.StdConv2dSame) -> torch.Tensor:
        var, mean = torch.var_mean(conv.weight, dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (conv.weight - mean) / torch.sqrt(var + 1e-8)

    monkeypatch.setattr(resnet.StdConv2dSame, "standardized_weight", timm_standardisation)
    monkeypatch.setattr(resnet, "GN_EPS", 1e-5)
    torch.testing.assert_close(features(), expected, rtol=1e-3, atol=1e-4)

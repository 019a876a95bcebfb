"""torch.hub.load on the repository: every listed model has an entry, and weights load exactly."""

import importlib.util
from pathlib import Path

import pytest
import torch

import vitlab

REPO = Path(__file__).resolve().parents[1]


def test_entries_cover_every_listed_model():
    # torch.hub.list reads only GitHub repositories; list the entries the way it does, from the module
    spec = importlib.util.spec_from_file_location("hubconf", REPO / "hubconf.py")
    hub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hub)
    names = [n for n in dir(hub) if callable(getattr(hub, n)) and not n.startswith("_")]
    assert {"vit_b16", "vit_ti16_gap", "r50_vit_b16", "r_vit_ti16", "bit_r50x1"} <= set(names)
    timm_names = [n for n in vitlab.list_models("*") if n not in vitlab.list_models()]
    assert "vit_tiny_patch16_224" in timm_names and "vit_small_patch14_dinov2" in timm_names
    assert set(timm_names) <= set(names)  # as timm's hubconf: every timm name is an entry under that name
    assert len(names) == len(vitlab.list_models()) + len(timm_names)


def test_timm_name_entry_builds_and_loads_that_architecture(tmp_path):
    """torch.hub.load(repo, "vit_tiny_patch16_224") builds what vitlab.create_model builds for the name (timm's
    keywords taken); weights= loads a file of that architecture and refuses another."""
    model = torch.hub.load(str(REPO), "vit_tiny_patch16_224", source="local", num_classes=3, drop_path_rate=0.1)
    assert model.config == vitlab.create_model("vit_tiny_patch16_224", num_classes=3, drop_path_rate=0.1).config
    assert model.eval_resize == "timm:bicubic:0.9"
    vitlab.save(model, tmp_path / "ti.safetensors")
    loaded = torch.hub.load(str(REPO), "vit_tiny_patch16_224", source="local", weights=str(tmp_path / "ti.safetensors"))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), loaded(x))
    with pytest.raises(ValueError, match="not vit_small_patch16_224"):
        torch.hub.load(str(REPO), "vit_small_patch16_224", source="local", weights=str(tmp_path / "ti.safetensors"))


def test_hub_model_and_weights(tmp_path):
    model = torch.hub.load(str(REPO), "vit_ti16", source="local", num_classes=3, image_size=32, depth=1)
    assert model.config.num_classes == 3 and model.config.depth == 1
    # weights= must hold the architecture the entry names: a depth-1 file is not a ViT-Ti/16
    model = torch.hub.load(str(REPO), "vit_ti16", source="local", num_classes=3, image_size=32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    vitlab.save(model, tmp_path / "m.safetensors")
    loaded = torch.hub.load(str(REPO), "vit_ti16", source="local", weights=str(tmp_path / "m.safetensors"))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), loaded(x))


def test_hub_entry_refuses_weights_of_another_model(tmp_path):
    vitlab.save(vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=32), tmp_path / "ti.safetensors")
    weights = str(tmp_path / "ti.safetensors")
    with pytest.raises(ValueError) as refused:
        torch.hub.load(str(REPO), "vit_b16", source="local", weights=weights)
    assert str(refused.value) == (
        f"vit_b16: {weights} holds ViT/16 (depth 12, width 192, 3 heads, MLP 768) (width 192, not 768; mlp_dim 768, "
        "not 3072; num_heads 3, not 12), not ViT-B/16; use that architecture's entry point, or vitlab.load")
    assert torch.hub.load(str(REPO), "vit_ti16", source="local", weights=weights).config.width == 192

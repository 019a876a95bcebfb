"""One pre-processing rule for a model of a timm name: timm's pipeline for the name and tag (its pretrained cfg's
interpolation, crop_pct, crop_mode, input_size, mean and std), reported in `pretrained_cfg` and run by
`vitlab.transforms` whichever way the model was made: `create_model(NAME)`, `vitlab.load` of a timm state dict
with `arch=NAME`, of a timm hub folder (as timm's save_for_hf writes it) and through `create_model(NAME,
pretrained=True)`, timm's `load_checkpoint` into a vitlab model, and a file vitlab converted from one. vitlab names
keep the official pipeline, and an evaluation resize a vitlab run recorded wins. timm is the reference: its
pretrained cfgs for every timm name vitlab builds and every tag of vitlab's catalogue; nothing is downloaded."""

import pytest
import torch

import vitlab
from vitlab.hub import catalogue
from vitlab.weights.convert import convert

pytest.importorskip("timm")
import timm.data  # noqa: E402
from timm.models import get_pretrained_cfg, load_checkpoint  # noqa: E402

KEYS = ("interpolation", "crop_pct", "crop_mode", "input_size", "mean", "std")


def timm_named() -> list[str]:
    """Every timm name vitlab builds (bare: timm's default tag) and every "ARCH.TAG" of the catalogue."""
    names = []
    for arch in dict.fromkeys(vitlab.list_models(["vit_*", "deit_*"]) + list(catalogue.timm_models())):
        names += [arch, *(f"{arch}.{tag}" for tag in catalogue.timm_models().get(arch, {}).get("tags", {}))]
    return names


NAMES = timm_named()


def fields(cfg: dict) -> dict:
    return {k: tuple(cfg[k]) if isinstance(cfg[k], list | tuple) else cfg[k] for k in KEYS}


def timm_fields(name: str) -> dict:
    return fields(get_pretrained_cfg(name).to_dict())


def test_every_timm_name_and_catalogue_tag_is_covered():
    assert len(vitlab.list_models(["vit_*", "deit_*"])) == 46
    assert any(n.startswith("resnetv2_") for n in NAMES) and len(NAMES) > 100
    assert {timm_fields(n)["crop_pct"] for n in NAMES} == {0.875, 0.9, 0.95, 1.0}  # the table's every value


@pytest.mark.parametrize("name", NAMES)
def test_create_model_reports_timms_pipeline(name):
    with torch.device("meta"):  # the config is all pre-processing needs
        model = vitlab.create_model(name)
    assert fields(model.pretrained_cfg) == timm_fields(name)
    assert fields(timm.data.resolve_data_config(model=model)) == fields(
        timm.data.resolve_data_config(pretrained_cfg=get_pretrained_cfg(name).to_dict()))


def random_timm(name: str, **kwargs) -> torch.nn.Module:
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    return model


# small models whose pipelines differ: crop_pct 0.9 (ViT, DeiT with ImageNet's statistics), 1.0 at 384, 0.875
# bilinear and 1.0 bilinear at 448 by BiT tag
LOADED = ["vit_tiny_patch16_224.augreg_in21k", "deit_tiny_patch16_224", "vit_tiny_patch16_384",
          "resnetv2_50x1_bit.goog_in21k", "resnetv2_50x1_bit.goog_in21k_ft_in1k"]  # fmt: skip


@pytest.mark.parametrize("name", LOADED)
def test_every_way_of_making_the_model_reports_timms_pipeline(name, tmp_path):
    """A timm state dict loaded with arch=NAME, timm's load_checkpoint into create_model(NAME), and vitlab's
    conversions of the loaded model (vitlab's file, timm's folder read back): timm's fields throughout."""
    want = timm_fields(name)
    ref = random_timm(name)
    torch.save(ref.state_dict(), tmp_path / "timm.pth")
    created = vitlab.create_model(name)
    if not name.startswith("resnetv2_"):  # a vitlab ViT takes timm's tensor names (a BiT its own only)
        load_checkpoint(created, str(tmp_path / "timm.pth"))
    loaded = vitlab.load(tmp_path / "timm.pth", arch=name)
    vitlab.save(loaded, tmp_path / "vitlab.safetensors")
    convert(tmp_path / "timm.pth", tmp_path / "folder", to="timm", arch=name)
    for model in (created, loaded, vitlab.load(tmp_path / "vitlab.safetensors"), vitlab.load(tmp_path / "folder")):
        assert fields(model.pretrained_cfg) == want


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224.augreg_in21k", "resnetv2_50x1_bit.goog_in21k_ft_in1k"])
def test_timm_hub_folder_reports_timms_pipeline(name, tmp_path, monkeypatch):
    """A folder as timm's save_for_hf writes it (what hf-hub:timm/ARCH.TAG holds), loaded by path and by
    create_model(NAME, pretrained=True) through a hub fetch served from it."""
    from timm.models import save_for_hf

    from vitlab.hub import hf

    ref = random_timm(name)
    ref.pretrained_cfg = get_pretrained_cfg(name).to_dict()  # as a published model carries it
    save_for_hf(ref, tmp_path / "hub", safe_serialization=True)
    monkeypatch.setattr(hf, "fetch_repo", lambda entry, force=False: tmp_path / "hub")
    for model in (vitlab.load(tmp_path / "hub"), vitlab.create_model(name, pretrained=True)):
        assert fields(model.pretrained_cfg) == timm_fields(name)


def test_vitlab_names_keep_the_official_pipeline_and_a_recorded_resize_wins(tmp_path):
    with torch.device("meta"):
        official = vitlab.create_model("ViT-B/16")
    assert official.pretrained_cfg["crop_mode"] == "squash" and official.pretrained_cfg["crop_pct"] == 1.0
    assert official.pretrained_cfg["interpolation"] == "bilinear" and official.pretrained_cfg["mean"] == (0.5,) * 3
    from vitlab.weights.vitlab_format import save

    model = vitlab.create_model("vit_tiny_patch16_224", img_size=32)
    save(model, tmp_path / "run.safetensors", meta={"eval_resize": "big_vision"})  # as a training run records it
    trained = vitlab.load(tmp_path / "run.safetensors")
    assert trained.pretrained_cfg["vitlab_eval_resize"] == "big_vision"
    assert vitlab.transforms(trained).base.resize == "big_vision"

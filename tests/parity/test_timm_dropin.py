"""vitlab as a drop-in for timm: register tokens and layer scale (timm's vit_*_reg4_* and DINOv2 models load with
timm's logits), timm's model attributes and methods (reset_classifier with another pooling, set_input_size,
dynamic_img_size / dynamic_img_pad, list_models patterns, DeiT names), TorchScript refused in one line.
Every value is compared with timm itself on shared weights."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitlab
from vitlab.weights.timm import write_timm

warnings.filterwarnings("ignore", category=UserWarning)

# timm names with registers and/or layer scale, at depth 2 to stay fast; DINOv2 at a smaller size.
REGISTER_MODELS = [
    ("vit_base_patch16_reg4_gap_256", {"img_size": 64}),  # registers, no pos-embed prefix entries, fc_norm
    ("vit_medium_patch16_reg4_gap_256", {"img_size": 64}),  # + layer scale
    ("vit_little_patch16_reg4_gap_256", {"img_size": 64}),  # + mlp_ratio 5.6
    ("vit_so150m_patch16_reg4_gap_256", {"img_size": 64}),  # registers with position entries, fc_norm=False
    ("vit_small_patch14_reg4_dinov2", {"img_size": 56}),  # class token + registers + layer scale
    ("vit_small_patch14_dinov2", {"img_size": 56}),  # layer scale alone
]


def shared_weights_timm(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, depth=2, **kwargs).eval()
    with torch.no_grad():  # move every tensor off its initial value (gammas, registers, zero heads included)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name, kwargs", REGISTER_MODELS, ids=[n for n, _ in REGISTER_MODELS])
def test_timm_register_and_layer_scale_checkpoints_load_with_timms_logits(tmp_path, name, kwargs):
    ref = shared_weights_timm(name, **kwargs)
    from timm.models import save_for_hf

    save_for_hf(ref, tmp_path / "hub", model_args={"num_classes": 7, "depth": 2, **kwargs})
    model = vitlab.load(tmp_path / "hub").eval()
    size = kwargs.get("img_size", 256)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert rel(model(x), ref(x)) <= 1e-5
        # the same pooled representation and tokens, not only the logits
        assert rel(model.forward_features(x), ref.forward_features(x)) <= 1e-5
    assert model.num_prefix_tokens == ref.num_prefix_tokens and model.embed_dim == ref.embed_dim
    # timm reading vitlab's export back
    write_timm(model, tmp_path / "export")
    back = timm.create_model(f"local-dir:{tmp_path / 'export'}", pretrained=True).eval()
    with torch.no_grad():
        assert rel(back(x), ref(x)) <= 1e-5


def test_register_model_inferred_from_tensors_alone(tmp_path):
    # vit_base_patch16_reg4_gap_256 has the standard B width: the tensors tell registers, missing prefix entries of
    # the position embedding and the LayerNorm after pooling without any name.
    ref = shared_weights_timm("vit_base_patch16_reg4_gap_256")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "w.safetensors")
    model = vitlab.load(tmp_path / "w.safetensors").eval()
    cfg = model.config
    assert (cfg.reg_tokens, cfg.pos_embed_prefix, cfg.fc_norm, cfg.image_size) == (4, False, True, (256, 256))
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        assert rel(model(x), ref(x)) <= 1e-5


def test_registers_round_trip_vitlab_format_and_refuse_formats_without_them(tmp_path):
    model = vitlab.create_model("ViT-Ti/16", image_size=32, num_classes=3, depth=1, reg_tokens=4).eval()
    vitlab.save(model, tmp_path / "r.safetensors")
    back = vitlab.load(tmp_path / "r.safetensors").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    assert back.config.reg_tokens == 4
    from vitlab.weights.convert import write

    for fmt, needle in (("jax-npz", "register tokens"), ("hf", "register tokens")):
        with pytest.raises((ValueError, vitlab.weights.WeightsError), match=needle):
            write(model, tmp_path / f"out-{fmt}", fmt)


def test_an_ordinary_models_file_does_not_name_the_fields_added_after_the_paper():
    # earlier vitlab versions refuse unknown config fields: the paper's ViT is written as before
    d = vitlab.create_model("ViT-Ti/16").config.to_dict()
    assert not {"reg_tokens", "class_token", "pos_embed_prefix", "fc_norm", "layer_scale"} & set(d)


# --- timm's habits on shared weights ------------------------------------------------------------------------------
def twins(name: str = "vit_tiny_patch16_224", **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A timm model and the vitlab model of the same name holding the same (perturbed) weights."""
    ref = shared_weights_timm(name, **kwargs)
    model = vitlab.create_model(name, num_classes=7, depth=2, **kwargs).eval()
    model.load_state_dict(ref.state_dict())
    return model, ref


def test_reset_classifier_to_average_pooling_matches_timm():
    model, ref = twins()
    model.reset_classifier(0, "avg")
    ref.reset_classifier(0, "avg")
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        # timm's "avg" on a class-token model: the mean of the patch tokens (fc_norm is fixed at construction)
        assert rel(model.forward_head(model.forward_features(x)), ref.forward_head(ref.forward_features(x))) < 1e-5
    assert model(x).shape == (2, 192) and model.global_pool == "avg" and model.num_prefix_tokens == 1
    with pytest.raises(ValueError, match="global_pool='max'"):
        model.reset_classifier(3, "max")
    gap = vitlab.create_model("ViT-Ti/16-gap")
    with pytest.raises(ValueError, match="needs a class token"):
        gap.reset_classifier(3, "token")


def test_timms_model_attributes():
    for name, kwargs in [("vit_tiny_patch16_224", {}), ("vit_medium_patch16_reg4_gap_256", {})]:
        model, ref = twins(name, **kwargs)
        for attr in ("embed_dim", "num_prefix_tokens", "num_features", "has_class_token", "no_embed_class",
                     "global_pool", "num_classes"):
            assert getattr(model, attr) == getattr(ref, attr), attr
        assert tuple(model.patch_embed.patch_size) == tuple(ref.patch_embed.patch_size)


@pytest.mark.parametrize("img_size, patch_size", [((192, 128), None), (None, 8), (112, 14)])
def test_set_input_size_matches_timm(img_size, patch_size):
    model, ref = twins()
    model.set_input_size(img_size=img_size, patch_size=patch_size)
    ref.set_input_size(img_size=img_size, patch_size=patch_size)
    assert model.pos_embed.shape == ref.pos_embed.shape
    assert model.config.image_size == tuple(ref.patch_embed.img_size)
    # the patch kernel is resampled as timm does (FlexiViT's pseudo-inverse); the position embedding the official
    # way (bilinear, corners aligned), which is what vitlab.load(..., image_size=) gives for the same weights
    assert rel(model.patch_embed.proj.weight, ref.patch_embed.proj.weight) < 1e-5
    fresh, _ = twins()
    fresh_state = {k: v for k, v in fresh.state_dict().items()}
    from vitlab.models.posembed import resample_pos_embed

    grid = model.config.grid_size()
    assert torch.allclose(model.pos_embed, resample_pos_embed(fresh_state["pos_embed"], grid, (14, 14), 1))
    h, w = model.config.image_size
    assert model(torch.randn(1, 3, h, w)).shape == (1, 7)


def test_dynamic_img_size_and_pad_are_timms():
    model, ref = twins(dynamic_img_size=True)
    x = torch.randn(1, 3, 160, 96)
    with torch.no_grad():
        assert model(x).shape == ref(x).shape == (1, 7)
    model, ref = twins(dynamic_img_size=True, dynamic_img_pad=True)
    odd = torch.randn(2, 3, 220, 211)  # not multiples of 16: zero-padded right and bottom to the native 224
    with torch.no_grad():
        assert rel(model.forward_features(odd), ref.forward_features(odd)) < 1e-5
    model, ref = twins()  # a fixed input size, timm's default: both refuse another one
    with pytest.raises(AssertionError, match="Input height \\(220\\) doesn't match model \\(224\\)"):
        ref(odd)
    with pytest.raises(ValueError, match="^model input is 220×211 pixels but this model takes 224×224; "):
        model(odd)


def test_deit_names_are_timms_vits():
    for name in ("deit_tiny_patch16_224", "deit_small_patch16_224", "deit_base_patch16_384"):
        with torch.device("meta"):  # shapes only: no initialisation
            ref = timm.create_model(name, pretrained=False)
            model = vitlab.create_model(name)
        assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
        assert model.pretrained_cfg["mean"] == ref.pretrained_cfg["mean"]
        assert model.config.image_size == tuple(ref.patch_embed.img_size)
    model, ref = twins("deit_tiny_patch16_224")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert rel(model(x), ref(x)) < 1e-5


def test_list_models_takes_timms_patterns_and_pretrained():
    assert vitlab.list_models() == vitlab.models.variant_names()  # the contract's list, unchanged
    names = vitlab.list_models("vit_*")
    assert "vit_base_patch16_224" in names and "vit_base_patch16_reg4_gap_256" in names
    assert all(n.startswith("vit_") for n in names)
    assert set(vitlab.list_models(["deit_*"])) <= set(timm.list_models("deit_*"))
    published = vitlab.list_models("vit_tiny_patch16_224", pretrained=True)
    assert published == [n for n in timm.list_models("vit_tiny_patch16_224", pretrained=True)]
    assert "i21k:ViT-B/16" in vitlab.list_models("ViT-B/16", pretrained=True)


def test_register_names_build_and_point_to_their_weights():
    model = vitlab.create_model("vit_small_patch14_reg4_dinov2", num_classes=0, depth=1)
    assert model.config.reg_tokens == 4 and model.config.layer_scale == 1e-5 and model.config.image_size == (518, 518)
    with pytest.raises(ValueError, match="hf-hub:timm/vit_small_patch14_reg4_dinov2"):
        vitlab.create_model("vit_small_patch14_reg4_dinov2", pretrained=True)


def test_torchscript_is_refused_in_one_line_and_tracing_works():
    model = vitlab.create_model("ViT-Ti/16", image_size=32, depth=1, num_classes=3).eval()
    with pytest.raises(RuntimeError, match=r"not TorchScript-scriptable; use torch\.jit\.trace"):
        torch.jit.script(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks become constants, as traced
        traced = torch.jit.trace(model, x)
        assert torch.allclose(traced(x), model(x), atol=1e-6)


def test_the_package_is_typed():
    from importlib.resources import files

    assert files("vitlab").joinpath("py.typed").is_file()



@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_base_patch16_reg4_gap_256", "vit_small_patch14_dinov2"])
def test_no_pooling_at_creation_is_timms_model(name):
    """create_model(name, global_pool="") builds timm's model of those keywords: its parameters (the final norm on
    the tokens, no fc_norm), every token out, timm's values on timm's weights."""
    size = 56 if "patch14" in name else 64
    ref = timm.create_model(name, num_classes=0, global_pool="", depth=2, img_size=size).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model = vitlab.create_model(name, num_classes=0, global_pool="", depth=2, img_size=size).eval()
    model.load_state_dict(ref.state_dict())  # strict: timm's tensor names and shapes
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert model(x).shape == ref(x).shape == ref.forward_features(x).shape  # (N, T, D): every token
        assert rel(model(x), ref(x)) < 1e-5
    assert model.global_pool == ref.global_pool == ""
    with pytest.raises(ValueError, match=r"^global_pool='' with pretrained weights: load them, then "):
        vitlab.create_model(name, global_pool="", pretrained=True)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_base_patch16_reg4_gap_256"])
def test_reset_classifier_without_pooling_gives_timms_tokens(name):
    """reset_classifier(n, "") as timm's: every token through fc_norm (where the model has one) and the head."""
    model, ref = twins(name, img_size=64)
    model.reset_classifier(5, "")
    ref.reset_classifier(5, "")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        model.head.weight.copy_(ref.head.weight)
        model.head.bias.copy_(ref.head.bias)
        assert model(x).shape == ref(x).shape == (2, 16 + ref.num_prefix_tokens, 5)
        assert rel(model(x), ref(x)) < 1e-5

"""timm <-> vitlab: weights copied either way give the same outputs (relative L2 error <= 1e-5 in float32 on random
inputs, random weights, small images), and every bad file or unsupported timm feature is a WeightsError naming the
file and the tensor or option. timm models are built with pretrained=False: nothing is downloaded."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitlab import create_model
from vitlab.errors import WeightsError
from vitlab.models import ViTConfig, build_model
from vitlab.weights.timm import read_timm, timm_config, timm_model_args, timm_model_name, to_timm_state_dict, write_timm

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402

TOL = 1e-5
# (vitlab name, image size, timm name): small images keep the suite fast; the architectures are the real ones.
CASES = [
    ("ViT-Ti/16", 64, "vit_tiny_patch16_224"),
    ("ViT-S/16", 64, "vit_small_patch16_224"),
    ("ViT-B/32", 96, "vit_base_patch32_224"),
    ("ViT-Ti/16-gap", 64, "vit_tiny_patch16_224"),  # + class_token=False, global_pool="avg", fc_norm=False
    ("R+ViT-Ti/16", 64, "vit_tiny_r_s16_p8_224"),
    ("R50+ViT-B/16", 64, "vit_base_r50_s16_224"),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere: the initialisers zero heads, biases and norm offsets, which would hide a
    mis-mapped tensor. The hybrid stem's convs get std 10 (see `match_timm_hybrid_numerics`)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            stem_conv = p.ndim == 4 and ("backbone" in name or name.startswith("stem."))
            std = 10.0 if stem_conv else 0.05 if p.ndim > 1 else 0.1
            noise = torch.randn(p.shape, generator=g) * std
            p.add_(noise) if p.ndim == 1 else p.copy_(noise)  # 1-D: norm scales stay near 1, biases near 0
    return model.eval()


def match_timm_hybrid_numerics(model: nn.Module) -> nn.Module:
    """timm's hybrid stem differs from the official one (vit_jax models_resnet.py) in two constants:
    GroupNorm eps 1e-5 (official 1e-6), and weight standardisation (w - mean) / sqrt(var + 1e-8) (official
    (w - mean) / (std + 1e-5)). We set timm's GroupNorm eps to 1e-6, and the stem convs get weights of std 10:
    standardisation is scale-invariant, so that changes nothing the test checks except making both eps
    conventions negligible (1e-5 / 10 = 1e-6)."""
    for m in model.modules():
        if isinstance(m, nn.GroupNorm):
            m.eps = 1e-6
    return model


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def pair(request):
    """A random vitlab model, the timm model built from timm_model_name/args with its weights, and an input."""
    name, size, timm_name = request.param
    model = randomize(create_model(name, image_size=size, num_classes=10))
    cfg = model.config
    assert timm_model_name(cfg) == timm_name
    ref = timm.create_model(timm_name, pretrained=False, **timm_model_args(cfg))
    match_timm_hybrid_numerics(ref).eval().load_state_dict(to_timm_state_dict(model))
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model, ref, x, ref(x)


def vitlab_logits(ck, x: torch.Tensor) -> torch.Tensor:
    with torch.device("meta"):  # skip initialising weights that are replaced at once (seconds for B-sized models)
        model = build_model(ck.config).eval()
    model.load_state_dict(ck.state_dict, assign=True)
    with torch.no_grad():
        return model(x)


def test_vitlab_to_timm(pair):
    model, _, x, ref_logits = pair
    with torch.no_grad():
        assert rel_err(model(x), ref_logits) <= TOL


def test_timm_hub_folder_to_vitlab(pair, tmp_path):
    model, ref, x, ref_logits = pair
    save_for_hf(ref, tmp_path / "hub", safe_serialization=True)  # timm's own hub export
    ck = read_timm(tmp_path / "hub")
    assert ck.source == "timm" and ck.config == model.config
    assert rel_err(vitlab_logits(ck, x), ref_logits) <= TOL


def test_timm_bare_state_dict_to_vitlab(pair, tmp_path):
    """Architecture inferred from shapes (safetensors), and named with arch= (a .pth training checkpoint)."""
    model, ref, x, ref_logits = pair
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    inferred = read_timm(tmp_path / "w.safetensors")
    assert inferred.config == model.config
    assert rel_err(vitlab_logits(inferred, x), ref_logits) <= TOL
    if model.config.classifier == "gap":
        return  # timm has no name for a Ti GAP model: only a hub folder's model_args can describe it
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}}, tmp_path / "c.pth")
    named = read_timm(tmp_path / "c.pth", arch=timm_model_name(model.config) + ".augreg_in21k")
    assert named.config == model.config


def test_write_timm_hub_folder_loads_in_timm(tmp_path):
    model = randomize(create_model("ViT-Ti/16", image_size=32, num_classes=3, depth=2))
    model.class_names = ["a", "b", "c"]
    write_timm(model, tmp_path / "hub")
    ref = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_err(model(x), ref(x)) <= TOL
    back = read_timm(tmp_path / "hub")
    # create_model keeps the name "ViT-Ti/16" after depth=2; the reader names only what is a registry variant
    assert back.config == model.config.replace(name="") and back.meta["class_names"] == ["a", "b", "c"]
    write_timm(model, tmp_path / "hub")  # replacing an earlier export is fine
    write_timm(model, tmp_path / "bare.safetensors")
    assert read_timm(tmp_path / "bare.safetensors").config == model.config.replace(name="")


def test_old_timm_representation_layer(tmp_path):
    """timm < 0.6 kept the in21k representation layer as pre_logits.fc (Dense + tanh): vitlab's pre_logits."""
    model = randomize(create_model("ViT-Ti/16", image_size=32, num_classes=5, depth=2, representation_size=32))
    old = {k.replace("pre_logits.0.", "pre_logits.fc."): v for k, v in model.state_dict().items()}
    save_file(old, tmp_path / "old.safetensors")
    ck = read_timm(tmp_path / "old.safetensors")
    assert ck.config == model.config.replace(name="")
    assert all(torch.equal(ck.state_dict[k], v) for k, v in model.state_dict().items())
    with pytest.raises(WeightsError, match="representation layer"):
        timm_model_name(model.config)  # today's timm has no pre_logits: refuse rather than drop it


def test_timm_config_names():
    assert timm_config("vit_base_patch16_384.augreg_in21k_ft_in1k") == create_model_config("ViT-B/16", 384)
    assert timm_config("vit_large_r50_s32_224").resnet.layers == (3, 4, 6, 3)
    assert timm_config("vit_base_patch16_gap_224").num_heads == 16  # timm's definition, not the size table
    assert timm_config("vit_base_patch16_224_miil").qkv_bias is False
    assert timm_config("vit_small_r26_s32_384").image_size == (384, 384)


def create_model_config(name: str, size: int) -> ViTConfig:
    from vitlab.models import model_config

    return model_config(name, image_size=size).replace(gelu="exact")


# --- bad input -------------------------------------------------------------------------------------------------
def tiny_timm(**kwargs) -> nn.Module:
    return TimmViT(img_size=32, patch_size=16, embed_dim=192, depth=1, num_heads=3, num_classes=4, **kwargs)


def bare(tmp_path, model_or_tensors, name="w.safetensors"):
    tensors = model_or_tensors if isinstance(model_or_tensors, dict) else model_or_tensors.state_dict()
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / name)
    return tmp_path / name


def raises(path, *needles, **kwargs) -> str:
    with pytest.raises(WeightsError) as info:
        read_timm(path, **kwargs)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_unknown_arch_name(tmp_path):
    path = bare(tmp_path, tiny_timm())
    raises(path, str(path), "vit_gigantic_patch16_224", arch="vit_gigantic_patch16_224")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(qk_norm=True), "qk_norm has no vitlab equivalent (tensor 'blocks.0.attn."),
        (dict(pre_norm=True), "norm_pre."),
        (dict(global_pool="map"), "attn_pool"),
    ],
    ids=["qk-norm", "pre-norm", "map-pool"],  # registers, layer scale, fc_norm: tests/parity/test_timm_dropin.py
)
def test_unsupported_timm_tensors(tmp_path, kwargs, needle):
    path = bare(tmp_path, tiny_timm(**kwargs))
    raises(path, str(path), needle)


@pytest.mark.parametrize(
    "args, needle",
    [
        ({"dynamic_img_pad": True}, "dynamic_img_pad=True"),
        ({"global_pool": "max"}, "global_pool='max'"),
        ({"act_layer": "quick_gelu"}, "act_layer='quick_gelu'"),
        ({"made_up_option": 1}, "made_up_option"),
    ],
)
def test_unsupported_timm_options(tmp_path, args, needle):
    hub = tmp_path / "hub"
    hub.mkdir()
    bare(hub, create_model("ViT-Ti/16", image_size=32, num_classes=4), "model.safetensors")
    cfg = {"architecture": "vit_tiny_patch16_224", "num_classes": 4, "model_args": args, "pretrained_cfg": {}}
    (hub / "config.json").write_text(json.dumps(cfg))
    raises(hub, str(hub / "config.json"), needle)


def test_missing_extra_and_misshapen_tensors(tmp_path):
    tensors = tiny_timm().state_dict()
    raises(bare(tmp_path, {k: v for k, v in tensors.items() if k != "blocks.0.mlp.fc2.bias"}, "a.safetensors"),
           "a.safetensors", "missing tensors blocks.0.mlp.fc2.bias")  # fmt: skip
    raises(bare(tmp_path, {**tensors, "blocks.0.attn.extra": torch.zeros(3)}, "b.safetensors"),
           "b.safetensors", "unexpected tensors blocks.0.attn.extra")  # fmt: skip
    raises(bare(tmp_path, {**tensors, "head.bias": torch.zeros(7)}, "c.safetensors"),
           "c.safetensors", "head.bias", "(7,)", "(4,)")  # fmt: skip
    # a 1-block Ti model read as ViT-S/16: the message names the architecture it was checked against
    raises(tmp_path / "c.safetensors", "vit_small_patch16_224", "missing tensors blocks.1",
           arch="vit_small_patch16_224")  # fmt: skip


def test_corrupt_and_unsafe_files(tmp_path):
    good = bare(tmp_path, tiny_timm())
    data = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    raises(tmp_path / "cut.safetensors", "cut.safetensors", "truncated")
    torch.save(tiny_timm().state_dict(), tmp_path / "w.pth")
    (tmp_path / "cut.pth").write_bytes((tmp_path / "w.pth").read_bytes()[:1000])
    raises(tmp_path / "cut.pth", "cut.pth", "not a readable PyTorch file")
    torch.save({"state_dict": load_file(good), "args": Opaque()}, tmp_path / "unsafe.pth")
    raises(tmp_path / "unsafe.pth", "unsafe.pth", "weights_only=True", "Opaque")
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "config.json").write_text("{not json")
    raises(tmp_path / "hub", "config.json", "not valid JSON")


class Opaque:
    """An object torch.load(weights_only=True) refuses to rebuild."""


def test_unrepresentable_models_are_refused(tmp_path):
    rel = build_model(ViTConfig(image_size=32, patch_size=16, width=64, depth=1, mlp_dim=128, num_heads=2,
                                pos_embed="relative"))  # fmt: skip
    with pytest.raises(WeightsError, match="pos_embed='relative'"):
        to_timm_state_dict(rel)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep me")
    with pytest.raises(WeightsError, match="notes.txt"):
        write_timm(create_model("ViT-Ti/16", image_size=32, depth=1), tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep me"


def test_a_timm_model_built_for_any_input_size_loads_as_one(tmp_path):
    """timm's dynamic_img_size=True, from a hub folder's model_args or a model object, carries over: vitlab's model
    then takes another size too, with timm's outputs; without it vitlab's refuses that size, as timm's does."""
    import vitlab
    from vitlab.weights.load import model_from_checkpoint, read_module

    args = {"img_size": 64, "depth": 2, "num_classes": 5}
    ref = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, dynamic_img_size=True, **args))
    native, x = torch.randn(2, 3, 64, 64), torch.randn(2, 3, 96, 80)
    with torch.no_grad():
        expected = ref(native)
    save_for_hf(ref, tmp_path / "hub", safe_serialization=True, model_args={**args, "dynamic_img_size": True})
    for model in (model_from_checkpoint(read_module(ref), "<timm object>"), vitlab.load(tmp_path / "hub")):
        assert model.dynamic_img_size is True
        with torch.no_grad():
            assert rel_err(model(native), expected) <= TOL
            # taken, the position embedding resampled the official way (timm's is bicubic: docs/models.md)
            assert model(x).shape == ref(x).shape == (2, 5)
    fixed = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args)
    with pytest.raises(ValueError, match="model input is 96×80 pixels but this model takes 64×64"):
        model_from_checkpoint(read_module(fixed), "<timm object>")(x)

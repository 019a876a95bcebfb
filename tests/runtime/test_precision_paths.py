"""A model loaded with a precision computes in it on every public forward path (forward, forward_features,
forward_head, forward_intermediates, forward_inspect), takes float32 input on each, returns float32 floating-point
outputs on each, and `model.precision` names what its layers compute in: ViT, the ResNet hybrid and BiT alike.
What a layer computes in is read by forward hooks on every Linear and convolution: the dtype of its result, or
int8 for a dynamic int8 Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitlab
from vitlab.models import BiTConfig, ResNetConfig, ViTConfig, build_model
from vitlab.runtime.quantize import Int8DynamicLinear

CONFIGS = {
    "vit": ViTConfig(image_size=8, patch_size=4, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=3),
    "hybrid": ViTConfig(image_size=16, patch_size=1, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=3,
                        resnet=ResNetConfig(layers=(1,), width_factor=0.5)),
    "bit": BiTConfig(layers=(1,), num_classes=3, image_size=16),
}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def paths(model: nn.Module, x: torch.Tensor) -> dict[str, object]:
    """Each public forward path with float32 input (forward_head: float32 features of the right shape)."""
    with torch.no_grad():
        features = torch.randn_like(build_model(model.config).forward_features(x))
    calls = {
        "forward": lambda: model(x),
        "forward_features": lambda: model.forward_features(x),
        "forward_head": lambda: model.forward_head(features),
        "forward_intermediates": lambda: model.forward_intermediates(x),
    }
    if hasattr(type(model), "forward_inspect"):
        calls["forward_inspect"] = lambda: model.forward_inspect(x)
    if hasattr(type(model), "forward_unobserved"):
        calls["forward_unobserved"] = lambda: model.forward_unobserved(x)
    public = {n for n in dir(type(model)) if n == "forward" or n.startswith("forward_")}
    assert set(calls) == public, f"a public forward path is untested: {sorted(public - set(calls))}"
    return calls


def computed_in(model: nn.Module, call) -> tuple[object, set[str]]:
    """(the call's output, what its Linear and convolution layers computed in: bf16, fp32 or int8)."""
    seen: set[str] = set()

    def record(module, args, out):
        seen.add("int8" if isinstance(module, Int8DynamicLinear) else DTYPE_NAMES.get(out.dtype, str(out.dtype)))

    layers = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d | Int8DynamicLinear)]
    handles = [m.register_forward_hook(record) for m in layers]
    try:
        with torch.no_grad():
            out = call()
    finally:
        for h in handles:
            h.remove()
    assert seen, "no Linear or convolution ran"
    return out, seen


def floating(out: object) -> list[torch.Tensor]:
    """Every floating-point tensor in an output (nested in tuples, lists and dicts)."""
    if torch.is_tensor(out):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, tuple | list):
        return [t for o in out for t in floating(o)]
    return []


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("precision-paths")
    torch.manual_seed(0)
    files = {}
    for family, config in CONFIGS.items():
        files[family] = folder / f"{family}.safetensors"
        vitlab.save(build_model(config), files[family])
    return files


def pixels(family: str) -> torch.Tensor:
    size = CONFIGS[family].image_size
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_bf16_computes_in_bf16_on_every_path_from_float32_input(weights, family):
    model = vitlab.load(weights[family], precision="bf16")
    assert model.precision.name == "bf16"
    for name, call in paths(model, pixels(family)).items():
        out, seen = computed_in(model, call)
        assert seen == {"bf16"}, (name, seen)
        dtypes = {t.dtype for t in floating(out)}
        assert dtypes == {torch.float32}, (name, dtypes)  # the rule on every path: float32 out


@pytest.mark.parametrize("family", list(CONFIGS))
def test_bf16_features_are_the_explicit_bf16_computation(weights, family):
    """forward_features of the loaded model equals the float32 model's under bf16 autocast (with bf16 weights and
    input for a ViT, whose weights are cast), returned in float32."""
    x, reference = pixels(family), vitlab.load(weights[family])
    if family == "vit":
        reference, x_ref = reference.to(torch.bfloat16), x.to(torch.bfloat16)
    else:
        x_ref = x
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference.forward_features(x_ref).float()
    with torch.no_grad():
        got = vitlab.load(weights[family], precision="bf16").forward_features(x)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)


def test_int8_reports_what_the_layers_compute_on_every_path(weights):
    """int8 replaces a ViT's and a hybrid's encoder Linear layers (the head and the convolutions stay float32);
    BiT's only Linear is its head, so a BiT loaded with int8 computes, and says it computes, in float32."""
    for family in CONFIGS:
        model = vitlab.load(weights[family], precision="int8")
        expected = {"vit": {"int8", "fp32"}, "hybrid": {"int8", "fp32"}, "bit": {"fp32"}}[family]
        assert model.precision.name == ("fp32" if family == "bit" else "int8"), (family, model.precision)
        for name, call in paths(model, pixels(family)).items():
            out, seen = computed_in(model, call)
            assert seen <= expected and (name == "forward_head" or seen == expected), (family, name, seen)
            assert {t.dtype for t in floating(out)} == {torch.float32}, (family, name)

"""What reaches inside a model sees on vitlab's ViTs what it sees on timm's of the same name and weights: forward
hooks on the patch embedding, every block, its attention and MLP and the final norm get tensors of timm's shapes
and values during `model(x)` and `forward_features(x)`; torchvision's `create_feature_extractor` returns timm's
shapes and values for every module both models have; captum's layer attributions and pytorch-grad-cam's maps equal
timm's."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
from timm.models._features_fx import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor

import vitlab

warnings.filterwarnings("ignore", category=UserWarning)

# (timm name, keywords): a class token, registers + layer scale + mean pooling, a hybrid (a ResNet stem)
CASES = [
    ("vit_tiny_patch16_224", {"depth": 3, "img_size": 32}),
    ("vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 28}),
    ("vit_base_patch16_reg4_gap_256", {"depth": 2, "img_size": 32, "embed_dim": 32, "num_heads": 2}),
    ("vit_tiny_r_s16_p8_224", {"depth": 2, "img_size": 64}),
]
IDS = [name for name, _ in CASES]


def pair(name: str, kwargs: dict) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """timm's model (random weights moved off their initial values), vitlab's of the same name with timm's weights,
    and an input."""
    torch.manual_seed(0)
    ref = timm.create_model(name, num_classes=5, **kwargs).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours = vitlab.create_model(name, num_classes=5, **kwargs).eval()
    ours.load_state_dict(ref.state_dict())
    size = kwargs["img_size"]
    return ref, ours, torch.randn(2, 3, size, size)


def observed(model: torch.nn.Module) -> list[str]:
    """The modules a user hooks: the patch embedding, every block, its attention and MLP, the final norm."""
    names = ["patch_embed", "norm"]
    for i in range(len(model.blocks)):
        names += [f"blocks.{i}", f"blocks.{i}.attn", f"blocks.{i}.mlp"]
    return names


def hooked_outputs(model: torch.nn.Module, x: torch.Tensor, path: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    hooks = [model.get_submodule(n).register_forward_hook(lambda m, a, out, n=n: seen.__setitem__(n, out))
             for n in observed(model)]
    with torch.no_grad():
        getattr(model, path)(x)
    for hook in hooks:
        hook.remove()
    return seen


def assert_relative(ours: torch.Tensor, theirs: torch.Tensor, tol: float, what: str) -> None:
    assert ours.shape == theirs.shape, f"{what}: {tuple(ours.shape)} vs timm's {tuple(theirs.shape)}"
    err = ((ours - theirs).norm() / theirs.norm().clamp_min(1e-12)).item()
    assert err <= tol, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("path", ["forward", "forward_features"])
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_forward_hooks_see_timms_tensors(name, kwargs, path):
    ref, ours, x = pair(name, kwargs)
    theirs, mine = hooked_outputs(ref, x, path), hooked_outputs(ours, x, path)
    assert list(mine) == list(theirs) or set(mine) == set(theirs)
    for node in observed(ours):
        assert torch.is_tensor(mine[node]), f"{node} returned {type(mine[node]).__name__}, timm's a tensor"
        assert_relative(mine[node], theirs[node], 1e-5, node)


def tracer_kwargs() -> dict:
    return {"leaf_modules": list(get_notrace_modules()), "autowrap_functions": list(get_notrace_functions())}


@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_feature_extractor_gives_timms_shapes_for_every_module(name, kwargs):
    """Every module both models have, as a return node (torchvision takes a module's last operation)."""
    ref, ours, x = pair(name, kwargs)
    theirs = dict(ref.named_modules())
    common = [n for n, _ in ours.named_modules() if n and n in theirs]
    assert set(observed(ours)) <= set(common)
    with torch.no_grad():
        for node in common:
            expected = create_feature_extractor(ref, [node], tracer_kwargs=tracer_kwargs())(x)[node]
            got = create_feature_extractor(ours, [node], tracer_kwargs=tracer_kwargs())(x)[node]
            assert_relative(got, expected, 1e-5, node)


def attribution_pair(name: str, kwargs: dict):
    ref, ours, x = pair(name, kwargs)
    ref.zero_grad(set_to_none=True)
    return ref.double(), ours.double(), x.double()


@pytest.mark.parametrize("layer", ["patch_embed", "blocks.1"])
@pytest.mark.parametrize("name, kwargs", CASES[:2], ids=IDS[:2])
def test_captum_layer_attributions_equal_timms(name, kwargs, layer):
    captum = pytest.importorskip("captum.attr")
    ref, ours, x = attribution_pair(name, kwargs)
    for method in (captum.LayerIntegratedGradients, captum.LayerConductance):
        got = method(ours, ours.get_submodule(layer)).attribute(x, target=3, n_steps=8)
        expected = method(ref, ref.get_submodule(layer)).attribute(x, target=3, n_steps=8)
        assert_relative(got, expected, 1e-4, f"{method.__name__} on {layer}")


def tokens_to_map(model: torch.nn.Module):
    """pytorch-grad-cam's reshape for ViTs: the patch tokens as a (N, D, gh, gw) map."""
    prefix = model.num_prefix_tokens

    def reshape(tokens: torch.Tensor) -> torch.Tensor:
        patches = tokens[:, prefix:]
        side = int(patches.shape[1] ** 0.5)
        return patches.reshape(patches.shape[0], side, side, -1).permute(0, 3, 1, 2)

    return reshape


@pytest.mark.parametrize("layer", ["blocks.-2", "norm"])
@pytest.mark.parametrize("name, kwargs", CASES[:2], ids=IDS[:2])
def test_grad_cam_equals_timms(name, kwargs, layer):
    grad_cam = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    ref, ours, x = attribution_pair(name, kwargs)
    maps = []
    for model in (ours, ref):
        module = model.blocks[-2] if layer == "blocks.-2" else model.norm
        with grad_cam.GradCAM(model, [module], reshape_transform=tokens_to_map(model)) as cam:
            maps.append(torch.from_numpy(cam(x, targets=[ClassifierOutputTarget(3)] * len(x))))
    if layer != "norm":  # after the final norm a token classifier's logit reads the class token alone: timm's map,
        assert maps[1].abs().sum() > 0  # and vitlab's, is zero there; before it, a map, not nothing compared
    assert_relative(maps[0], maps[1], 1e-4, f"grad-cam on {layer}")


def attention_hook_attributions(model: torch.nn.Module, x: torch.Tensor, layer: str) -> torch.Tensor:
    """Gradient × activation of the logit of class 3 at a layer's output, taken with plain hooks (what captum's
    and grad-cam's layer methods are made of)."""
    kept = {}

    def keep(module, args, out):
        out.retain_grad()
        kept["out"] = out

    hook = model.get_submodule(layer).register_forward_hook(keep)
    model(x)[:, 3].sum().backward()
    hook.remove()
    return kept["out"] * kept["out"].grad


@pytest.mark.parametrize("layer", ["patch_embed", "blocks.1", "blocks.1.attn", "norm"])
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_gradient_times_activation_through_hooks_equals_timms(name, kwargs, layer):
    ref, ours, x = attribution_pair(name, kwargs)
    got = attention_hook_attributions(ours, x, layer)
    expected = attention_hook_attributions(ref, x, layer)
    assert_relative(got, expected, 1e-4, layer)

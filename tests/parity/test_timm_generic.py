"""timm's generic model tests (its tests/test_models.py) on every vitlab model made by a timm name: each test body
runs first on `timm.create_model(name, ...)`, the control, then on `vitlab.create_model(name, ...)`; vitlab's model
must pass every body timm's own model passes (a body timm's model fails skips, saying so).

The bodies are timm's, rewritten: forward (+ gradient checkpointing gives the same output), backward (42 classes,
every parameter gets a gradient), default_cfgs and default_cfgs_non_std (head sizes, pre-logits, removing the head
and the pooling, the classifier and first conv named by the cfg exist), features_only, forward_intermediates (and
its feature getter), torch.fx forward and backward (timm's tracer settings, the traced output equal to eager),
TorchScript (vitlab refuses it in one line), and inference on timm's weights, here random ones saved as
safetensors instead of timm's downloaded test files.

Two sizes: the default run builds a name's architecture (patch, prefix tokens, pooling, norms, layer scale,
ResNet stages) at depth 3 (timm's ViT feature getter takes the last 3 blocks), width 64 and a 56 or 64 pixel input,
for one name of each kind these reduce to (REDUCED_NAMES); the `slow` run builds every name as timm registers it,
at its full depth, width and input size (timm's CI caps on input size are resource limits, not part of the
contract, and are not applied), and BiT's R50x1 (BIT_NAMES) besides."""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from dataclasses import dataclass, field

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import get_channel_dim, get_spatial_dim, set_scriptable
from timm.models import FeatureInfo, load_checkpoint, save_for_hf

import vitlab
from tests.parity.test_timm_contracts import NAMES, small
from tests.parity.test_timm_fx import fx_model
from tests.parity.test_timm_weights import match_timm_hybrid_numerics, randomize, rel_err
from vitlab.api import model_config_for, vitlab_overrides
from vitlab.constants import OFFICIAL_MEAN, OFFICIAL_STD
from vitlab.models.config import BiTConfig

warnings.filterwarnings("ignore", category=UserWarning)

# timm's test input targets (tests/test_models.py); every name here has a fixed input size, so they only apply
# to a model without one
TARGET_FWD_SIZE, TARGET_BWD_SIZE, TARGET_FFEAT_SIZE, TARGET_JIT_SIZE = 384, 128, 96, 128
TIMM_RTOL, TIMM_ATOL = 1e-3, 1e-4  # timm's test_model_inference tolerance
PARITY = 1e-5  # the project's float32 parity standard: relative L2 error


def reduced(name: str) -> dict:
    """The name's architecture at depth 3, width 64 (2 heads, the name's MLP ratio) and a small input."""
    cfg = model_config_for(name, {})
    return {"depth": 3, "embed_dim": 64, "num_heads": 2, "mlp_ratio": cfg.mlp_dim / cfg.width, **small(name)}


@dataclass
class Case:
    """One name at one size; models are built once per (library, keywords) and handed out as copies."""

    name: str
    full: bool
    kwargs: dict
    built: dict = field(default_factory=dict)

    def create(self, lib, **kwargs) -> torch.nn.Module:
        """`lib.create_model(name, ...)` with the case's keywords, its weights moved off their initial values:
        vitlab's zero-initialised head would make every logits comparison vacuous."""
        key = (lib.__name__, tuple(sorted(kwargs.items())))
        if key not in self.built:
            torch.manual_seed(0)
            model = lib.create_model(self.name, **self.kwargs, **kwargs)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.02)
            if self.full:  # big models are not kept
                return model
            self.built[key] = model
        return copy.deepcopy(self.built[key])

    def input_size(self, model: torch.nn.Module, target: int | None = None) -> tuple[int, int, int]:
        """timm's _get_input_size on the model's default_cfg, its fixed input size being the reduced one where
        the case reduced it (timm's default_cfg keeps the name's; vitlab's follows img_size)."""
        cfg = model.default_cfg
        size = tuple(cfg["input_size"])
        if "img_size" in self.kwargs:
            size = (size[0], self.kwargs["img_size"], self.kwargs["img_size"])
        if cfg.get("fixed_input_size"):
            return size
        if target and max(size) > target:
            return cfg.get("min_input_size") or tuple(min(s, target) for s in size)
        return size


def reduced_kind(name: str) -> tuple:
    """What a name's reduced model is (its vitlab config but the normalisation, the class count and the number
    of units in each ResNet stage; timm's first conv and classifier): names of one kind run the same code."""
    cfg = model_config_for(name, vitlab_overrides(reduced(name)))
    cfg = cfg.replace(name="", mean=OFFICIAL_MEAN, std=OFFICIAL_STD, num_classes=1)
    if cfg.resnet is not None:
        cfg = cfg.replace(resnet=dataclasses.replace(cfg.resnet, layers=tuple(1 for _ in cfg.resnet.layers)))
    pretrained = timm.models.get_pretrained_cfg(name)
    return cfg, pretrained.first_conv, pretrained.classifier


# The default run: the first name of each reduced kind (the ViT sizes of one patch size differ only in width,
# depth and head size, the hybrids of as many ResNet stages in the units per stage; the heads without classes are
# the DINOv2 names'); every name in the slow run.
KINDS: dict[tuple, list[str]] = {}
for _name in NAMES:
    KINDS.setdefault(reduced_kind(_name), []).append(_name)
REDUCED_NAMES = [names[0] for names in KINDS.values()]


# BiT in the slow run only, as timm registers it: timm's ResNetV2 takes no size keywords, and R50x1 at 224 runs every
# body in minutes on a CPU. One name: the BiT names differ only in units per stage and width.
BIT_NAMES = ["resnetv2_50x1_bit"]


@pytest.fixture(scope="module", params=[pytest.param((n, False), id=n) for n in REDUCED_NAMES]
                + [pytest.param((n, True), id=f"{n}-full", marks=pytest.mark.slow) for n in NAMES + BIT_NAMES])
def case(request) -> Case:
    """Module-scoped: pytest runs every body of one name in a row, and the name's models are dropped after."""
    name, full = request.param
    return Case(name, full, {} if full else reduced(name))


def randn(batch: int, size: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    return torch.randn((batch, *size), generator=torch.Generator().manual_seed(seed))


def control(body, case: Case) -> None:
    """timm's model runs the body first; vitlab's must pass it wherever timm's does."""
    try:
        body(timm, case)
    except Exception as e:  # noqa: BLE001 - any failure of timm's own model is the control failing
        pytest.skip(f"timm's own {case.name} fails {body.__name__}: {type(e).__name__}: {e}")
    body(vitlab, case)


def forward(lib, case: Case) -> None:
    model = case.create(lib).eval()
    x = randn(2, case.input_size(model, TARGET_FWD_SIZE))
    out, features = model(x), model.forward_features(x)
    assert out.shape[0] == 2
    assert not torch.isnan(out).any()
    model.set_grad_checkpointing()  # recomputing the blocks changes nothing in the output
    assert torch.allclose(model(x), out, rtol=1e-4, atol=1e-5)
    assert torch.allclose(model.forward_features(x), features, rtol=1e-4, atol=1e-5)


def backward(lib, case: Case) -> None:
    model = case.create(lib, num_classes=42).train()
    x = randn(2, case.input_size(model, TARGET_BWD_SIZE))
    out = model(x)
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert sum(p.grad.numel() for p in model.parameters()) == sum(p.numel() for p in model.parameters())
    assert out.shape[-1] == 42
    assert not torch.isnan(out).any()


def default_cfgs_non_std(lib, case: Case) -> None:
    model = case.create(lib).eval()
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    state, cfg = model.state_dict(), model.default_cfg
    x = randn(1, case.input_size(model))
    features = model.forward_features(x)
    pre = model.forward_head(features, pre_logits=True)
    assert features.shape[-1] == model.num_features  # tokens (N, T, D)
    assert pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)  # forward returns the pooled representation
    out = model(x)
    assert out.shape[-1] == model.head_hidden_size and out.shape == pre.shape
    out = case.create(lib, num_classes=0).eval()(x)
    assert out.shape[-1] == model.head_hidden_size
    if cfg.get("num_classes"):
        classifier = cfg["classifier"]
        for c in (classifier,) if isinstance(classifier, str) else classifier:
            assert c + ".weight" in state, f"{c} not in the state dict"
    first_conv = cfg["first_conv"]
    for c in (first_conv,) if isinstance(first_conv, str) else first_conv:
        assert c + ".weight" in state, f"{c} not in the state dict"


def default_cfgs(lib, case: Case) -> None:
    """timm's body for its CNNs, on tokens: without pooling and classifier, `forward` keeps every token."""
    model = case.create(lib).eval()
    x = randn(1, case.input_size(model))
    tokens = model.forward_features(x)
    model.reset_classifier(0, "")
    assert model(x).shape == tokens.shape
    assert case.create(lib, num_classes=0, global_pool="").eval()(x).shape == tokens.shape


def forward_features(lib, case: Case) -> None:
    model = case.create(lib, features_only=True).eval()
    channels = model.feature_info.channels()
    assert len(channels) >= 3  # timm's ViTs give their last 3 blocks (its >= 4 is for its CNNs)
    x = randn(1, case.input_size(model, TARGET_FFEAT_SIZE))
    out = model(x)
    assert len(out) == len(channels)
    for c, o in zip(channels, out, strict=True):
        assert o.shape[1] == c and o.shape[0] == 1
        assert not torch.isnan(o).any()


def check_feature_maps(maps, channels, reductions, x, output_fmt: str) -> None:
    """timm's checks on feature maps: one per feature_info entry, its channels, at most ceil(input / reduction)
    + 1 positions along each spatial axis, the batch, no NaN."""
    assert len(maps) == len(channels)
    feat_axis, (h_axis, w_axis) = get_channel_dim(output_fmt), get_spatial_dim(output_fmt)
    for c, r, o in zip(channels, reductions, maps, strict=True):
        assert o.shape[feat_axis] == c
        assert o.shape[h_axis] <= math.ceil(x.shape[2] / r) + 1
        assert o.shape[w_axis] <= math.ceil(x.shape[3] / r) + 1
        assert o.shape[0] == x.shape[0]
        assert not torch.isnan(o).any()


def forward_intermediates_features(lib, case: Case) -> None:
    model = case.create(lib, features_only=True, feature_cls="getter").eval()
    x = randn(1, case.input_size(model, TARGET_FFEAT_SIZE))
    fmt = getattr(model, "output_fmt", "NCHW")
    check_feature_maps(model(x), model.feature_info.channels(), model.feature_info.reduction(), x, fmt)


def forward_intermediates(lib, case: Case) -> None:
    model = case.create(lib).eval()
    info = FeatureInfo(model.feature_info, len(model.feature_info))
    assert len(info.channels()) >= 3
    x = randn(1, case.input_size(model, TARGET_FFEAT_SIZE))
    fmt = getattr(model, "output_fmt", "NCHW")
    out, maps = model.forward_intermediates(x, output_fmt=fmt)
    check_feature_maps(maps, info.channels(), info.reduction(), x, fmt)
    assert torch.allclose(out, model.forward_features(x))


def forward_fx(lib, case: Case) -> None:
    model = case.create(lib).eval()
    x = randn(1, case.input_size(model, TARGET_FWD_SIZE))
    with torch.no_grad():
        out = model(x)
        traced = torch.cat(tuple(fx_model(model)(x).values()))
    assert torch.all(traced == out)
    assert out.shape[0] == 1 and not torch.isnan(out).any()


def backward_fx(lib, case: Case) -> None:
    model = case.create(lib, num_classes=42).train()
    count = sum(p.numel() for p in model.parameters())
    traced = fx_model(model)
    out = torch.cat(tuple(traced(randn(2, case.input_size(model, TARGET_BWD_SIZE))).values()))
    out.mean().backward()
    missing = [n for n, p in traced.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert sum(p.grad.numel() for p in traced.parameters()) == count
    assert out.shape[-1] == 42 and not torch.isnan(out).any()


def forward_torchscript(lib, case: Case) -> None:
    with set_scriptable(True):
        model = lib.create_model(case.name, **case.kwargs).eval()
    out = torch.jit.script(model)(randn(1, case.input_size(model, TARGET_JIT_SIZE)))
    assert out.shape[0] == 1 and not torch.isnan(out).any()


def test_model_forward(case):
    control(forward, case)


def test_model_backward(case):
    control(backward, case)


def test_model_default_cfgs_non_std(case):
    control(default_cfgs_non_std, case)


def test_model_default_cfgs(case):
    control(default_cfgs, case)


def test_model_forward_features(case):
    control(forward_features, case)


def test_model_forward_intermediates_features(case):
    control(forward_intermediates_features, case)


def test_model_forward_intermediates(case):
    control(forward_intermediates, case)


def test_model_forward_fx(case):
    control(forward_fx, case)


def test_model_backward_fx(case):
    control(backward_fx, case)


def test_model_forward_torchscript(case):
    """timm's model scripts; vitlab's refuses in one line naming the alternatives."""
    try:
        forward_torchscript(timm, case)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"timm's own {case.name} fails forward_torchscript: {type(e).__name__}: {e}")
    with set_scriptable(True):
        model = case.create(vitlab).eval()
    with pytest.raises(RuntimeError) as refused:
        torch.jit.script(model)
    assert str(refused.value) == ("vitlab models are not TorchScript-scriptable; use torch.jit.trace(model, x), "
                                  "torch.export.export(model, (x,)) or vitlab's ONNX export instead")


def test_model_inference(case, tmp_path):
    """timm's model of the name with seeded random weights, saved as safetensors (a bare state dict at full size,
    read with arch=; timm's hub folder at the reduced size, whose config.json carries the reduced depth and width),
    read by vitlab.load(path, arch=name) and by timm's load_checkpoint into vitlab's model: the output, features
    and pre-logits are timm's within timm's tolerance, and within 1e-5 relative once timm's hybrid stem uses the
    official GroupNorm eps (the ResNet stem's weight standardisation differs from timm's in its eps only, made
    negligible by randomize's large stem weights: docs/coming-from-timm.md)."""
    ref = randomize(timm.create_model(case.name, pretrained=False, **case.kwargs))
    file = tmp_path / "model.safetensors"
    if case.full:
        save_file(ref.state_dict(), file)
        path = file
    else:
        save_for_hf(ref, tmp_path, model_args=case.kwargs, safe_serialization=True)
        path = tmp_path
    x = randn(2, case.input_size(ref))
    created = vitlab.create_model(case.name, **case.kwargs).eval()
    load_checkpoint(created, str(file))  # strict: every timm tensor name is taken
    models = {"load(arch=)": vitlab.load(path, arch=case.name), "load_checkpoint": created}

    def outputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            features = model.forward_features(x)
            return {"output": model(x), "features": features,
                    "pre_logits": model.forward_head(features, pre_logits=True)}

    theirs = outputs(ref)
    ours = {how: outputs(m) for how, m in models.items()}
    for how, got in ours.items():
        for k, t in theirs.items():
            assert torch.allclose(got[k], t, rtol=TIMM_RTOL, atol=TIMM_ATOL), f"{how}: {k}"
    if isinstance(created.config, BiTConfig):  # made by a timm name, it standardises with timm's eps: timm's outputs
        theirs = outputs(ref)
    else:
        theirs = outputs(match_timm_hybrid_numerics(ref))
    for how, got in ours.items():
        for k, t in theirs.items():
            assert rel_err(got[k], t) <= PARITY, f"{how}: {k}: {rel_err(got[k], t):.2e}"

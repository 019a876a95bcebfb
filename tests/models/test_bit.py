"""BiT ResNetV2 (models/bit.py) at the model level: parameter counts of every listed variant against timm's
resnetv2_*_bit and against a count written here from big_transfer's layer description, representation shapes at
any input size, and re-heading. Shape-only checks build the models on the meta device (no memory, no init)."""

from __future__ import annotations

import math

import pytest
import torch

import vitlab
from vitlab.models import BiT, BiTConfig, build_model, model_config, variant_names

timm = pytest.importorskip("timm")

# big_transfer's depths (bit_jax/models.py, bit_pytorch/models.py KNOWN_MODELS) and the ViT paper's R200 (Table 6).
UNITS = {"50": (3, 4, 6, 3), "101": (3, 4, 23, 3), "152": (3, 8, 36, 3), "200": (3, 24, 36, 3)}
BITS = [n for n in variant_names() if n.startswith("BiT-")]
# timm registers these six (resnetv2.py); R50x2, R152x1, R200x3 exist only in big_transfer and the paper.
TIMM_HAS = {"R50x1", "R50x3", "R101x1", "R101x3", "R152x2", "R152x4"}


def big_transfer_params(depth: str, wf: int, num_classes: int) -> int:
    """Count from the architecture as big_transfer describes it: root 7×7 conv (no bias, no norm); every unit
    GN(in) → 1×1 conv → GN → 3×3 conv → GN → 1×1 conv (4× wider), a 1×1 projection on each stage's first unit;
    final GN; a dense head with bias. GroupNorm has a scale and an offset per channel."""
    root = 64 * wf
    n, c_in = 3 * root * 7 * 7, root
    for stage, units in enumerate(UNITS[depth]):
        mid = root * 2**stage
        for u in range(units):
            n += 2 * c_in + c_in * mid + 2 * mid + 9 * mid * mid + 2 * mid + mid * 4 * mid
            n += c_in * 4 * mid if u == 0 else 0
            c_in = 4 * mid
    return n + 2 * c_in + c_in * num_classes + num_classes


def meta_params(build) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def test_every_listed_variant_is_listed():
    assert [n[len("BiT-") :] for n in BITS] == ["R50x1", "R50x2", "R50x3", "R101x1", "R101x3", "R152x1", "R152x2",
                                                "R152x4", "R200x3"]  # fmt: skip


@pytest.mark.parametrize("num_classes", [1000, 21843])
@pytest.mark.parametrize("name", BITS)
def test_parameter_counts(name: str, num_classes: int):
    depth, wf = name[len("BiT-R") :].split("x")
    ours = meta_params(lambda: build_model(model_config(name, num_classes=num_classes)))
    assert ours == big_transfer_params(depth, int(wf), num_classes)
    if name[len("BiT-") :] in TIMM_HAS:
        theirs = meta_params(lambda: timm.create_model(f"resnetv2_{depth}x{wf}_bit", num_classes=num_classes))
        assert ours == theirs


def test_bit_r50x1_count_as_published():
    # BiT-M R50x1 with the ImageNet head, as timm and big_transfer's released weights hold it
    assert meta_params(lambda: vitlab.create_model("BiT-R50x1")) == 25_549_352


@pytest.mark.parametrize("name", BITS)
def test_representation_width_at_any_input_size(name: str):
    """forward_features: (N, 2048·wf, ceil(H/32), ceil(W/32)); pre-logits: (N, 2048·wf); logits: (N, classes)."""
    wf = int(name.split("x")[-1])
    with torch.device("meta"):
        model = vitlab.create_model(name, num_classes=7)
        for h, w in [(224, 224), (33, 47)]:
            feats = model.forward_features(torch.empty(2, 3, h, w))
            assert feats.shape == (2, 2048 * wf, math.ceil(h / 32), math.ceil(w / 32))
            assert model.forward_head(feats, pre_logits=True).shape == (2, 2048 * wf)
            assert model.forward_head(feats).shape == (2, 7)


def randomized(cfg: BiTConfig, seed: int = 0) -> BiT:
    """Random weights everywhere: fresh GroupNorms are the identity and the head is zero."""
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if p.ndim == 1 and "norm" in name else 0.1 * noise if p.ndim == 1 else noise)
    return model


def timm_bit(layers: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """timm's BiT (resnetv2.py _create_resnetv2_bit) with another depth: timm registers only six."""
    from functools import partial

    from timm.layers import StdConv2d
    from timm.models.resnetv2 import ResNetV2

    conv = partial(StdConv2d, eps=1e-8)
    return ResNetV2(layers=list(layers), num_classes=num_classes, stem_type="fixed", conv_layer=conv).eval()


@pytest.mark.parametrize("size", [(64, 48), (33, 47), (17, 90)], ids=["64x48", "33x47", "17x90"])
def test_real_forward_on_odd_and_non_square_inputs(size):
    """A real forward (not shapes only) agrees with timm's BiT of the same small topology, weights copied."""
    from vitlab.weights.timm_bit import to_timm_bit_state_dict

    cfg = BiTConfig(layers=(1, 1, 1, 1), num_classes=5, ws_eps=1e-8)
    ours = randomized(cfg)
    ref = timm_bit((1, 1, 1, 1), num_classes=5)
    ref.load_state_dict(to_timm_bit_state_dict(ours))
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        a, b = ours(x), ref(x)
        assert ours.forward_head(ours.forward_features(x), pre_logits=True).shape == (2, 2048)
    assert ((a - b).norm() / b.norm()).item() <= 1e-5


def test_new_head_is_zero(tmp_path):
    model = randomized(BiTConfig(layers=(1, 1), num_classes=4, image_size=32))
    vitlab.save(model, tmp_path / "m.safetensors")
    other = vitlab.load(tmp_path / "m.safetensors", num_classes=9, image_size=(40, 24))
    assert other.config.num_classes == 9 and other.config.image_size == (40, 24)  # a CNN: the size is a record
    assert other.head.weight.shape == (9, 512) and not other.head.weight.any() and not other.head.bias.any()
    body = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in body.items())
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        assert not other(x).any()
        assert torch.equal(other.forward_head(other.forward_features(x), pre_logits=True),
                           model.forward_head(model.forward_features(x), pre_logits=True))  # fmt: skip
    model.reset_classifier(3)
    assert model.config.num_classes == 3 and not model.head.weight.any() and model.head.weight.shape == (3, 512)


def fresh_logits(model: BiT, x: torch.Tensor) -> torch.Tensor:
    """Logits of a new model holding a copy of `model`'s weights: nothing cached."""
    other = build_model(model.config).to(next(model.parameters()).dtype).eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        return other(x)


def test_eval_cache_follows_weight_changes():
    """Eval forwards without autograd reuse the standardised kernels; every way a weight changes invalidates them:
    in place (an optimizer step, a no_grad edit), load_state_dict, a cast; and autograd forwards never use them."""
    model = randomized(BiTConfig(layers=(1, 1), num_classes=3, image_size=32))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        first = model(x)
        assert torch.equal(model(x), first)  # served from the cache: exactly the same
        model.stages[0][0].conv3.weight.mul_(-1)  # in place
        assert torch.equal(model(x), fresh_logits(model, x)) and not torch.allclose(model(x), first)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()  # grad enabled: computed afresh, and the step changes every kernel in place
    opt.step()
    with torch.no_grad():
        assert torch.equal(model(x), fresh_logits(model, x))
        model.load_state_dict(randomized(model.config, seed=3).state_dict())
        assert torch.equal(model(x), fresh_logits(model, x))
        model.double()
        assert model(x.double()).dtype == torch.float64
        assert torch.equal(model(x.double()), fresh_logits(model, x.double()))
    model.train()
    assert all(m._standardized is None for m in model.modules() if hasattr(m, "_standardized"))

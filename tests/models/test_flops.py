"""Analytic multiply-add counts: the paper's figures (ViT paper, analytic counts) and torch's own flop counter."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import vitlab
from vitlab.models import BiTConfig, ResNetConfig, ViTConfig, build_model
from vitlab.models.flops import count_macs

# Multiply-adds per 224 image (and B/16 at 384), in G.
PAPER_GMACS = [
    ("ViT-Ti/16", 224, 1.26),
    ("ViT-S/16", 224, 4.61),
    ("ViT-B/16", 224, 17.58),
    ("ViT-B/32", 224, 4.41),
    ("ViT-L/16", 224, 61.6),
    ("ViT-H/14", 224, 167.4),
    ("ViT-B/16", 384, 55.5),
]


@pytest.mark.parametrize("name,size,gmacs", PAPER_GMACS)
def test_matches_paper(name: str, size: int, gmacs: float) -> None:
    assert count_macs(name, size).total / 1e9 == pytest.approx(gmacs, rel=0.01)


def test_every_listed_model_counts() -> None:
    for name in vitlab.list_models():
        c = count_macs(name)
        assert c.total > 0 and c.first_layer > 0
        assert c.training == 3 * c.total - c.first_layer


def test_class_token_last_block_saves_only_for_token_classifier() -> None:
    full, fast = count_macs("ViT-B/16"), count_macs("ViT-B/16", class_token_last_block=True)
    assert fast.total < full.total
    assert fast.patch_embed == full.patch_embed and fast.head == full.head
    gap = "ViT-B/16-gap"
    assert count_macs(gap, class_token_last_block=True) == count_macs(gap)


def _counted_macs(model: torch.nn.Module, x: torch.Tensor, fn: str = "forward", backward: bool = False) -> int:
    """torch's flop counter (2 per multiply-add) on a real pass; the math attention backend is used because
    the fused CPU kernel has no registered flop formula."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = getattr(model, fn)(x)
        if backward:
            out.float().pow(2).mean().backward()
    return counter.get_total_flops() // 2


TINY_VIT = ViTConfig(image_size=32, patch_size=8, width=64, depth=2, mlp_dim=128, num_heads=2, num_classes=10)
TINY_CONFIGS = {
    "vit": TINY_VIT,
    "vit-rel-rep": TINY_VIT.replace(pos_embed="relative", representation_size=48),
    "vit-gap": TINY_VIT.replace(classifier="gap"),
    "hybrid": TINY_VIT.replace(image_size=64, patch_size=1, resnet=ResNetConfig(layers=(1, 1, 1))),
    "hybrid-root": TINY_VIT.replace(image_size=64, patch_size=2, resnet=ResNetConfig(layers=())),
    "bit": BiTConfig(layers=(1, 2, 1, 1), image_size=64, num_classes=10),
}


@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_agrees_with_flop_counter(key: str) -> None:
    cfg = TINY_CONFIGS[key]
    model = build_model(cfg)
    x = torch.randn(1, 3, *cfg.image_size)
    expected = count_macs(cfg)
    with torch.no_grad():
        assert _counted_macs(model, x) == expected.total
    assert _counted_macs(model, x, backward=True) == expected.training


@pytest.mark.parametrize("key", [k for k, c in TINY_CONFIGS.items() if isinstance(c, ViTConfig)])
def test_class_token_last_block_counts_forward_unobserved(key: str) -> None:
    cfg = TINY_CONFIGS[key]
    model = build_model(cfg)
    x = torch.randn(1, 3, *cfg.image_size)
    with torch.no_grad():
        assert _counted_macs(model, x, fn="forward_unobserved") == count_macs(cfg, class_token_last_block=True).total


def test_full_count_is_forward_features_plus_head() -> None:
    model = build_model(TINY_VIT)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features = _counted_macs(model, x, fn="forward_features") // 2
    c = count_macs(TINY_VIT)
    assert features == c.total - c.head


def test_other_image_size() -> None:
    cfg = TINY_VIT
    model = build_model(cfg)
    model.dynamic_img_size = True
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        assert _counted_macs(model, x) == count_macs(cfg, (48, 64)).total
        fast = count_macs(cfg, (48, 64), class_token_last_block=True).total
        assert _counted_macs(model, x, fn="forward_unobserved") == fast


def test_real_vit_s16_forward() -> None:
    """One full-size cross-check: ViT-S/16 at 224 as executed by vitlab's inference session."""
    model = vitlab.create_model("ViT-S/16").eval()
    with torch.no_grad():
        counted = _counted_macs(model, torch.randn(1, 3, 224, 224), fn="forward_unobserved")
    assert counted == count_macs("ViT-S/16", class_token_last_block=True).total

"""Hybrid stems with a non-integer width factor, as the official code allows (vit_jax models_vit.py builds
int(64·width_factor) root channels and stage widths int(64·wf)·2^i): such .npz files load, with the width factor
read from conv_root/kernel, and compute what timm's independent hybrid (ResNetV2 with `width_factor`) computes."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

import vitlab
from vitlab.errors import WeightsError
from vitlab.models import ResNetConfig, VisionTransformer, ViTConfig
from vitlab.models.resnet import StdConv2dSame
from vitlab.weights.jax_npz import write_jax_npz


def randomized(model: nn.Module) -> nn.Module:
    """Random weights at scales that keep activations O(1). Standardised convs get std 1000, so that the two
    implementations' standardisation epsilons (official 1e-5 on the std, timm 1e-8 on the variance) do not
    matter: standardisation is scale-invariant."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                r = torch.randn(p.shape, generator=g)
                if isinstance(module, StdConv2dSame):
                    p.copy_(1000 * r)
                elif isinstance(module, nn.Linear | nn.Conv2d) and name == "weight":
                    p.copy_(r / math.sqrt(p[0].numel()))
                elif isinstance(module, nn.LayerNorm | nn.GroupNorm) and name == "weight":
                    p.copy_(1 + 0.2 * r)
                else:
                    p.copy_(0.2 * r)
    return model.eval()


def timm_hybrid(cfg: ViTConfig) -> nn.Module:
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import ResNetV2
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    from timm.models.vision_transformer_hybrid import HybridEmbed

    backbone = ResNetV2(layers=cfg.resnet.layers, num_classes=0, global_pool="", preact=False, stem_type="same",
                        conv_layer=partial(StdConv2dSame, eps=1e-8), width_factor=cfg.resnet.width_factor)
    ref = TimmViT(img_size=cfg.image_size, patch_size=cfg.patch_size, embed_dim=cfg.width, depth=cfg.depth,
                  num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.width, num_classes=cfg.num_classes,
                  act_layer=partial(nn.GELU, approximate="tanh"), embed_layer=partial(HybridEmbed, backbone=backbone))
    for m in ref.modules():
        if isinstance(m, nn.GroupNorm):
            m.eps = 1e-6  # the official GroupNorm epsilon (timm: 1e-5)
    return ref.eval()


@pytest.mark.parametrize("width_factor", [0.5, 1.5])
def test_float_width_factor_npz_loads_and_matches_timm(tmp_path, width_factor):
    torch.set_num_threads(1)
    cfg = ViTConfig(image_size=32, patch_size=1, width=64, depth=1, mlp_dim=128, num_heads=4, num_classes=10,
                    gelu="tanh", resnet=ResNetConfig(layers=(1, 1), width_factor=width_factor))
    model = randomized(VisionTransformer(cfg))
    path = tmp_path / "hybrid.npz"
    write_jax_npz(model, path)
    with np.load(path) as f:
        assert f["conv_root/kernel"].shape == (7, 7, 3, int(64 * width_factor))  # 32 or 96 channels
        assert f["block2/unit1/conv1/kernel"].shape[-1] == 2 * int(64 * width_factor)
    loaded = vitlab.load(path).eval()
    assert loaded.config.resnet.width_factor == width_factor and isinstance(loaded.config.resnet.width_factor, float)
    ref = timm_hybrid(cfg)
    from timm.models.vision_transformer import _load_weights

    with torch.no_grad():
        _load_weights(ref, str(path))
        x = torch.randn(2, 3, 32, 32)
        ours, theirs = loaded(x), ref(x)
    assert float((ours - theirs).norm() / theirs.norm()) <= 1e-5


def test_root_width_must_split_into_the_group_norm_groups(tmp_path):
    """40 root channels (wf 0.625) cannot be built: GroupNorm(32) needs a multiple of 32, in Flax as in torch."""
    cfg = ViTConfig(image_size=32, patch_size=1, width=64, depth=1, mlp_dim=128, num_heads=4, num_classes=10,
                    gelu="tanh", resnet=ResNetConfig(layers=(1, 1), width_factor=0.5))
    write_jax_npz(VisionTransformer(cfg), tmp_path / "ok.npz")
    with np.load(tmp_path / "ok.npz") as f:
        arrays = {k: f[k] for k in f.files}
    arrays["conv_root/kernel"] = np.zeros((7, 7, 3, 40), np.float32)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(WeightsError, match="40 output channels, not a positive multiple of the 32 GroupNorm"):
        vitlab.load(tmp_path / "bad.npz")

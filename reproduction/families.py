"""The three model families at three sizes, matched in size and compute.

Everything is at 32×32 px on a 2-core CPU. The families are chosen so that at size M the ViT, the BiT ResNetV2
and the hybrid have parameter counts and multiply-adds within 1.15× of each other by vitlab's own counters
(`model_table`, reported with every result): ViT/4 (8×8 patches of 4 px), a one-stage BiT ResNetV2 (root + 3
units, 8×8 feature map), and the paper's root-only hybrid ("R+ViT-Ti/16": the ResNet root, then 1×1 patches of
its 8×8 map).
"""

from __future__ import annotations

from typing import Any

from reproduction.scale import Scale
from vitlab.models import ViTConfig, build_model, count_macs, describe_architecture, model_config

FAMILIES = ("ViT", "BiT", "hybrid")
SIZES = ("S", "M", "L")


def _vit(depth: int, width: int, heads: int) -> tuple[str, dict[str, Any]]:
    return "ViT-Ti/4", {"depth": depth, "width": width, "num_heads": heads, "mlp_dim": 2 * width}


def _hybrid(depth: int, width: int, heads: int) -> tuple[str, dict[str, Any]]:
    # the paper's R+ViT-Ti/16 design (ResNet root only, stride 4) with 1×1 patches of its 8×8 map at 32 px
    name, args = _vit(depth, width, heads)
    return "R+ViT-Ti/16", {**args, "patch_size": 1, "resnet": {"layers": [], "width_factor": 0.5}}


MODELS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("ViT", "S"): _vit(4, 48, 2), ("ViT", "M"): _vit(6, 64, 2), ("ViT", "L"): _vit(8, 96, 3),
    ("BiT", "S"): ("BiT-R50x1", {"layers": [1], "width_factor": 1}),
    ("BiT", "M"): ("BiT-R50x1", {"layers": [3], "width_factor": 1}),
    ("BiT", "L"): ("BiT-R50x1", {"layers": [2], "width_factor": 2}),
    ("hybrid", "S"): _hybrid(4, 48, 2), ("hybrid", "M"): _hybrid(6, 64, 2), ("hybrid", "L"): _hybrid(8, 96, 3),
}


def model_settings(family: str, size: str, **overrides: Any) -> dict[str, Any]:
    name, args = MODELS[(family, size)]
    return {"model": name, "model_args": {**args, **overrides}}


def model_table(scale: Scale, num_classes: int) -> list[dict[str, Any]]:
    """Parameters and multiply-adds (vitlab.models.flops, per image) of every family and size at the scale's input size,
    as pre-trained (ViTs with their `pre_logits` layer)."""
    rows = []
    for (family, size), (name, args) in MODELS.items():
        config = model_config(name, num_classes=num_classes, image_size=scale.image_size, **args)
        if isinstance(config, ViTConfig):
            config = config.replace(representation_size=config.width)
        params = sum(p.numel() for p in build_model(config).parameters())
        macs = count_macs(config)
        rows.append({"family": family, "size": size, "architecture": describe_architecture(config),
                     "params": params, "macs": macs.total, "train_macs": macs.training})
    return rows

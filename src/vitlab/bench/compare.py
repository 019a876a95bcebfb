"""timm's model of the same architecture as a vitlab name, for `vitlab bench --compare timm`."""

from __future__ import annotations

from typing import Any

from torch import nn

# vitlab name -> timm name of the same architecture (BiT: timm's is the pre-activation ResNetV2).
TIMM_NAMES = {
    "ViT-Ti/16": "vit_tiny_patch16_224",
    "ViT-S/16": "vit_small_patch16_224",
    "ViT-S/32": "vit_small_patch32_224",
    "ViT-B/8": "vit_base_patch8_224",
    "ViT-B/16": "vit_base_patch16_224",
    "ViT-B/32": "vit_base_patch32_224",
    "ViT-L/16": "vit_large_patch16_224",
    "ViT-L/32": "vit_large_patch32_224",
    "ViT-H/14": "vit_huge_patch14_224",
    "R+ViT-Ti/16": "vit_tiny_r_s16_p8_224",
    "R26+ViT-S/32": "vit_small_r26_s32_224",
    "R26+ViT-B/32": "vit_base_r26_s32_224",
    "R50+ViT-B/16": "vit_base_r50_s16_224",
    "R50+ViT-L/32": "vit_large_r50_s32_224",
    **{f"BiT-{b}": f"resnetv2_{b[1:].lower()}_bit" for b in ("R50x1", "R50x3", "R101x1", "R101x3", "R152x2",
                                                             "R152x4")},
}


def timm_equivalent(name: str, num_classes: int = 1000, image_size: int = 224) -> tuple[str, nn.Module]:
    """timm's model of the same architecture as vitlab's `name` (its "-gap" variants: no class token, mean
    pooling after the final norm)."""
    try:
        import timm
    except ImportError as err:
        raise ValueError("--compare timm needs timm: pip install timm") from err
    base, gap = (name[: -len("-gap")], True) if name.endswith("-gap") else (name, False)
    if base not in TIMM_NAMES:
        raise ValueError(f"no timm equivalent known for {name!r}; known: {', '.join(TIMM_NAMES)}")
    kwargs: dict[str, Any] = {"num_classes": num_classes}
    if not base.startswith("BiT-"):
        kwargs["img_size"] = image_size
    if gap:
        kwargs.update(class_token=False, global_pool="avg", fc_norm=False)
    return TIMM_NAMES[base], timm.create_model(TIMM_NAMES[base], pretrained=False, **kwargs)

"""timm's names for a ViT's and a BiT's tensors and vitlab's, both ways: the one map that the timm readers and
writers (vitlab.weights.timm, vitlab.weights.timm_bit) and a model's own `load_state_dict` of a timm state dict
(timm's `load_checkpoint`) use. Pure string rules, no I/O: a bottom module of the models package."""

from __future__ import annotations

import re

from vitlab.models.config import ViTConfig


def rename_key(key: str, rules: list[tuple[str, str]]) -> str:
    """`key` renamed by the first of `rules` (regex, replacement) that matches it; unchanged if none does."""
    for pattern, repl in rules:
        new, n = re.subn(pattern, repl, key)
        if n:
            return new
    return key


# timm -> vitlab key renames, first match wins; keys matching none are the same in both.
_TO_VITLAB = [
    (r"^patch_embed\.backbone\.(?:stem\.)?(conv|norm)\.", r"stem.\1."),  # root-only stems lack "stem."
    (r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.conv\.", r"stem.stages.\1.\2.downsample.0."),
    (r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.norm\.", r"stem.stages.\1.\2.downsample.1."),
    (r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", r"stem.stages.\1.\2."),
    (r"^pre_logits\.fc\.", "pre_logits.0."),  # timm < 0.6 kept the in21k representation layer
]
_TO_TIMM = [
    (r"^stem\.stages\.(\d+)\.(\d+)\.downsample\.0\.", r"patch_embed.backbone.stages.\1.blocks.\2.downsample.conv."),
    (r"^stem\.stages\.(\d+)\.(\d+)\.downsample\.1\.", r"patch_embed.backbone.stages.\1.blocks.\2.downsample.norm."),
    (r"^stem\.stages\.(\d+)\.(\d+)\.", r"patch_embed.backbone.stages.\1.blocks.\2."),
    (r"^pre_logits\.0\.", "pre_logits.fc."),
]


def vitlab_key(key: str) -> str:
    """timm's name for a tensor -> vitlab's."""
    return rename_key(key, _TO_VITLAB)


def timm_key(key: str, config: ViTConfig) -> str:
    """vitlab's name for a tensor -> timm's. timm's root-only stem (layers=()) is the stem Sequential itself."""
    if key.startswith(("stem.conv.", "stem.norm.")):
        root = "patch_embed.backbone." if config.resnet and not config.resnet.layers else "patch_embed.backbone.stem."
        return root + key[len("stem.") :]
    return rename_key(key, _TO_TIMM)


# BiT (timm's resnetv2_*_bit): keys matching none are the same in both (stem.conv, norm1…conv3, norm). timm's head
# is a 1×1 convolution, vitlab's the Linear it equals: the names map here, the (C, D, 1, 1) <-> (C, D) shape where
# the tensors are (the timm BiT reader and writer, BiT's load_state_dict).
_BIT_TO_TIMM = [
    (r"^stages\.(\d+)\.(\d+)\.downsample\.", r"stages.\1.blocks.\2.downsample.conv."),
    (r"^stages\.(\d+)\.(\d+)\.", r"stages.\1.blocks.\2."),
    (r"^head\.", "head.fc."),
]
_BIT_TO_VITLAB = [
    (r"^stages\.(\d+)\.blocks\.(\d+)\.downsample\.conv\.", r"stages.\1.\2.downsample."),
    (r"^stages\.(\d+)\.blocks\.(\d+)\.", r"stages.\1.\2."),
    (r"^head\.fc\.", "head."),
]


def bit_vitlab_key(key: str) -> str:
    """timm's name for a BiT tensor -> vitlab's."""
    return rename_key(key, _BIT_TO_VITLAB)


def bit_timm_key(key: str) -> str:
    """vitlab's name for a BiT tensor -> timm's."""
    return rename_key(key, _BIT_TO_TIMM)

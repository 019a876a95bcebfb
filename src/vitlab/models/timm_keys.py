"""timm's names for a ViT's tensors and vitlab's, both ways: the one map that the timm reader and writer
(vitlab.weights.timm) and a model's own `load_state_dict` of a timm state dict (timm's `load_checkpoint`) use.
Pure string rules, no I/O: a bottom module of the models package."""

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

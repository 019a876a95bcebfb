"""Layer-wise learning-rate decay (`--layer-decay`), grouped as timm's `param_groups_layer_decay` groups a ViT
(after BEiT; MAE and DINOv2 fine-tune with it): the layers near the input, which learnt general features, move least.

Layer ids over a ViT of depth L (timm 1.0's `VisionTransformer.group_matcher`, num_layers = L + 2):

    0        the embeddings: patch embedding (and a hybrid's ResNet stem), class and register tokens, position
             embedding
    i + 1    everything in block i (its relative position table included); the final norm goes with the last
             block (timm's MATCH_PREV_GROUP)
    L + 1    what follows: fc_norm, pre_logits and the head

and a parameter of layer l trains at lr · decay^(L + 1 − l): the head at the base lr, the last block (and the
final norm) at lr · decay, the embeddings at lr · decay^(L + 1). BEiT's and MAE's own code differ from timm only in
the final norm, which they train at the head's lr; vitlab follows timm, the reference its test compares with.

The weight-decay split stays vitlab's (kernels only: vitlab.train.optim.param_groups); each of its groups is cut
by layer, so every optimizer group has one lr and one weight decay.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

_EMBEDDINGS = ("cls_token", "reg_token", "pos_embed", "patch_embed.", "stem.", "norm_pre.")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def _depth(model: nn.Module) -> int:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        name = getattr(getattr(model, "config", None), "name", None) or type(model).__name__
        raise ValueError(f"--layer-decay groups a ViT's blocks, and {name} has none (a CNN); leave it unset")
    return len(blocks)


def layer_id(name: str, depth: int) -> int:
    """The layer of parameter `name` (a vitlab ViT's state-dict name; LoRA's adapter names included)."""
    block = _BLOCK.match(name)
    if block:
        return int(block.group(1)) + 1
    if name.startswith(_EMBEDDINGS):
        return 0
    if name.startswith("norm."):
        return depth  # the final norm, with the last block
    return depth + 1


def layer_scales(model: nn.Module, decay: float) -> dict[str, float]:
    """The lr factor of every trained parameter, by name: decay^(num_layers − layer id)."""
    depth = _depth(model)
    return {name: decay ** (depth + 1 - layer_id(name, depth))
            for name, p in model.named_parameters() if p.requires_grad}


def layer_decay_groups(model: nn.Module, groups: list[dict[str, Any]], lr: float, decay: float) -> list[dict[str, Any]]:
    """`groups` (the weight-decay groups) cut by layer: one group per (layer, weight decay) with its own "lr"
    (lr · scale, which LambdaLR then schedules) and, as timm's groups, its "lr_scale". Ordered from the head
    down, so that the first group (what the training log reports as lr) trains at the base lr."""
    depth = _depth(model)
    names = {id(p): name for name, p in model.named_parameters()}
    cut: dict[tuple[int, int], dict[str, Any]] = {}
    for g, group in enumerate(groups):
        for p in group["params"]:
            layer = layer_id(names[id(p)], depth)
            scale = decay ** (depth + 1 - layer)
            entry = cut.setdefault((layer, g), {**{k: v for k, v in group.items() if k != "params"},
                                                "params": [], "lr": lr * scale, "lr_scale": scale})
            entry["params"].append(p)
    return [cut[key] for key in sorted(cut, key=lambda k: (-k[0], k[1]))]


def describe(model: nn.Module, decay: float) -> str:
    """The banner's line."""
    depth = _depth(model)
    return (f"lr      layer decay {decay:g} over {depth + 2} layers (embeddings, {depth} blocks, head): head × 1, last "
            f"block × {decay:.3g}, embeddings × {decay ** (depth + 1):.3g} (timm param_groups_layer_decay)")

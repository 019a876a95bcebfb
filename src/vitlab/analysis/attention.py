"""Attention maps, attention rollout and mean attention distance (paper Section 4.5, Appendix D.7;
Abnar & Zuidema 2020).

The math lives in functions over attention tensors (`rollout_from_attention`,
`attention_distance_from_attention`, `class_token_attention_from_attention`) so that hand-made attention can be
fed to them in tests; the model-level functions only run the model and call them.

Shapes: L layers, N images, H heads, T tokens (P prefix + G grid), G = gh * gw patches in raster order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from vitlab.models.vit import VisionTransformer

HEAD_FUSIONS = ("mean", "max", "min")


def require_vit(model: nn.Module) -> VisionTransformer:
    """The analyses need attention and patch tokens: a ViT or hybrid, not a BiT ResNet."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"analysis needs a Vision Transformer (ViT or hybrid), not {type(model).__name__}")
    return model


@contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no gradients for the duration; the caller's training flag is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _on_model(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    p = next(model.parameters())
    return x.to(device=p.device, dtype=p.dtype)


def run_attention(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """(L, N, H, T, T) softmax weights of every layer (explicit path) and the patch grid (gh, gw)."""
    vit = require_vit(model)
    with inference(vit):
        out = vit.forward_inspect(_on_model(vit, x), attention=True)
    return torch.stack(out["attention"]).float(), tuple(out["grid"])


def attention_maps(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(L, N, H, T, T): every layer's attention weights for images x (N, C, H, W), normalised as the weights
    expect. Rows are queries, columns keys; each row sums to 1."""
    return run_attention(model, x)[0]


# --- rollout (Abnar & Zuidema 2020) -----------------------------------------------------------------------------
def fuse_heads(attn: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """(N, H, T, T) -> (N, T, T) by mean, max or min over heads."""
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    if head_fusion == "min":
        return attn.amin(dim=1)
    raise ValueError(f"head_fusion must be one of {', '.join(HEAD_FUSIONS)}, not {head_fusion!r}")


def discard_lowest(fused: torch.Tensor, ratio: float, num_prefix: int) -> torch.Tensor:
    """Zero the `ratio` lowest weights of each (T, T) matrix, as the public rollout implementations do to
    denoise the map. Weights given to the class token (its key column) are never dropped: that is where most
    of the attention mass goes, and dropping it would move that mass onto patches at renormalisation."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), not {ratio}")
    n, t, _ = fused.shape
    if ratio == 0.0:
        return fused
    candidates = fused.clone()
    candidates[:, :, :num_prefix] = float("inf")  # protected: never among the lowest
    count = int(t * (t - num_prefix) * ratio)
    lowest = candidates.reshape(n, -1).topk(count, dim=-1, largest=False).indices  # (N, count)
    out = fused.reshape(n, -1).clone()
    out.scatter_(1, lowest, 0.0)
    return out.reshape(n, t, t)


def rollout_from_attention(
    attn: Sequence[torch.Tensor] | torch.Tensor,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    num_prefix: int = 1,
) -> torch.Tensor:
    """Attention rollout over layers (L × (N, H, T, T)) -> (N, T, T): how much each output token draws on
    each input token. Per layer: fuse heads, drop the lowest weights, add the identity for the residual
    connection, renormalise rows; then multiply through the layers, later layers on the left."""
    result = None
    for layer_attn in attn:
        a = discard_lowest(fuse_heads(layer_attn.float(), head_fusion), discard_ratio, num_prefix)  # (N, T, T)
        a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    if result is None:
        raise ValueError("no attention layers given")
    return result


def pooled_row(matrix: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """(N, T, T) -> (N, T): the class token's row, or for GAP models (no prefix) the mean over all tokens,
    since the classifier reads their mean."""
    return matrix[:, 0] if num_prefix else matrix.mean(dim=1)


def attention_rollout(
    model: nn.Module, x: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0
) -> torch.Tensor:
    """(N, gh, gw): rollout map of the class token (GAP models: mean over tokens) on the patch grid."""
    attn, (gh, gw) = run_attention(model, x)
    prefix = model.config.num_prefix_tokens
    rolled = rollout_from_attention(attn, head_fusion, discard_ratio, prefix)  # (N, T, T)
    return pooled_row(rolled, prefix)[:, prefix:].reshape(-1, gh, gw)


def class_token_attention_from_attention(attn: torch.Tensor, grid: tuple[int, int], num_prefix: int) -> torch.Tensor:
    """One layer's (N, H, T, T) -> (N, H, gh, gw): each head's attention from the class token (GAP models:
    averaged over all queries) to the patches."""
    n, h = attn.shape[:2]
    rows = attn[:, :, 0] if num_prefix else attn.mean(dim=2)  # (N, H, T)
    return rows[:, :, num_prefix:].reshape(n, h, *grid)


def class_token_attention(model: nn.Module, x: torch.Tensor, layer: int = -1) -> torch.Tensor:
    """(N, H, gh, gw): per-head class-token attention of one layer (the last by default)."""
    attn, grid = run_attention(model, x)
    return class_token_attention_from_attention(attn[layer], grid, model.config.num_prefix_tokens)


# --- mean attention distance --------------------------------------------------------------------------------
def grid_distances(grid: tuple[int, int], patch_px: float) -> torch.Tensor:
    """(G, G): Euclidean distance in input pixels between patch centres, raster order (row-major)."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()], dim=1).double()  # (G, 2)
    return torch.cdist(coords, coords) * patch_px


def attention_distance_from_attention(
    attn: torch.Tensor, grid: tuple[int, int], patch_px: float, num_prefix: int
) -> torch.Tensor:
    """One layer's (N, H, T, T) -> (H,) mean attention distance in pixels. Class-token rows and columns are
    dropped and each query's weights renormalised over the patch keys, so the distance describes how far a
    patch looks among patches whatever share goes to the class token; then averaged over queries and images."""
    a = attn[:, :, num_prefix:, num_prefix:].double()  # (N, H, G, G)
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    dist = grid_distances(grid, patch_px).to(a.device)  # (G, G)
    per_query = (a * dist).sum(dim=-1)  # (N, H, G)
    return per_query.mean(dim=(0, 2)).float()


def mean_attention_distance(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(L, H): mean attention distance in input pixels per layer and head (paper Fig. 7 right). The effective
    patch size `config.total_stride` includes a hybrid stem's downsampling."""
    attn, grid = run_attention(model, x)
    cfg = model.config
    return torch.stack(
        [attention_distance_from_attention(a, grid, cfg.total_stride, cfg.num_prefix_tokens) for a in attn]
    )

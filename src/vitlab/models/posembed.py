"""Position-embedding resampling with the official semantics (paper Section 3.2;
official vit_jax checkpoint.py uses scipy.ndimage.zoom(order=1)).

The official `load_pretrained` resizes the grid part with `scipy.ndimage.zoom(order=1)`: bilinear interpolation
whose corner samples stay on the corners, i.e. `F.interpolate(..., mode="bilinear", align_corners=True)`.
Prefix (class-token) entries are kept as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resample_pos_embed(
    posemb: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """(1, prefix + old_h*old_w, D) -> (1, prefix + new_h*new_w, D), grid resized bilinearly, corners aligned."""
    if tuple(new_grid) == tuple(old_grid):
        return posemb
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    if grid.shape[1] != old_grid[0] * old_grid[1]:
        raise ValueError(f"position embedding has {grid.shape[1]} grid entries, expected {old_grid[0]}x{old_grid[1]}")
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    grid = F.interpolate(grid.float(), size=tuple(new_grid), mode="bilinear", align_corners=True).to(posemb.dtype)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim)  # (1, gh*gw, D)
    return torch.cat([prefix, grid], dim=1)


def resample_1d(table: torch.Tensor, new_len: int) -> torch.Tensor:
    """(1, L, C) -> (1, new_len, C) by linear interpolation with the end samples aligned."""
    if table.shape[1] == new_len:
        return table
    t = table.transpose(1, 2).float()  # (1, C, L)
    t = F.interpolate(t, size=new_len, mode="linear", align_corners=True)
    return t.transpose(1, 2).to(table.dtype)


def resample_relative_table(table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(H, 2T0-1, hd) offset table -> (H, 2T-1, hd) for T tokens, the offset axis stretched with ends aligned.
    1-D offsets in raster order have no exact meaning at another grid width; stretching keeps the learned
    profile from the nearest to the farthest offset, the same choice as for 1-D tables elsewhere."""
    h, length, hd = table.shape
    if length == 2 * num_tokens - 1:
        return table
    flat = table.permute(1, 0, 2).reshape(1, length, h * hd)  # (1, 2T0-1, H*hd)
    return resample_1d(flat, 2 * num_tokens - 1).reshape(2 * num_tokens - 1, h, hd).permute(1, 0, 2)


def relative_position_index(num_query: int, num_key: int, query_offset: int, device: torch.device) -> torch.Tensor:
    """Index into a (2*num_key - 1) offset table for each (query, key) pair: i - j + num_key - 1."""
    qi = torch.arange(query_offset, query_offset + num_query, device=device)[:, None]
    kj = torch.arange(num_key, device=device)[None, :]
    return qi - kj + (num_key - 1)  # (Tq, T)


def resample_patch_kernel(kernel: torch.Tensor, new_size: int) -> torch.Tensor:
    """(D, C, P, P) -> (D, C, P', P') for another patch size, by the pseudo-inverse resize of FlexiViT (Beyer et
    al. 2023, "FlexiViT", Sec. 3.4): with B the matrix that resizes a P×P patch to P'×P' (bicubic, antialiased: the
    resize timm applies), the new kernel ŵ solves Bᵀŵ = w in the least-squares sense, so that a patch and its
    resized copy give the same projection where the resize is invertible (P' >= P)."""
    d, c, p, _ = kernel.shape
    if p == new_size:
        return kernel
    basis = torch.eye(p * p, dtype=torch.float32).reshape(p * p, 1, p, p)  # every one-pixel patch
    resized = F.interpolate(basis, size=(new_size, new_size), mode="bicubic", antialias=True, align_corners=False)
    resize = resized.reshape(p * p, new_size * new_size).T  # B: (P'², P²), column i is pixel i's resized patch
    flat = kernel.reshape(d * c, p * p).float()  # (D·C, P²)
    new = flat @ torch.linalg.pinv(resize)  # ŵᵀ = wᵀ · pinv(B), i.e. ŵ = pinv(Bᵀ) w
    return new.reshape(d, c, new_size, new_size).to(kernel.dtype)

"""Stochastic depth (Huang et al. 2016, "Deep Networks with Stochastic Depth"), as DeiT and AugReg train ViTs
with it: in training each sample skips a residual branch with probability p, and the kept branches are scaled by
1/(1 − p) so that the expected output is unchanged; at evaluation the branch is always taken, unscaled.
"""

from __future__ import annotations

import torch
from torch import nn


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Per-block drop probabilities rising linearly from 0 (first block) to `rate` (last), as timm and DeiT
    (torch.linspace(0, rate, depth))."""
    if depth == 1:
        return [0.0]
    return [rate * i / (depth - 1) for i in range(depth)]


class DropPath(nn.Module):
    """Drops a residual branch per sample: x · Bernoulli(1 − p) / (1 − p) in training, x in eval."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # one draw per sample
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p:g}"

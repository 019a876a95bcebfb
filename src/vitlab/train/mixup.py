"""MixUp as the BiT-HyperRule uses it (Kolesnikov et al. 2020, Section 3.3; big_transfer `bit_pytorch/train.py`).

One mixing weight λ ~ Beta(α, α) per optimiser step; every image of a batch is mixed with another image of the
same batch, x' = λ·x + (1 − λ)·x[perm], and the loss is λ·L(y) + (1 − λ)·L(y[perm]).

The draws come from generators seeded by (seed, step, micro-step, process), never from the global RNG: a step's
batch stays a function of (seed, step), so a resumed run mixes exactly as an uninterrupted one, and λ is the same
on every process and accumulation micro-step of a step, as for the one global batch big_transfer mixes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

_STREAM = 0x4D49_5855  # keeps these draws apart from any other user of (seed, step) seeds


@dataclass(frozen=True)
class MixUp:
    """One batch's mixing: weight `lam` and partner indices `perm` (image i is mixed with image perm[i])."""

    lam: float
    perm: torch.Tensor  # (N,) int64

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> λ·x + (1 − λ)·x[perm]."""
        return self.lam * x + (1.0 - self.lam) * x[self.perm.to(x.device)]

    def loss(self, loss_fn: Callable[[torch.Tensor], torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """λ·loss_fn(y) + (1 − λ)·loss_fn(y[perm]): for a loss linear in its targets (cross-entropy, softmax or
        sigmoid), this is the loss against the mixed targets."""
        return self.lam * loss_fn(y) + (1.0 - self.lam) * loss_fn(y[self.perm.to(y.device)])


def draw_mixup(alpha: float, batch: int, seed: int, step: int, micro: int = 0, rank: int = 0) -> MixUp | None:
    """The mixing of step `step`'s micro-batch `micro` on process `rank` (None when α = 0: MixUp off)."""
    if alpha <= 0:
        return None
    seed = seed % 2**63  # numpy seeds must be non-negative
    lam = float(np.random.default_rng([_STREAM, seed, step]).beta(alpha, alpha))
    perm = np.random.default_rng([_STREAM, seed, step, micro, rank]).permutation(batch)
    return MixUp(lam, torch.from_numpy(perm))

"""MixUp as the BiT-HyperRule uses it (Kolesnikov et al. 2020, Section 3.3; big_transfer `bit_pytorch/train.py`),
and CutMix (Yun et al. 2019) as DeiT uses it beside MixUp (Touvron et al. 2021; timm `Mixup`, mode "batch").

MixUp: one mixing weight λ ~ Beta(α, α) per optimiser step; every image of a batch is mixed with another image
of the same batch, x' = λ·x + (1 − λ)·x[perm], and the loss is λ·L(y) + (1 − λ)·L(y[perm]).

CutMix: λ ~ Beta(α, α) per step, a box of (1 − λ) of the image's area (sides √(1 − λ)·H and √(1 − λ)·W) centred
at a uniform pixel, clipped to the image, is pasted from x[perm]; the labels are mixed by the pixels actually
pasted: λ is replaced by 1 − (box area after clipping) / (H·W), as the paper's reference code and timm do.
With both α > 0, each step is CutMix or MixUp with probability 1/2 (timm's `switch_prob` 0.5, DeiT's setting).

The draws come from generators seeded by (seed, step, micro-step, process), never from the global RNG: a step's
batch stays a function of (seed, step), so a resumed run mixes exactly as an uninterrupted one, and λ is the same
on every process and accumulation micro-step of a step, as for the one global batch big_transfer mixes.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class CutMix(MixUp):
    """One batch's CutMix: rows [top, bottom) and columns [left, right) come from x[perm]; `lam` is the share of
    each image's pixels kept, which weighs the loss as MixUp's λ does."""

    box: tuple[int, int, int, int] = (0, 0, 0, 0)  # (top, left, bottom, right), clipped to the image

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> x with the box pasted from x[perm]."""
        top, left, bottom, right = self.box
        mixed = x.clone()
        mixed[:, :, top:bottom, left:right] = x[self.perm.to(x.device)][:, :, top:bottom, left:right]
        return mixed


def cutmix_box(lam: float, size: tuple[int, int], rng: np.random.Generator) -> tuple[int, int, int, int]:
    """The box of a CutMix with weight `lam` on an image of `size` (H, W): sides int(√(1 − λ)·H) and
    int(√(1 − λ)·W), centre uniform over the pixels, clipped to the image (the CutMix paper's and timm's
    `rand_bbox`)."""
    h, w = size
    cut = math.sqrt(1.0 - lam)
    ch, cw = int(h * cut), int(w * cut)
    cy, cx = int(rng.integers(h)), int(rng.integers(w))
    return (min(max(cy - ch // 2, 0), h), min(max(cx - cw // 2, 0), w),
            min(max(cy + ch // 2, 0), h), min(max(cx + cw // 2, 0), w))


def draw_mixup(alpha: float, batch: int, seed: int, step: int, micro: int = 0, rank: int = 0, *,
               cutmix: float = 0.0, size: tuple[int, int] | None = None) -> MixUp | None:
    """The mixing of step `step`'s micro-batch `micro` on process `rank`: MixUp with α = `alpha`, CutMix with
    α = `cutmix` on images of `size` (H, W), one of the two with probability 1/2 when both are on, None when
    both are 0. λ, the choice and the box are the same on every micro-step and process of a step."""
    if alpha <= 0 and cutmix <= 0:
        return None
    seed = seed % 2**63  # numpy seeds must be non-negative
    rng = np.random.default_rng([_STREAM, seed, step])
    use_cutmix = cutmix > 0 and (alpha <= 0 or rng.random() < 0.5)
    perm = torch.from_numpy(np.random.default_rng([_STREAM, seed, step, micro, rank]).permutation(batch))
    if not use_cutmix:
        return MixUp(float(rng.beta(alpha, alpha)), perm)
    if size is None:
        raise ValueError("CutMix needs the image size (H, W) to draw its box")
    h, w = int(size[0]), int(size[1])
    box = cutmix_box(float(rng.beta(cutmix, cutmix)), (h, w), rng)
    kept = 1.0 - (box[2] - box[0]) * (box[3] - box[1]) / (h * w)  # the pixels actually pasted decide the labels
    return CutMix(kept, perm, box)

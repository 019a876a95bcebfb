"""Masked patch prediction, the paper's self-supervised objective (paper Section 4.6, Appendix B.1.2).

Half of the patch embeddings are corrupted (80% replaced by a learned [mask] embedding, 10% by a random other
patch embedding, 10% kept as they are), and each corrupted patch's final representation predicts the patch's
3-bit mean colour: 512 classes for RGB. The paper's two alternatives are options: the 3-bit colours of the
patch downsized to 4×4 (16 predictions per patch) and L2 regression on the patch's pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.models.config import ViTConfig
from vitlab.models.vit import VisionTransformer

Target = Literal["mean-color", "mean-color-4x4", "pixels"]


@dataclass(frozen=True)
class MPPConfig:
    corrupt_ratio: float = 0.5  # of the patches in each image
    mask_prob: float = 0.8  # of the corrupted: [mask] embedding
    random_prob: float = 0.1  # of the corrupted: another patch's embedding; the rest stay as they are
    target: Target = "mean-color"
    bits: int = 3  # per channel: 3 bits of R, G, B = 512 colours


def corrupt_patches(
    tokens: torch.Tensor, mask_token: torch.Tensor, cfg: MPPConfig, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, P, D) patch embeddings -> (corrupted tokens, corrupted (N, P) bool, action (N, P) int8 with
    0 untouched, 1 [mask], 2 random other patch, 3 corrupted but kept). floor(ratio·P) or ceil(ratio·P) per image."""
    n, p, d = tokens.shape
    dev = tokens.device
    # ratio·P patches per image, randomly rounded so the expected share is exact when ratio·P is fractional.
    count = (cfg.corrupt_ratio * p + torch.rand(n, 1, generator=generator, device=dev)).floor()  # (N, 1)
    rank = torch.rand(n, p, generator=generator, device=dev).argsort(dim=1).argsort(dim=1)
    corrupted = rank < count  # a uniformly random subset of `count` patches per image
    u = torch.rand(n, p, generator=generator, device=dev)
    use_mask = corrupted & (u < cfg.mask_prob)
    use_random = corrupted & (u >= cfg.mask_prob) & (u < cfg.mask_prob + cfg.random_prob)
    # "A random other patch embedding": any patch of the batch except this one (offset 1 .. N·P-1).
    own = torch.arange(n * p, device=dev).reshape(n, p)
    other = (own + torch.randint(1, n * p, (n, p), generator=generator, device=dev)) % (n * p)
    out = torch.where(use_mask[..., None], mask_token.to(tokens.dtype).expand(n, p, d), tokens)
    out = torch.where(use_random[..., None], tokens.reshape(n * p, d)[other], out)
    action = corrupted.to(torch.int8) * 3
    action[use_mask], action[use_random] = 1, 2
    return out, corrupted, action


def quantized_colors(pixels01: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, C, h, w) values in [0, 1] -> (N, h, w) colour ids: per channel floor(v·2^bits) clipped, channel 0
    the most significant digit (RGB: id = r·64 + g·8 + b for 3 bits)."""
    levels = 2**bits
    q = (pixels01 * levels).floor().clamp(0, levels - 1).long()  # (N, C, h, w)
    ids = torch.zeros_like(q[:, 0])
    for c in range(q.shape[1]):
        ids = ids * levels + q[:, c]
    return ids


def mean_color_targets(pixels01: torch.Tensor, patch: int, bits: int = 3, cells: int = 1) -> torch.Tensor:
    """Colour ids of each patch's mean colour: (N, P) for cells=1, or (N, P, cells²) for the patch downsized
    to cells×cells (the paper's 4×4 variant), patches in raster order like the tokens."""
    n, _, h, w = pixels01.shape
    means = F.avg_pool2d(pixels01, patch // cells)  # (N, C, gh·cells, gw·cells)
    ids = quantized_colors(means, bits)  # (N, gh·cells, gw·cells)
    gh, gw = h // patch, w // patch
    ids = ids.reshape(n, gh, cells, gw, cells).permute(0, 1, 3, 2, 4)  # (N, gh, gw, cells, cells)
    return ids.reshape(n, gh * gw) if cells == 1 else ids.reshape(n, gh * gw, cells * cells)


def pixel_targets(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, P, patch·patch·C): each patch's pixels, for L2 regression."""
    n, c, _, _ = images.shape
    cols = F.unfold(images, kernel_size=patch, stride=patch)  # (N, C·patch·patch, P)
    return cols.transpose(1, 2).reshape(n, -1, c * patch * patch)


class MaskedPatchPredictor(nn.Module):
    """An encoder (any vitlab ViT) plus the [mask] embedding and a linear prediction head. `forward(images)`
    returns (loss, metrics); `self.encoder` is the plain ViT to save and fine-tune afterwards."""

    def __init__(self, encoder: VisionTransformer, cfg: MPPConfig = MPPConfig()):
        super().__init__()
        if encoder.config.resnet is not None:
            raise ValueError("masked patch prediction corrupts patch embeddings of pixels; use a plain ViT")
        self.encoder, self.cfg = encoder, cfg
        width, chans, patch = encoder.config.width, encoder.config.in_chans, encoder.config.patch_size
        self.mask_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        colors = (2**cfg.bits) ** chans
        out = {"mean-color": colors, "mean-color-4x4": 16 * colors, "pixels": patch * patch * chans}[cfg.target]
        if cfg.target == "mean-color-4x4" and patch % 4:
            raise ValueError(f"the 4×4 target needs a patch size divisible by 4, not {patch}")
        self.head = nn.Linear(width, out)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        cfg, enc = self.cfg, self.encoder.config
        if cfg.target == "pixels":
            return pixel_targets(images, enc.patch_size)
        mean = images.new_tensor(enc.mean[: enc.in_chans]).view(1, -1, 1, 1)
        std = images.new_tensor(enc.std[: enc.in_chans]).view(1, -1, 1, 1)
        pixels01 = (images * std + mean).clamp(0, 1)  # undo the input normalisation
        return mean_color_targets(pixels01, enc.patch_size, cfg.bits, 4 if cfg.target == "mean-color-4x4" else 1)

    def predictions(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(predictions, targets) for the corrupted patches: colour logits (M, colours) and ids (M,) (the 4×4
        variant: M·16 rows), or pixel values (M, P·P·C) for the L2 target."""
        enc = self.encoder
        patches, grid = enc.embed_patches(images)  # (N, P, D)
        corrupted_tokens, corrupted, _ = corrupt_patches(patches, self.mask_token, self.cfg, generator)
        z, _ = enc.add_prefix_and_position(corrupted_tokens, grid)
        for block in enc.blocks:
            z = block(z)
        z = enc.norm(z)[:, enc.config.num_prefix_tokens:]  # (N, P, D): patch tokens only
        pred = self.head(z[corrupted])  # (M, out) for the M corrupted patches
        target = self.targets(images)[corrupted]
        if self.cfg.target == "mean-color-4x4":
            pred = pred.reshape(-1, pred.shape[-1] // 16)  # (M·16, colours)
            target = target.reshape(-1)
        return pred, target

    def loss(self, pred: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if self.cfg.target == "pixels":
            per_patch = F.mse_loss(pred, target, reduction="none").mean(-1)  # (M,)
            return per_patch.mean() if reduction == "mean" else per_patch
        return F.cross_entropy(pred.float(), target, reduction=reduction)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred, target = self.predictions(images, generator)
        loss = self.loss(pred, target)
        metrics = {"loss": loss.detach()}
        if self.cfg.target != "pixels":
            metrics["acc"] = (pred.argmax(-1) == target).float().mean()
        return loss, metrics

    @property
    def config(self) -> ViTConfig:  # what the training loop reads: the encoder's input normalisation and architecture
        return self.encoder.config


def validation_summary(metrics: dict[str, float], target: str) -> str:
    """The console line of an MPP validation. Its unit is the corrupted patch, not the image: every image
    contributes `corrupt_ratio` of its patches, and the 4×4 target scores each patch's 16 cells separately."""
    n = metrics["count"]
    if target == "pixels":
        return f"val L2 loss {metrics['loss']:.4f} over {n} corrupted patches"
    unit = "corrupted patches" if target == "mean-color" else "colour cells, 16 per corrupted patch"
    return (f"val loss {metrics['loss']:.4f}  colour top-1 {100 * metrics['top1']:.2f}%  "
            f"top-5 {100 * metrics['top5']:.2f}%  ({n} {unit})")

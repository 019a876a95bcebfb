"""The classification losses, one home for training and validation: the trainer minimises the batch mean of the
per-image loss the evaluator reports, so the two cannot drift apart."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def per_image_loss(logits: torch.Tensor, labels: torch.Tensor, kind: str = "softmax",
                   smoothing: float = 0.0) -> torch.Tensor:
    """(N,) losses in float32. `softmax`: cross-entropy; `sigmoid`: per-class binary cross-entropy summed over
    classes, as big_vision's `sigmoid_xent`: −Σ_c [t·log σ(x) + (1 − t)·log σ(−x)], the upstream loss of the
    paper's JFT and ImageNet-21k models. (log σ, not torch's binary_cross_entropy_with_logits: at a logit of
    −10, the −10 head bias of pre-training, the latter rounds log(1 + e^−10) through 1 + e^−10 in float32 and
    is 0.8% too large per class.)"""
    logits = logits.float()
    if kind == "softmax":
        return F.cross_entropy(logits, labels, label_smoothing=smoothing, reduction="none")
    k = logits.shape[-1]
    targets = F.one_hot(labels, k).float() * (1.0 - smoothing) + smoothing / k
    return -(targets * F.logsigmoid(logits) + (1.0 - targets) * F.logsigmoid(-logits)).sum(-1)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, kind: str, smoothing: float) -> torch.Tensor:
    """The training loss: `per_image_loss` averaged over the batch (float32 under autocast)."""
    return per_image_loss(logits, labels, kind, smoothing).mean()

"""The two ways the attention of a ViT block is computed; which one runs is the setting `attention_form` of each
`Attention` module (`set_attention_form`), chosen for training by `vitlab.runtime.attention`.

- "flash": torch's fused scaled-dot-product attention (its flash kernel on a CPU), the default and what inference
  always uses.
- "matmul": the same attention as explicit matmuls, `softmax((q * scale) @ kᵀ) @ v`, the logits and the softmax in
  the input's dtype (bf16 under autocast). Where gradients are computed its backward is a few batched matmuls,
  which run at the CPU's matmul speed where the flash kernel's backward does not (BENCHMARKS.md "Training
  attention"); without gradients (inference) "flash" is used whatever the setting, as the fused forward measures
  as fast or faster.

Shapes: N batch, H heads, Tq queries, T keys, hd head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.constants import ATTENTION_FORMS


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
           dropout: float = 0.0, form: str = "flash") -> torch.Tensor:
    """softmax(q·kᵀ/√hd + bias) · v with dropout on the weights: q (N, H, Tq, hd), k and v (N, H, T, hd), bias
    broadcastable to (N, H, Tq, T) -> (N, H, Tq, hd). `form` as the module docstring says."""
    if form == "flash" or not torch.is_grad_enabled():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
    if form != "matmul":
        raise ValueError(f"attention form must be one of {', '.join(ATTENTION_FORMS)}, not {form!r}")
    logits = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (N, H, Tq, T)
    if bias is not None:
        logits = logits + bias
    weights = logits.softmax(dim=-1)
    if dropout:
        weights = F.dropout(weights, dropout)
    return weights @ v


def set_attention_form(model: nn.Module, form: str) -> nn.Module:
    """Every attention module of `model` computes in `form` ("flash" or "matmul"); a model without attention (a
    BiT) is left as it is. Returns the model."""
    if form not in ATTENTION_FORMS:
        raise ValueError(f"attention form must be one of {', '.join(ATTENTION_FORMS)}, not {form!r}")
    for module in model.modules():
        if hasattr(module, "attention_form"):
            module.attention_form = form
    return model


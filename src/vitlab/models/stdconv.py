"""Weight-standardised convolution, shared by the hybrid stem (models/resnet.py) and BiT (models/bit.py): each
family states its own formula (`standardize`), this module owns when the standardised kernel is computed.

Training computes it on every forward, so that gradients flow through the standardisation into the weights. An
inference forward (eval mode, autograd off) reuses the kernel it computed last while the weight is unchanged, in
eager mode and in a torch.fx trace alike (`standardized_kernel` is an fx leaf that holds the module); under
torch.compile, torch.export and TorchScript tracing the graph computes it from the weights, so that it never
holds a copy that a later weight change would leave stale.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn


class StandardizedConv2d(nn.Conv2d):
    """A bias-free Conv2d whose kernel is standardised per output filter before each use, with the family's
    formula and `eps`; a subclass defines `standardize`, and pads in `forward` where Conv2d's padding does not."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, padding: int, eps: float):
        super().__init__(in_ch, out_ch, kernel, stride=stride, padding=padding, bias=False)
        self.eps = eps
        self._standardized: tuple[tuple, torch.Tensor] | None = None  # (weight's identity, kernel)

    def standardize(self, weight: torch.Tensor) -> torch.Tensor:
        """The family's standardisation of `weight` (out, in, kh, kw)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.standardized_weight(), None, self.stride, self.padding)

    def standardized_weight(self) -> torch.Tensor:
        """The standardised kernel for this forward: computed afresh, or reused at inference (module docstring)."""
        return standardized_kernel(self, self.weight)

    def train(self, mode: bool = True) -> StandardizedConv2d:
        self._standardized = None  # a mode switch frees the copy: training would never read it
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> StandardizedConv2d:
        self._standardized = None  # .to(), .cuda(), .double(): the copy would stay on the old device or dtype
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_standardized": None}  # pickles and deep copies carry no copy


def standardized_kernel(conv: StandardizedConv2d, weight: torch.Tensor) -> torch.Tensor:
    """`conv.standardize(weight)`, kept on `conv` and returned again while the weight is the same tensor, unmodified:
    its version counter moves on every in-place update (an optimizer step, load_state_dict, a no_grad edit; a write
    through `.data` bypasses it, so call `model.eval()` after one), its storage and dtype on a cast or a move.
    Computed afresh whenever autograd, training mode or graph capture is on, and for an inference-mode tensor,
    which has no version counter.

    A torch.fx leaf: a trace records one call taking the module, which then runs, cache included, on real tensors."""
    if (conv.training or torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.jit.is_tracing()
            or weight.is_inference()):
        return conv.standardize(weight)
    key = (id(weight), weight._version, weight.data_ptr(), weight.dtype, weight.device, conv.eps)
    if conv._standardized is None or conv._standardized[0] != key:
        conv._standardized = (key, conv.standardize(weight))
    return conv._standardized[1]


torch.fx.wrap("standardized_kernel")

"""The hybrid stem (paper Section 3.1 "Hybrid Architecture"; official vit_jax `models_resnet.py`): a
POST-activation ResNet with v1.5 bottlenecks, GroupNorm(32, eps 1e-6), weight-standardised convs
((w − mean) / (std + 1e-5)) and JAX "SAME" padding. The paper's CNN baselines are BiT's pre-activation ResNetV2,
a different network: models/bit.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.models.config import ResNetConfig
from vitlab.models.stdconv import StandardizedConv2d

GN_EPS = 1e-6
WS_EPS = 1e-5


@torch.fx.wrap
def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """JAX/TF "SAME": output ceil(size/stride); the odd pixel of padding goes after, not before. A torch.fx leaf:
    it branches on the size, so a trace records the call and runs it on the real size."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class StdConv2dSame(StandardizedConv2d):
    """Conv with weight standardisation w <- (w - mean) / (std + 1e-5) per output filter, JAX "SAME" padding."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1):
        # Stride 1 with an odd kernel pads symmetrically, which Conv2d does natively; stride 2 may not.
        static = (kernel - 1) // 2 if stride == 1 else 0
        super().__init__(in_ch, out_ch, kernel, stride, static, WS_EPS)

    def standardize(self, weight: torch.Tensor) -> torch.Tensor:
        # The official eps is added to the standard deviation, outside the square root: no fused normalisation
        # kernel computes that rounding, so statistics in one var_mean pass, then subtract and divide.
        var, mean = torch.var_mean(weight, dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (weight - mean) / (var.sqrt() + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride[0] > 1:
            k, s = self.kernel_size[0], self.stride[0]
            ph, pw = same_padding(x.shape[-2], k, s), same_padding(x.shape[-1], k, s)
            x = F.pad(x, (pw[0], pw[1], ph[0], ph[1]))
        return super().forward(x)


def max_pool_same(x: torch.Tensor, kernel: int = 3, stride: int = 2) -> torch.Tensor:
    ph, pw = same_padding(x.shape[-2], kernel, stride), same_padding(x.shape[-1], kernel, stride)
    x = F.pad(x, (pw[0], pw[1], ph[0], ph[1]), value=float("-inf"))
    return F.max_pool2d(x, kernel, stride)


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=GN_EPS)


class Bottleneck(nn.Module):
    """1×1 → 3×3 (stride here: v1.5) → 1×1 ×4, GN after each, ReLU after the sum; projection shortcut when the
    shape changes. The last GN's scale starts at zero so each unit starts as the identity."""

    def __init__(self, in_ch: int, mid_ch: int, stride: int):
        super().__init__()
        out_ch = 4 * mid_ch
        self.downsample = None
        if in_ch != out_ch or stride != 1:
            self.downsample = nn.Sequential(StdConv2dSame(in_ch, out_ch, 1, stride), group_norm(out_ch))
        self.conv1, self.norm1 = StdConv2dSame(in_ch, mid_ch, 1), group_norm(mid_ch)
        self.conv2, self.norm2 = StdConv2dSame(mid_ch, mid_ch, 3, stride), group_norm(mid_ch)
        self.conv3, self.norm3 = StdConv2dSame(mid_ch, out_ch, 1), group_norm(out_ch)
        nn.init.zeros_(self.norm3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = self.downsample(x) if self.downsample is not None else x
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return F.relu(shortcut + y)


class ResNetStem(nn.Module):
    """Root (StdConv 7×7/2 → GN → ReLU → max-pool 3×3/2) and stages; (N, C, H, W) -> (N, C', H/r, W/r)."""

    def __init__(self, cfg: ResNetConfig, in_chans: int = 3):
        super().__init__()
        width = cfg.root_width
        self.conv = StdConv2dSame(in_chans, width, 7, 2)
        self.norm = group_norm(width)
        stages, in_ch = [], width
        for i, units in enumerate(cfg.layers):
            mid, stride = width * 2**i, 1 if i == 0 else 2
            stage = nn.Sequential(*(Bottleneck(in_ch if u == 0 else 4 * mid, mid, stride if u == 0 else 1)
                                    for u in range(units)))
            stages.append(stage)
            in_ch = 4 * mid
        self.stages = nn.Sequential(*stages)
        self.out_channels = cfg.out_channels
        self.reduction = cfg.reduction
        for m in self.modules():
            if isinstance(m, StdConv2dSame):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool_same(F.relu(self.norm(self.conv(x))))
        return self.stages(x)

"""BiT: the paper's CNN baselines (Kolesnikov et al., "Big Transfer", ECCV 2020; ViT paper Section 4.1, Table 6).

A pre-activation ResNetV2 as big_transfer's `bit_jax/models.py` and `bit_pytorch/models.py` define it. This is
NOT the hybrid stem (models/resnet.py, the official vit_jax post-activation ResNet): here the root has no norm,
every unit normalises its input first, the projection shortcut reads the pre-activated input, and a final
GroupNorm + ReLU precedes the global pool and the 1×1 head.

    root   StdConv 7×7/2 (padding 3, no bias) → zero-pad 1 → max-pool 3×3/2
    unit   GN → ReLU ─┬→ conv1 1×1 → GN → ReLU → conv2 3×3 (stride) → GN → ReLU → conv3 1×1 ─→ + → out
                      └→ [projection StdConv 1×1 (stride), only when the shape changes] ─────────┘
                         (without a projection the shortcut is the unit's raw input)
    head   GN → ReLU → global mean → Dense (zero-initialised)

Shapes: N batch, C channels, (H, W) spatial. Weight standardisation divides by sqrt(var + ws_eps): big_transfer
uses 1e-10, timm 1e-8; a model keeps the value of the file it was loaded from, so its outputs equal the source's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitlab.models.config import BiTConfig
from vitlab.models.inputs import check_pixels
from vitlab.models.stdconv import StandardizedConv2d
from vitlab.models.timm_compat import BiTTimmMixin
from vitlab.models.timm_keys import bit_vitlab_key
from vitlab.models.vit import zero_head

torch.fx.wrap("check_pixels")  # a torch.fx leaf: the trace runs the input check on the real tensor


class StdConv2d(StandardizedConv2d):
    """Weight-standardised convolution without bias, symmetric ("fixed") padding as big_transfer pads."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1, eps: float = 1e-10):
        super().__init__(in_ch, out_ch, kernel, stride, kernel // 2, eps)

    def standardize(self, weight: torch.Tensor) -> torch.Tensor:
        """(w − mean) / sqrt(var + eps) per output filter, mean and (biased) variance over (in, kh, kw)."""
        # Batch norm over a (1, out, in·kh·kw) view computes exactly this in one fused kernel, forward and backward,
        # where var_mean, subtract and multiply take three passes over the weights.
        flat = weight.reshape(1, weight.shape[0], -1)
        return F.batch_norm(flat, None, None, training=True, momentum=0.0, eps=self.eps).reshape_as(weight)


class PreActBottleneck(nn.Module):
    """One ResNetV2 unit: (N, in_ch, H, W) -> (N, 4·mid_ch, H/stride, W/stride)."""

    def __init__(self, in_ch: int, mid_ch: int, stride: int, cfg: BiTConfig):
        super().__init__()
        out_ch = 4 * mid_ch
        gn = lambda c: nn.GroupNorm(32, c, eps=cfg.gn_eps)  # noqa: E731
        self.norm1, self.conv1 = gn(in_ch), StdConv2d(in_ch, mid_ch, 1, eps=cfg.ws_eps)
        self.norm2, self.conv2 = gn(mid_ch), StdConv2d(mid_ch, mid_ch, 3, stride, eps=cfg.ws_eps)
        self.norm3, self.conv3 = gn(mid_ch), StdConv2d(mid_ch, out_ch, 1, eps=cfg.ws_eps)
        needs_projection = stride != 1 or in_ch != out_ch
        self.downsample = StdConv2d(in_ch, out_ch, 1, stride, eps=cfg.ws_eps) if needs_projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In-place ReLUs act on fresh GroupNorm outputs, which GroupNorm's backward does not need.
        pre = F.relu_(self.norm1(x))
        shortcut = self.downsample(pre) if self.downsample is not None else x
        y = self.conv1(pre)
        y = self.conv2(F.relu_(self.norm2(y)))
        y = self.conv3(F.relu_(self.norm3(y)))
        return y.add_(shortcut)


class BiT(BiTTimmMixin, nn.Module):
    """BiT ResNetV2 classifier: root, four stages of pre-activation bottlenecks, GN + ReLU, mean pool, head."""

    def __init__(self, config: BiTConfig):
        super().__init__()
        cfg = self.config = config
        width = cfg.root_width
        self.stem = nn.Module()  # a namespace, so the root conv is `stem.conv` as in timm and big_transfer
        self.stem.conv = StdConv2d(cfg.in_chans, width, 7, 2, eps=cfg.ws_eps)
        stages, in_ch = [], width
        for i, units in enumerate(cfg.layers):
            mid, stride = width * 2**i, 1 if i == 0 else 2
            stages.append(nn.Sequential(*(
                PreActBottleneck(in_ch if u == 0 else 4 * mid, mid, stride if u == 0 else 1, cfg)
                for u in range(units)
            )))  # fmt: skip
            in_ch = 4 * mid
        self.stages = nn.Sequential(*stages)
        self.norm = nn.GroupNorm(32, in_ch, eps=cfg.gn_eps)  # "norm-pre-head"
        self.num_features = in_ch
        self.head = nn.Linear(in_ch, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.grad_checkpointing = False  # set_grad_checkpointing(): units recomputed in the backward
        init_weights(self)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """timm's tensor names (`stages.i.blocks.j.…`, the 1×1-convolution head `head.fc.*`) load as well as
        vitlab's, renamed by the timm BiT reader's own map and the head kernel flattened to the Linear it equals:
        so that timm's `load_checkpoint(model, path)` and `model.load_state_dict(timm_model.state_dict())` work on
        vitlab's model. Children load after this call, from the renamed dict."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            new = prefix + bit_vitlab_key(key[len(prefix) :])
            if new != key and new not in state_dict:
                value = state_dict.pop(key)
                state_dict[new] = value.flatten(1) if new == prefix + "head.weight" and value.ndim == 4 else value
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each unit in the backward pass instead of storing its activations: a large model's training
        memory for about one extra forward, with the same gradients."""
        self.grad_checkpointing = bool(enable)

    def run_stage(self, stage: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """A stage's units in turn, each recomputed in the backward when gradient checkpointing is on."""
        recompute = self.grad_checkpointing and torch.is_grad_enabled()
        for unit in stage:
            x = checkpoint(unit, x, use_reentrant=False) if recompute else unit(x)
        return x

    def stem_pool(self, x: torch.Tensor) -> torch.Tensor:
        """Zero padding, then VALID 3×3/2 max-pooling: (N, 64·wf, H/4, W/4). It feeds the stages, so a model pruned
        to the root conv's features has none (as timm's)."""
        return F.max_pool2d(F.pad(x, (1, 1, 1, 1)), 3, 2) if len(self.stages) else x

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final GroupNorm + ReLU (timm's norm-act "norm"); none once pruned (prune_intermediate_layers)."""
        # In place: the ReLU acts on the fresh GroupNorm output, which GroupNorm's backward does not need.
        return x if isinstance(self.norm, nn.Identity) else F.relu_(self.norm(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Feature map after the final GroupNorm and ReLU: (N, C, H/32, W/32)."""
        check_pixels(x, self.config.in_chans, self.stem.conv.weight)
        x = self.stem_pool(self.stem.conv(x))  # (N, 64·wf, H/4, W/4)
        for stage in self.stages:
            x = self.run_stage(stage, x)
        return self.final_norm(x)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Global mean over the map: the 2048·wf representation; the classifier unless pre_logits. Unpooled
        (timm's global_pool ""): the map as it is, the classifier at each position (timm's 1×1 convolution)."""
        if self.unpooled:
            if pre_logits or isinstance(self.head, nn.Identity):
                return features
            return self.head(features.movedim(1, -1)).movedim(-1, 1)  # (N, H, W, C) -> (N, classes, H, W)
        pooled = features.mean(dim=(2, 3))
        return pooled if pre_logits else self.head(pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) of images x, float (N, in_chans, H, W) normalised as `config.mean`/`config.std`
        say; any H, W (a CNN); with num_classes=0, the pooled representation. `forward_head(forward_features(x))`."""
        return self.forward_head(self.forward_features(x))

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """BiT transfer rule (and the ViT paper's): a new zero-initialised head for the new classes. `global_pool`
        (timm's argument): "avg", the pooling BiT has, or "" (none, as timm: the head acts at each position)."""
        if global_pool not in (None, "avg", ""):
            raise ValueError(f"global_pool={global_pool!r}: BiT pools with 'avg' ('': no pooling)")
        if global_pool is not None:
            self.unpooled = global_pool == ""
        self.head = zero_head(self.num_features, num_classes, self.stem.conv.weight)
        self.config = self.config.replace(num_classes=num_classes)


@torch.no_grad()
def init_weights(model: BiT) -> None:
    """big_transfer's JAX model: Flax-default LeCun-normal convolutions (weight standardisation makes their
    scale irrelevant to the forward pass), GroupNorm scale 1 and bias 0, and a zero head."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.weight[0].numel()
            std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # truncated at ±2σ, std corrected back
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
    if isinstance(model.head, nn.Linear):
        nn.init.zeros_(model.head.weight)
        nn.init.zeros_(model.head.bias)

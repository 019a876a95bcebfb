"""Analytic multiply-add counts per image, the unit the paper calls "FLOPs" (ViT-B/16 at 224: 17.58 G), and
parameter counts, both from the config alone (no model is built, so no torch is imported).

Only multiply-adds of matrix products and convolutions are counted (Dense, conv, the two attention products
and the relative-position logits); norms, activations, softmax and additions are not, as in the paper. Rule of
thumb for a training step: the backward pass costs two forward passes (gradient of the input and of the
weight) except in the first layer, whose input (the pixels) needs no gradient.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from vitlab.models.config import BiTConfig, ModelConfig, ResNetConfig, ViTConfig
from vitlab.models.registry import model_config


@dataclass(frozen=True)
class MacCount:
    """Multiply-adds per image, by part of the model."""

    stem: int = 0  # ResNet convolutions (hybrids, BiT)
    patch_embed: int = 0
    attention_proj: int = 0  # qkv and output projections
    attention_mix: int = 0  # q·kᵀ and weights·v (and relative-position logits)
    mlp: int = 0
    head: int = 0  # representation layer and classifier
    first_layer: int = 0  # MACs of the layer that sees the pixels (part of stem or patch_embed)

    @property
    def total(self) -> int:
        return self.stem + self.patch_embed + self.attention_proj + self.attention_mix + self.mlp + self.head

    @property
    def training(self) -> int:
        """Forward + backward: 3× forward, less the input gradient of the first layer (pixels need none)."""
        return 3 * self.total - self.first_layer

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total, "training": self.training}


def count_macs(
    model: ModelConfig | str, image_size: int | tuple[int, int] | None = None, *, class_token_last_block: bool = False
) -> MacCount:
    """Multiply-adds per image of `model` (a config or a registry name) at `image_size` (default: native).

    class_token_last_block=True counts what vitlab's inference session and training step execute for a token
    classifier (`forward_unobserved`; `forward` computes the full model, as timm's does): the last block
    computes keys and values for all tokens but queries, attention output and MLP for the class token only.
    The default counts the full model, as the paper (and timm) does.
    """
    cfg = model_config(model) if isinstance(model, str) else model
    size = _pair(image_size) if image_size is not None else cfg.image_size
    if isinstance(cfg, BiTConfig):
        # BiT's ResNetV2 has the hybrid stem's convolutions at the same resolutions (its symmetric padding gives
        # ceil(size / stride) like "SAME"); only norms and activations, which are not multiply-adds, move.
        topology = ResNetConfig(layers=cfg.layers, width_factor=cfg.width_factor)
        stem, first, _ = resnet_macs(topology, size, cfg.in_chans)
        return MacCount(stem=stem, head=cfg.out_channels * cfg.num_classes, first_layer=first)
    return _vit_macs(cfg, size, class_token_last_block)


def _vit_macs(cfg: ViTConfig, size: tuple[int, int], class_token_last_block: bool) -> MacCount:
    stem, first, feat = 0, 0, size
    in_ch = cfg.in_chans
    if cfg.resnet is not None:
        stem, first, feat = resnet_macs(cfg.resnet, size, cfg.in_chans)
        in_ch = cfg.resnet.out_channels
    p = cfg.patch_size
    grid = (feat[0] // p) * (feat[1] // p)
    patch = grid * in_ch * p * p * cfg.width
    if cfg.resnet is None:
        first = patch
    t = grid + cfg.num_prefix_tokens
    proj = mix = mlp = 0
    for i in range(cfg.depth):
        tq = 1 if class_token_last_block and i == cfg.depth - 1 and cfg.classifier == "token" else t
        p_, m_, f_ = _block_macs(cfg, t, tq)
        proj, mix, mlp = proj + p_, mix + m_, mlp + f_
    feat_dim = cfg.representation_size or cfg.width
    head = (cfg.width * cfg.representation_size if cfg.representation_size else 0) + feat_dim * cfg.num_classes
    return MacCount(stem, patch, proj, mix, mlp, head, first)


def _block_macs(cfg: ViTConfig, t: int, tq: int) -> tuple[int, int, int]:
    """(projections, token mixing, MLP) MACs of one block with t tokens of which tq are queries."""
    d = cfg.width
    # qkv runs on every token (keys and values need them all); the rest only on the tq query rows.
    proj = t * d * 3 * d + tq * d * d
    mix = 2 * tq * t * d  # q·kᵀ and weights·v, summed over heads (H × hd = D)
    if cfg.pos_embed == "relative":
        mix += tq * (2 * t - 1) * d  # queries against the (2T−1)-offset table
    mlp = 2 * tq * d * cfg.mlp_dim
    return proj, mix, mlp


def resnet_macs(cfg: ResNetConfig, size: tuple[int, int], in_chans: int = 3) -> tuple[int, int, tuple[int, int]]:
    """(MACs, MACs of the root conv, output spatial size) of the BiT ResNet stem with JAX "SAME" padding."""
    h, w = _down(size, 2)  # root 7×7 stride 2
    root = h * w * in_chans * cfg.root_width * 49
    h, w = _down((h, w), 2)  # max-pool 3×3 stride 2
    total, in_ch = root, cfg.root_width
    for i, units in enumerate(cfg.layers):
        mid = cfg.root_width * 2**i
        for u in range(units):
            stride = 2 if i > 0 and u == 0 else 1
            oh, ow = _down((h, w), stride)
            total += h * w * in_ch * mid  # conv1 1×1 at the input resolution
            total += oh * ow * mid * mid * 9  # conv2 3×3 carries the stride (v1.5)
            total += oh * ow * mid * 4 * mid  # conv3 1×1
            if in_ch != 4 * mid or stride != 1:
                total += oh * ow * in_ch * 4 * mid  # projection shortcut
            h, w, in_ch = oh, ow, 4 * mid
    return total, root, (h, w)


def count_parameters(config: ModelConfig) -> int:
    """The number of parameters of `build_model(config)`, from the config: every tensor the model classes create
    (weights, biases, norm scales and shifts, tokens, position tables, layer scales)."""
    if isinstance(config, BiTConfig):
        total, in_ch = config.in_chans * config.root_width * 49, config.root_width  # root conv, no bias
        for i, units in enumerate(config.layers):
            mid = config.root_width * 2**i
            for u in range(units):
                stride = 2 if i > 0 and u == 0 else 1
                total += 2 * in_ch + in_ch * mid + 2 * mid + 9 * mid * mid + 2 * mid + mid * 4 * mid  # GN, conv ×3
                if stride != 1 or in_ch != 4 * mid:
                    total += in_ch * 4 * mid  # projection conv (pre-activation: no norm of its own)
                in_ch = 4 * mid
        head = in_ch * config.num_classes + config.num_classes if config.num_classes else 0
        return total + 2 * in_ch + head  # norm before the head
    d, total, embed_in = config.width, 0, config.in_chans
    if config.resnet is not None:
        total, embed_in = _resnet_stem_parameters(config.resnet, config.in_chans), config.resnet.out_channels
    gh, gw = config.grid_size()
    tokens = config.num_prefix_tokens + gh * gw
    total += embed_in * config.patch_size**2 * d + d  # patch embedding conv with bias
    total += d * (int(config.has_class_token) + config.reg_tokens)
    if config.pos_embed == "learned":
        total += (config.pos_prefix_tokens + gh * gw) * d
    elif config.pos_embed == "2d":
        total += (gw + gh) * (d // 2) + config.pos_prefix_tokens * d
    block = 4 * d  # two LayerNorms
    block += 3 * d * d + (3 * d if config.qkv_bias else 0) + d * d + d  # qkv and output projection
    block += d * config.mlp_dim + config.mlp_dim + config.mlp_dim * d + d  # MLP
    if config.pos_embed == "relative":
        block += config.num_heads * (2 * tokens - 1) * config.head_dim
    if config.layer_scale is not None:
        block += 2 * d
    total += config.depth * block + 2 * d  # final norm (on the tokens, or fc_norm after pooling)
    rep = config.representation_size
    if rep:
        total += d * rep + rep
    features = rep or d
    return total + (features * config.num_classes + config.num_classes if config.num_classes else 0)


def _resnet_stem_parameters(cfg: ResNetConfig, in_chans: int) -> int:
    """Parameters of the hybrid's ResNet stem: StdConv (no bias) and GroupNorm after each, projection shortcuts."""
    total, in_ch = in_chans * cfg.root_width * 49 + 2 * cfg.root_width, cfg.root_width
    for i, units in enumerate(cfg.layers):
        mid = cfg.root_width * 2**i
        for u in range(units):
            stride = 2 if i > 0 and u == 0 else 1
            total += in_ch * mid + 2 * mid + 9 * mid * mid + 2 * mid + mid * 4 * mid + 2 * 4 * mid
            if in_ch != 4 * mid or stride != 1:
                total += in_ch * 4 * mid + 2 * 4 * mid
            in_ch = 4 * mid
    return total


def _down(size: tuple[int, int], stride: int) -> tuple[int, int]:
    """Output size of a "SAME" padded layer: ceil(size / stride)."""
    return (math.ceil(size[0] / stride), math.ceil(size[1] / stride))


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))

"""The Vision Transformer of the paper (Section 3.1, Eq. 1-4), from patch embedding to head, in one file.

Shapes: N batch, T tokens (prefix + grid), D width, H heads, hd head dim, (gh, gw) patch grid.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitlab.models.attention import attend
from vitlab.models.config import ViTConfig
from vitlab.models.droppath import DropPath, drop_path_rates
from vitlab.models.inputs import check_image_size, check_pixels, check_tokens, is_symbolic, pad_to_stride
from vitlab.models.posembed import (
    relative_position_index,
    resample_1d,
    resample_patch_kernel,
    resample_pos_embed,
    resample_relative_table,
)
from vitlab.models.resnet import ResNetStem
from vitlab.models.timm_compat import ViTTimmMixin
from vitlab.models.timm_keys import vitlab_key
from vitlab.ranges import MAX_CLASSES, is_int

# Leaves of a torch.fx trace: each branches on a type or a size, which symbolic tracing cannot evaluate, so the trace
# records the call as one node that runs on real values (torch.fx.wrap acts on this module's names). A traced model
# therefore resamples its position table on each call at a non-native size, where eager inference reuses it: one
# small interpolation (BENCHMARKS.md, "Bounds and choices in the code").
for _leaf in ("check_pixels", "check_image_size", "check_tokens", "pad_to_stride", "resample_pos_embed", "resample_1d",
              "resample_relative_table", "relative_position_index"):
    torch.fx.wrap(_leaf)


class PatchEmbed(nn.Module):
    """Cut into P×P patches and project each to D: a convolution with kernel = stride = P."""

    def __init__(self, patch_size: int, in_chans: int, width: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, width, kernel_size=patch_size, stride=patch_size)
        self.patch_size = (patch_size, patch_size)  # timm's attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (N, D, gh, gw) -> (N, gh*gw, D)

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        """The patch grid (gh, gw) that `forward` makes of `x`: the convolution floors each side."""
        return x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1]


class RelativeLogits(nn.Module):
    """Paper Appendix D.4: one learned embedding per 1-D offset between query and key, used as keys of an
    extra attention with the original queries; its logits bias the content logits before the softmax."""

    def __init__(self, num_tokens: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_tokens = num_tokens
        self.embed = nn.Parameter(torch.randn(num_heads, 2 * num_tokens - 1, head_dim) * 0.02)

    def forward(self, q: torch.Tensor, num_keys: int, query_offset: int) -> torch.Tensor:
        # q: (N, H, Tq, hd), already scaled by 1/sqrt(hd) -> bias (N, H, Tq, T)
        table = resample_relative_table(self.embed, num_keys)  # other input sizes: offsets stretched
        logits = torch.einsum("nhqd,hod->nhqo", q, table)  # (N, H, Tq, 2T-1)
        index = relative_position_index(q.shape[2], num_keys, query_offset, q.device)  # (Tq, T)
        return logits.gather(-1, index.expand(logits.shape[0], logits.shape[1], -1, -1))


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig, num_tokens: int):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=cfg.qkv_bias)  # q, k, v stacked along out
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.attn_dropout = cfg.attn_dropout
        self.rel = RelativeLogits(num_tokens, cfg.num_heads, cfg.head_dim) if cfg.pos_embed == "relative" else None
        self.attention_form = "flash"  # models.attention.set_attention_form

    def forward(
        self, x: torch.Tensor, num_queries: int | None = None, weights_out: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """(N, T, D) -> (N, Tq, D). Queries are the first `num_queries` tokens (all by default); keys and values
        are all tokens. Given a `weights_out` list, the softmax weights are computed explicitly and appended to it
        as (N, H, Tq, T) (the analysis reads them); otherwise the fused kernel runs."""
        n, t, d = x.shape
        # Unbinding the stacked axis in place (not after a permute) makes the backward one stack straight into
        # qkv's (N, T, 3, H, hd) layout, where a permute first would cost an extra copy of the qkv gradient.
        qkv = self.qkv(x).reshape(n, t, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(2)  # unpacked, not iterated: an fx trace knows the length of an unpacking only
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # each (N, H, T, hd)
        if num_queries is not None:
            q = q[:, :, :num_queries]
        scale = 1.0 / math.sqrt(self.head_dim)
        bias = self.rel(q * scale, t, 0) if self.rel is not None else None
        dropout = self.attn_dropout if self.training else 0.0
        if weights_out is not None:
            logits = (q * scale) @ k.transpose(-2, -1)  # (N, H, Tq, T)
            if bias is not None:
                logits = logits + bias
            weights = logits.softmax(dim=-1)
            weights_out.append(weights)
            out = F.dropout(weights, dropout, self.training) @ v
        else:
            out = attend(q, k, v, bias, dropout, self.attention_form)
        out = out.transpose(1, 2).reshape(n, q.shape[2], d)  # (N, Tq, D)
        return self.proj(out)


class Mlp(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.act = nn.GELU(approximate="tanh" if cfg.gelu == "tanh" else "none")
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LayerScale(nn.Module):
    """A learned per-channel scale of a residual branch (Touvron et al. 2021; timm's `init_values`, DINOv2)."""

    def __init__(self, width: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm encoder block: z' = MSA(LN(z)) + z ; z = MLP(LN(z')) + z'. With stochastic depth each branch
    is dropped per sample with probability `drop_path` in training; with layer scale each is scaled first."""

    def __init__(self, cfg: ViTConfig, num_tokens: int, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.ln_eps)
        self.attn = Attention(cfg, num_tokens)
        self.drop = nn.Dropout(cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.ln_eps)
        self.mlp = Mlp(cfg)
        self.drop_path = DropPath(drop_path) if drop_path else nn.Identity()
        scaled = cfg.layer_scale is not None
        self.ls1 = LayerScale(cfg.width, cfg.layer_scale) if scaled else nn.Identity()
        self.ls2 = LayerScale(cfg.width, cfg.layer_scale) if scaled else nn.Identity()

    def forward(
        self, x: torch.Tensor, num_queries: int | None = None, weights_out: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """(N, T, D) -> (N, Tq, D): the outputs of the first `num_queries` tokens (all by default); `weights_out`
        collects the attention weights (Attention.forward)."""
        y = self.attn(self.norm1(x), num_queries, weights_out)
        if num_queries is not None:
            x = x[:, :num_queries]
        x = x + self.drop_path(self.ls1(self.drop(y)))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class VisionTransformer(ViTTimmMixin, nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        cfg = self.config = config
        self.stem = ResNetStem(cfg.resnet, cfg.in_chans) if cfg.resnet is not None else None
        embed_in = self.stem.out_channels if self.stem is not None else cfg.in_chans
        self.patch_embed = PatchEmbed(cfg.patch_size, embed_in, cfg.width)
        gh, gw = self.native_grid = cfg.grid_size()
        prefix, pos_prefix = cfg.num_prefix_tokens, cfg.pos_prefix_tokens
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width)) if cfg.has_class_token else None
        # Registers start near zero, as timm initialises them (normal, std 1e-6).
        self.reg_token = nn.Parameter(torch.randn(1, cfg.reg_tokens, cfg.width) * 1e-6) if cfg.reg_tokens else None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, pos_prefix + gh * gw, cfg.width) * 0.02)
        elif cfg.pos_embed == "2d":  # X and Y tables of width D/2, concatenated per patch
            self.pos_embed_x = nn.Parameter(torch.randn(1, gw, cfg.width // 2) * 0.02)
            self.pos_embed_y = nn.Parameter(torch.randn(1, gh, cfg.width // 2) * 0.02)
            self.pos_embed_cls = nn.Parameter(torch.randn(1, pos_prefix, cfg.width) * 0.02) if pos_prefix else None
        self.pos_drop = nn.Dropout(cfg.dropout)
        rates = drop_path_rates(cfg.drop_path_rate, cfg.depth)
        self.blocks = nn.ModuleList(Block(cfg, prefix + gh * gw, rate) for rate in rates)
        # timm's dynamic_img_size: inputs of another size than cfg.image_size are refused unless this is set
        self.dynamic_img_size = False
        self.grad_checkpointing = False  # set_grad_checkpointing(): blocks recomputed in the backward
        # fc_norm (timm's default for average pooling): the LayerNorm moves from the tokens to the pooled vector
        self.norm = nn.Identity() if cfg.fc_norm else nn.LayerNorm(cfg.width, eps=cfg.ln_eps)
        self.fc_norm = nn.LayerNorm(cfg.width, eps=cfg.ln_eps) if cfg.fc_norm else None
        rep = cfg.representation_size
        self.pre_logits = nn.Sequential(nn.Linear(cfg.width, rep), nn.Tanh()) if rep else None
        self.num_features = rep or cfg.width
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self._pos_cache: dict[tuple, torch.Tensor] = {}
        init_weights(self)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """timm's tensor names load as well as vitlab's (the hybrid stem's `patch_embed.backbone.*`, old
        `pre_logits.fc.*`), renamed by vitlab's timm reader's own map: so that timm's `load_checkpoint(model, path)`
        and `model.load_state_dict(timm_model.state_dict())` work on vitlab's model. Children load after this
        call, from the renamed dict."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            new = prefix + vitlab_key(key[len(prefix) :])
            if new != key and new not in state_dict:
                state_dict[new] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # --- embedding -------------------------------------------------------------------------------------
    def position_embedding(self, grid: tuple[int, int]) -> torch.Tensor | None:
        """(1, T, D) for this grid; resampled copies are cached while gradients are off (inference)."""
        cfg = self.config
        if cfg.pos_embed in ("none", "relative"):
            return None
        key = None
        if not torch.is_grad_enabled() and not is_symbolic(grid[0]) and grid != self.native_grid:
            params = self.parameters_of_pos()
            # _version moves on every in-place update (optimizer step, load_state_dict), data_ptr on .to()
            key = (grid, *((p.data_ptr(), p._version, p.dtype) for p in params))
            if key in self._pos_cache:
                return self._pos_cache[key]
        if cfg.pos_embed == "learned":
            pos = resample_pos_embed(self.pos_embed, grid, self.native_grid, cfg.pos_prefix_tokens)
        else:
            pos = self._pos_embed_2d(grid)
        if key is not None:
            self._pos_cache = {key: pos}  # one size at a time: the common case is a fixed eval size
        return pos

    def parameters_of_pos(self) -> list[nn.Parameter]:
        names = ("pos_embed", "pos_embed_x", "pos_embed_y", "pos_embed_cls")  # (registers have no position)
        return [p for p in (getattr(self, n, None) for n in names) if isinstance(p, nn.Parameter)]

    def _pos_embed_2d(self, grid: tuple[int, int]) -> torch.Tensor:
        gh, gw = grid
        x_emb = resample_1d(self.pos_embed_x, gw)  # (1, gw, D/2)
        y_emb = resample_1d(self.pos_embed_y, gh)  # (1, gh, D/2)
        pos = torch.cat(
            [x_emb[:, None, :, :].expand(1, gh, gw, -1), y_emb[:, :, None, :].expand(1, gh, gw, -1)], dim=-1
        ).reshape(1, gh * gw, -1)  # (1, gh*gw, D): patch (r, c) gets [X_c ; Y_r]
        if self.pos_embed_cls is not None:
            pos = torch.cat([self.pos_embed_cls, pos], dim=1)
        return pos

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Pixels -> z0 = [x_class; patches·E] + E_pos, with dropout. (N, C, H, W) -> (N, T, D)."""
        return self.add_prefix_and_position(*self.embed_patches(x))

    def embed_patches(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Pixels -> patch embeddings x_p·E (after the ResNet stem for hybrids): (N, gh*gw, D), (gh, gw)."""
        check_pixels(x, self.config.in_chans, self.patch_embed.proj.weight)
        check_image_size(x, self.config.image_size, self.config.total_stride, self.dynamic_img_size)
        x = pad_to_stride(x, self.config.total_stride, self.config.dynamic_img_pad)
        if self.stem is not None:
            x = self.stem(x)
        return self.patch_embed(x), self.patch_embed.grid(x)

    def add_prefix_and_position(
        self, tokens: torch.Tensor, grid: tuple[int, int]
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """Patch embeddings -> z0: class token and registers prepended ([cls, reg…, patches]), position embedding
        added (before the prefix is prepended when it has no entries for it), dropout. Separate from
        `embed_patches` so that masked patch prediction can corrupt the patch embeddings in between."""
        prefix = [t.expand(tokens.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        pos = self.position_embedding(grid)
        if pos is not None and not self.config.pos_prefix_tokens:
            tokens = tokens + pos  # (N, gh*gw, D): a fresh, contiguous tensor
            pos = None
        if prefix:
            tokens = torch.cat([*prefix, tokens], dim=1)
        else:  # the conv's layout transposed: copy once, or every later op inherits (and re-copies) the strides
            tokens = tokens.contiguous()
        if pos is not None:
            tokens = tokens + pos
        return self.pos_drop(tokens), grid

    # --- public forward API  ------------------------------------------------------------------
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of storing its activations: a large model's training
        memory for about one extra forward, with the same gradients."""
        self.grad_checkpointing = bool(enable)

    def run_block(self, block: nn.Module, z: torch.Tensor, num_queries: int | None = None) -> torch.Tensor:
        """One block's output tokens, recomputed in the backward when gradient checkpointing is on."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, z, num_queries, use_reentrant=False)
        return block(z, num_queries)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens after the final LayerNorm: (N, T, D)."""
        z, _ = self.embed(x)
        for block in self.blocks:
            z = self.run_block(block, z)
        return self.norm(z)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool (class token, or the mean of the patch tokens), the LayerNorm after pooling where the model has
        one (fc_norm), then the representation layer; the classifier unless pre_logits."""
        cfg = self.config
        check_tokens(tokens, cfg.width)
        if self.unpooled:  # timm's global_pool "": no pooling; fc_norm (unless pruned) and the head on every token
            tokens = tokens if self.fc_norm is None else self.fc_norm(tokens)
            return tokens if pre_logits else self.head(tokens)
        pooled = tokens[:, 0] if cfg.classifier == "token" else tokens[:, cfg.num_prefix_tokens:].mean(dim=1)
        if self.fc_norm is not None:
            pooled = self.fc_norm(pooled)
        if self.pre_logits is not None:
            pooled = self.pre_logits(pooled)
        return pooled if pre_logits else self.head(pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) of images x, float (N, in_chans, H, W) normalised as `config.mean`/`config.std`
        say (`vitlab.transforms(model)` makes them); with num_classes=0, the representation (N, num_features). H, W
        are the model's input size (any multiple of the patch size with `dynamic_img_size=True`). Equal to
        `forward_head(forward_features(x))`, as in timm: every block and the final norm see every token."""
        return self.forward_head(self.forward_features(x))

    def forward_unobserved(self, x: torch.Tensor) -> torch.Tensor:
        """`forward`'s logits, computed as fast as they can be where nothing observes the insides (the inference
        session): the token classifier reads only token 0, and after the last attention no token mixes with
        another, so the last block computes queries, residual and MLP, and the final norm, for the class token
        alone. A hook or trace on the last block or the final norm would see (N, 1, D) here where `forward` gives
        every token, as timm does (BENCHMARKS.md, "The class-token-only last block")."""
        if self.config.classifier != "token" or self.unpooled:  # every token is read
            return self.forward_head(self.forward_features(x))
        z, _ = self.embed(x)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            z = self.run_block(block, z, num_queries=1 if i == last else None)
        return self.forward_head(self.norm(z))

    def forward_inspect(self, x: torch.Tensor, attention: bool = True) -> dict[str, object]:
        """Everything inside, for analysis, as a dict: "tokens" (L × (N, T, D), each block's output), "attention"
        (L × (N, H, T, T), softmax weights; explicit path), "embeddings" (z0), "features" (after the final
        norm), "grid" (gh, gw). With attention=False the fused attention kernel is used. (timm's
        `forward_intermediates`, for feature maps, is in timm_compat.py.)"""
        z, grid = self.embed(x)
        embeddings = z
        tokens: list[torch.Tensor] = []
        weights: list[torch.Tensor] | None = [] if attention else None
        for block in self.blocks:
            z = block(z, weights_out=weights)
            tokens.append(z)
        out: dict[str, object] = {"embeddings": embeddings, "tokens": tokens, "grid": grid}
        out["features"] = self.norm(z)
        if attention:
            out["attention"] = weights
        return out

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Fine-tuning rule (paper Section 3.2): drop the representation layer, attach a zero-initialised head
        (0 classes: none, `forward` returns the pooled representation). `global_pool` (timm's argument) changes
        the pooling: "avg" (the mean of the patch tokens; a class token, if any, stays in the sequence), "token"
        (needs a class token in the weights) or "" (none, as timm: the head acts on every token)."""
        changes = {"num_classes": num_classes, "representation_size": None}
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise ValueError(f"global_pool={global_pool!r}: vitlab pools with 'token' or 'avg' ('': no pooling)")
            if global_pool == "token" and not self.config.has_class_token:
                raise ValueError("global_pool='token' needs a class token, and these weights have none; use 'avg'")
            if global_pool and global_pool != ("token" if self.config.classifier == "token" else "avg"):
                changes.update(classifier="token" if global_pool == "token" else "gap",
                               class_token=self.config.has_class_token)
            self.unpooled = global_pool == ""
        self.pre_logits = None
        self.num_features = self.config.width
        self.head = zero_head(self.num_features, num_classes, self.patch_embed.proj.weight)
        self.config = self.config.replace(**changes)

    @torch.no_grad()
    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None) -> None:
        """timm's method: make `img_size` the native size (the position embedding resampled in place, the official
        way: bilinear, corners aligned, prefix entries kept; timm resamples bicubically) and/or `patch_size` the
        patch size (the patch-embedding kernel resampled by FlexiViT's pseudo-inverse, as timm does)."""
        cfg = self.config
        if patch_size is not None:
            if cfg.resnet is not None:
                raise ValueError("a hybrid's patch size applies to its ResNet feature map; it cannot be resampled")
            p = patch_size[0] if isinstance(patch_size, tuple | list) and len(set(patch_size)) == 1 else patch_size
            if isinstance(p, bool) or not isinstance(p, int) or p < 1:
                raise ValueError(f"patch_size must be a positive integer (square patches), got {patch_size!r}")
            size = img_size if img_size is not None else cfg.image_size
            new_cfg = cfg.replace(patch_size=p, image_size=size)  # checks the size is a multiple of the patch
            old = self.patch_embed.proj
            self.patch_embed = PatchEmbed(p, old.in_channels, cfg.width).to(old.weight.device, old.weight.dtype)
            self.patch_embed.proj.weight.copy_(resample_patch_kernel(old.weight, p))
            self.patch_embed.proj.bias.copy_(old.bias)
        else:
            new_cfg = cfg.replace(image_size=img_size) if img_size is not None else cfg
        old_grid, new_grid = self.native_grid, new_cfg.grid_size()
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(resample_pos_embed(self.pos_embed, new_grid, old_grid, cfg.pos_prefix_tokens))
        elif cfg.pos_embed == "2d":
            self.pos_embed_x = nn.Parameter(resample_1d(self.pos_embed_x, new_grid[1]))
            self.pos_embed_y = nn.Parameter(resample_1d(self.pos_embed_y, new_grid[0]))
        self.native_grid, self.config, self._pos_cache = new_grid, new_cfg, {}


def zero_head(in_features: int, num_classes: int, like: torch.Tensor) -> nn.Module:
    """A zero-initialised classifier on the device and dtype of `like` (the paper's fine-tuning head)."""
    if not is_int(num_classes) or not 0 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes must be an integer from 0 (no classifier) to {MAX_CLASSES:,}, "
                         f"got {num_classes!r}")
    if not num_classes:
        return nn.Identity()
    head = nn.Linear(in_features, num_classes, device=like.device, dtype=like.dtype)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def _xavier_per_projection(weight: torch.Tensor, parts: int) -> None:
    """Xavier-uniform as if q, k and v were separate D×D kernels, as in the official attention."""
    for chunk in weight.data.chunk(parts, dim=0):
        nn.init.xavier_uniform_(chunk)


# Standard deviation of a standard normal truncated to [-2, 2]: Flax's `variance_scaling(..., "truncated_normal")`
# divides by it so that the truncated samples have exactly the requested std.
TRUNCATED_STD = 0.87962566103423978


def lecun_normal_(weight: torch.Tensor) -> None:
    """Flax's default kernel initialiser (`lecun_normal`): a normal truncated at ±2 of its own σ, with
    σ = sqrt(1/fan_in) / TRUNCATED_STD, so that the samples' std is sqrt(1/fan_in). (torch's `trunc_normal_`
    takes absolute bounds: a=-2σ, b=2σ here, not its default ±2.)"""
    sigma = math.sqrt(1.0 / weight[0].numel()) / TRUNCATED_STD  # fan_in = in_features (· kernel area)
    nn.init.trunc_normal_(weight, std=sigma, a=-2.0 * sigma, b=2.0 * sigma)


@torch.no_grad()
def init_weights(model: VisionTransformer) -> None:
    """Official initialisers (vit_jax models_vit.py): encoder Dense kernels xavier-uniform (q, k, v per
    projection), MLP biases normal(1e-6), q/k/v/out biases zero; patch embedding and `pre_logits` LeCun-normal
    with zero bias; class token zeros (set in the constructor), position embedding normal(0.02) (likewise);
    head kernel and bias zero (training from scratch may set the bias, e.g. −10 for sigmoid pre-training)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            if name.endswith("attn.qkv"):
                _xavier_per_projection(m.weight, 3)
            else:
                nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                if name.endswith("attn.qkv") or name.endswith("attn.proj"):
                    nn.init.zeros_(m.bias)
                else:
                    nn.init.normal_(m.bias, std=1e-6)
    lecun_normal_(model.patch_embed.proj.weight)
    nn.init.zeros_(model.patch_embed.proj.bias)
    if model.pre_logits is not None:
        lecun_normal_(model.pre_logits[0].weight)
        nn.init.zeros_(model.pre_logits[0].bias)
    if isinstance(model.head, nn.Linear):
        nn.init.zeros_(model.head.weight)
        nn.init.zeros_(model.head.bias)

"""What timm users call on a model, on vitlab's ViTs, hybrids and BiTs: `pretrained_cfg` / `default_cfg` in timm's
keys (so that `timm.data.resolve_data_config(model=m)` + `create_transform` rebuild `vitlab.transforms(m)`),
`get_classifier`, `reset_classifier(num_classes, global_pool)`, `set_grad_checkpointing`, `feature_info` and
`forward_intermediates` with timm's signature and return. vitlab's own dict of tokens and attention weights is
`forward_inspect` (vit.py).

timm's transform vocabulary and vitlab's evaluation resizes (data/transforms.py):
- "official" (whole image to S×S) is crop_pct 1.0, crop_mode "squash": identical pixels.
- "big_vision" (short side to r = round(S·8/7), 448 for 384, then the central S×S) is crop_pct S/r, crop_mode
  "center": identical pixels for square sizes when the long side's r·long/short rounds down and its centre
  offset is whole or rounds down (500×375 at 224 and 384 does); timm truncates the long side and rounds the
  offset half to even where big_vision rounds the side and floors the offset, one pixel apart otherwise.
- "resize-short-crop" (one resampling of the fractional central box) has no timm equivalent: crop_pct 1.0,
  "center" resizes first and crops after, which matches only when the resize enlarges the image.
- "timm:INTERPOLATION:CROP_PCT[:squash]" (vitlab/constants.py timm_resize) is timm's transform itself, reported
  field for field: identical pixels (a model made by a timm name evaluates so, weights/timm_arch.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vitlab.constants import check_eval_resize, resize_before_crop, timm_resize
from vitlab.models.inputs import check_pixels
from vitlab.ranges import is_int

torch.fx.wrap("check_pixels")  # a torch.fx leaf: the trace runs the input check on the real tensor

# How closely timm's transforms reproduce each vitlab evaluation resize (the cfg's "vitlab_eval_resize_in_timm");
# a timm spelling is timm's own transform: "exact".
TIMM_EXACTNESS = {
    "official": "exact",
    "big_vision": "exact for square sizes unless the long side or the centre offset rounds up (one pixel apart)",
    "resize-short-crop": "approximate: timm resizes then crops, vitlab resamples the central box once",
    "fewshot": "exact",
}


def timm_eval_crop(image_size: tuple[int, int], eval_resize: str) -> dict[str, Any]:
    """timm's pretrained_cfg fields (interpolation, crop_pct, crop_mode, as timm.data.transforms_factory reads
    them) that describe vitlab's evaluation pre-processing `eval_resize` (vitlab/constants.py) at `image_size`.
    timm resizes to floor(S / crop_pct), then crops S: "squash" ignores the aspect ratio, "center" keeps it."""
    side = max(image_size)
    if (timm := timm_resize(check_eval_resize(eval_resize))) is not None:  # timm's transform: its fields as they are
        interpolation, crop_pct, crop_mode = timm
        return {"interpolation": interpolation, "crop_pct": crop_pct, "crop_mode": crop_mode}
    if eval_resize == "official":  # the whole image to S×S, aspect ignored (vit_jax input_pipeline)
        return {"interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash"}
    if eval_resize == "resize-short-crop":
        return {"interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center"}
    resized = resize_before_crop(side)
    mode = "center" if eval_resize == "big_vision" else "squash"  # few-shot: resize(r) ignoring the aspect
    return {"interpolation": "bilinear", "crop_pct": crop_pct_for(side, resized), "crop_mode": mode}


def crop_pct_for(side: int, resized: int) -> float:
    """The shortest crop_pct with floor(side / crop_pct) == resized (224/256 = 0.875 exactly; 384/448 needs
    4 digits, 32/37 five): timm floors, so a rounded ratio can land one pixel short."""
    for digits in range(3, 9):
        pct = round(side / resized, digits)
        if math.floor(side / pct) == resized:
            return pct
    return side / (resized + 0.5)


def eval_resize_of(model: nn.Module) -> str:
    """How a model is evaluated: the resize its vitlab run recorded, else its publisher's (catalogue), else
    "official" (the whole image resized, as the official code evaluates)."""
    published = (getattr(model, "hub_entry", None) or {}).get("eval_resize")
    return getattr(model, "eval_resize", None) or published or "official"


def feature_take_indices(num_features: int, indices: int | list[int] | tuple[int, ...] | None) -> tuple[list[int], int]:
    """timm's rule: None -> all, an int n -> the last n, a sequence -> those (negative from the end). Returns the
    absolute indices and the largest; ValueError for indices out of range."""
    if indices is None:
        indices = num_features
    if not (is_int(indices) or isinstance(indices, list | tuple | range) and all(is_int(i) for i in indices)):
        raise TypeError(f"indices must be an integer (the last n) or a list of integers, got {indices!r}")
    if is_int(indices):
        indices = int(indices)
        if not 0 < indices <= num_features:
            raise ValueError(f"last-n indices={indices} is out of range: use 1 to {num_features}")
        take = list(range(num_features - indices, num_features))
    else:
        take = [num_features + i if i < 0 else i for i in indices]
        bad = [i for i, t in zip(indices, take, strict=True) if not 0 <= t < num_features]
        if bad or not take:
            raise ValueError(f"feature indices {list(indices)} out of range: use 0 to {num_features - 1} (or negative)")
    return take, max(take)


class FeatureInfo(list):
    """timm's feature_info: a list of dicts (num_chs, reduction, module) with its accessor methods."""

    def channels(self) -> list[int]:
        return [f["num_chs"] for f in self]

    def reduction(self) -> list[int]:
        return [f["reduction"] for f in self]

    def module_name(self) -> list[str]:
        return [f["module"] for f in self]


# Parameters timm's ViTs exclude from weight decay by name, and timm's ordinal "joins the group before it".
TIMM_NO_DECAY = ("pos_embed", "cls_token", "reg_token", "dist_token")
MATCH_PREVIOUS = 99999


class TimmCompatMixin:
    """Shared by ViT and BiT; the class sets `config` and `head`."""

    _first_conv = "patch_embed.proj"
    _pretrained_cfg_overlay: dict[str, Any] | None = None
    # timm's cfg flag read by its test helpers: a ViT's inputs must be a multiple of its patch size, a CNN's not
    _fixed_input_size = False

    @property
    def _pool_size(self) -> tuple[int, int] | None:
        """timm's cfg `pool_size`: the final feature map's (h, w) at the native input size; None for tokens."""
        return None

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's data config of this model, derived from its config and its evaluation resize."""
        cfg = self.config
        resize = eval_resize_of(self)
        out = {
            "architecture": cfg.name, "input_size": (cfg.in_chans, *cfg.image_size),
            "fixed_input_size": self._fixed_input_size, "pool_size": self._pool_size,
            **timm_eval_crop(cfg.image_size, resize), "mean": tuple(cfg.mean), "std": tuple(cfg.std),
            "num_classes": cfg.num_classes, "first_conv": self._first_conv, "classifier": "head",
            "vitlab_eval_resize": resize, "vitlab_eval_resize_in_timm": TIMM_EXACTNESS.get(resize, "exact"),
        }  # fmt: skip
        return {**out, **(self._pretrained_cfg_overlay or {})}

    @pretrained_cfg.setter
    def pretrained_cfg(self, value: dict[str, Any]) -> None:  # timm assigns it; kept as an overlay
        self._pretrained_cfg_overlay = dict(value)

    @property
    def default_cfg(self) -> dict[str, Any]:  # timm's older name
        return self.pretrained_cfg

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def head_hidden_size(self) -> int:
        """timm's: the width of what the classifier reads (`forward_head(x, pre_logits=True)`)."""
        return self.num_features

    def get_classifier(self) -> nn.Module:
        return self.head

    def __prepare_scriptable__(self) -> Any:
        # torch.jit.script calls this first: one clear line instead of TorchScript's opaque AttributeError
        raise RuntimeError("vitlab models are not TorchScript-scriptable; use torch.jit.trace(model, x), "
                           "torch.export.export(model, (x,)) or vitlab's ONNX export instead")


class ViTTimmMixin(TimmCompatMixin):
    # timm's attribute names for what the config says
    _fixed_input_size = True
    # timm's global_pool "" (prune_intermediate_layers(prune_head=True), reset_classifier(n, "")): forward_head
    # returns the tokens as they come, a head acting on each; no config describes it, so vitlab.save refuses it
    unpooled = False

    @property
    def global_pool(self) -> str:
        if self.unpooled:
            return ""
        return "token" if self.config.classifier == "token" else "avg"

    @property
    def embed_dim(self) -> int:
        return self.config.width

    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_prefix_tokens

    @property
    def has_class_token(self) -> bool:
        return self.config.has_class_token

    @property
    def no_embed_class(self) -> bool:
        return not self.config.pos_embed_prefix

    @property
    def dynamic_img_pad(self) -> bool:
        return self.config.dynamic_img_pad

    @property
    def _first_conv(self) -> str:  # type: ignore[override]
        return "stem.conv" if self.config.resnet is not None else "patch_embed.proj"

    @property
    def feature_info(self) -> FeatureInfo:
        """One entry per block: its tokens as a (N, D, gh, gw) map at the effective patch size's reduction."""
        width, stride = self.config.width, self.config.total_stride
        return FeatureInfo(dict(num_chs=width, reduction=stride, module=f"blocks.{i}") for i in range(len(self.blocks)))

    def no_weight_decay(self) -> set[str]:
        """Embeddings timm's optimizer factory must not decay (it decays every other tensor of 2 or more
        dimensions): the tokens and position embeddings timm names, and vitlab's own position tables, so that its
        groups are vitlab's own (train/optim.py: weight decay on kernels only)."""
        own = {name for name, _ in self.named_parameters() if name.startswith("pos_embed")
               or name.endswith("attn.rel.embed")}
        return own | set(TIMM_NO_DECAY)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups (layer-wise learning-rate decay reads them): the embeddings (tokens, position,
        patch projection, a hybrid's ResNet stem) first, one group per block, the final norm with the last block;
        what matches nothing (fc_norm, representation layer, head) comes last. `coarse` changes nothing for a
        ViT, as in timm."""
        return {"stem": r"^(?:cls_token|reg_token|dist_token|pos_embed|patch_embed\.|stem\.)",
                "blocks": [(r"^blocks\.(\d+)\.", None), (r"^norm\.", (MATCH_PREVIOUS,))]}

    def forward_intermediates(
        self, x: torch.Tensor, indices: int | list[int] | None = None, return_prefix_tokens: bool = False,
        norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
        output_dict: bool = False,
    ) -> Any:
        """timm's ViT.forward_intermediates: the outputs of the blocks `indices` (None: all, n: the last n, a list:
        those), prefix tokens removed, as (N, D, gh, gw) maps ("NCHW") or (N, gh·gw, D) tokens ("NLC"); `norm`
        applies the final LayerNorm to each. Returns (final normed tokens, intermediates), the intermediates
        alone, or timm's dict with output_dict."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}: use 'NCHW' (feature maps) or 'NLC' (tokens)")
        take, max_index = feature_take_indices(len(self.blocks), indices)
        z, (gh, gw) = self.embed(x)
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        inter = []
        for i, block in enumerate(blocks):
            z = self.run_block(block, z)
            if i in take:
                inter.append(self.norm(z) if norm else z)
        prefix = self.config.num_prefix_tokens
        prefix_tokens = [y[:, :prefix] for y in inter] if prefix else None
        inter = [y[:, prefix:] for y in inter]  # (N, gh·gw, D)
        if output_fmt == "NCHW":
            inter = [y.reshape(y.shape[0], gh, gw, -1).permute(0, 3, 1, 2).contiguous() for y in inter]
        if output_dict:
            out: dict[str, Any] = {"image_intermediates": inter}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(z)
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            inter = list(zip(inter, prefix_tokens, strict=True))
        return inter if intermediates_only else (self.norm(z), inter)

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's: drop the blocks after the last index taken (and the final norm if asked). Pruning the head is
        timm's too: fc_norm, the representation layer and the classifier go, and nothing pools (global_pool ""), so
        `forward` returns the (N, T, D) tokens. The config follows the depth, so that `vitlab.save` writes a file
        `load` rebuilds with prune_head=False; a pruned head or final norm has no config field, and `save` refuses
        that model."""
        take, max_index = feature_take_indices(len(self.blocks), indices)
        cfg, depth = self.config, len(self.blocks)
        self.blocks = self.blocks[: max_index + 1]
        # the kept blocks' stochastic-depth rates, rate·i/(depth-1), are the new config's rate'·i/max_index
        rate = cfg.drop_path_rate * max_index / (depth - 1) if depth > 1 else cfg.drop_path_rate
        changes = {"depth": max_index + 1, "drop_path_rate": rate}
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:  # the LayerNorm after pooling goes with the head, as timm prunes
            self.fc_norm, self.pre_logits, self.head = None, None, nn.Identity()
            self.num_features, self.unpooled = cfg.width, True
            changes.update(num_classes=0, representation_size=None)
        self.config = cfg.replace(**changes)
        return take


class BiTTimmMixin(TimmCompatMixin):
    _first_conv = "stem.conv"

    @property
    def _pool_size(self) -> tuple[int, int]:  # type: ignore[override]
        h, w = self.config.image_size
        return -(-h // 32), -(-w // 32)  # stride 32, each stage's padding rounding up
    # timm's global_pool "" (prune_intermediate_layers(prune_head=True), reset_classifier(n, "")): forward_head
    # returns the (N, C, H, W) map, a head acting at each position; no config describes it, so vitlab.save refuses it
    unpooled = False

    @property
    def global_pool(self) -> str:
        return "" if self.unpooled else "avg"

    @property
    def feature_info(self) -> FeatureInfo:
        """timm's resnetv2 features: the root conv (reduction 2, before the max-pool), then each stage. They are
        the config's, so pruning keeps them (as timm keeps its feature_info) and indices name the same features."""
        cfg = self.config
        info = [dict(num_chs=cfg.root_width, reduction=2, module="stem.conv")]
        for i in range(len(cfg.layers)):
            info.append(dict(num_chs=4 * cfg.root_width * 2**i, reduction=4 * 2**i, module=f"stages.{i}"))
        return FeatureInfo(info)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's ResNetV2 layer groups (layer-wise learning-rate decay reads them): the root conv first, then one
        group per unit, the final norm with the last unit; the head, matching nothing, comes last. `coarse`: one
        group per stage, the final norm with the head, as timm."""
        if coarse:
            return {"stem": r"^stem\.", "blocks": r"^stages\.(\d+)\."}
        return {"stem": r"^stem\.", "blocks": [(r"^stages\.(\d+)\.(\d+)\.", None), (r"^norm\.", (MATCH_PREVIOUS,))]}

    def forward_intermediates(
        self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False, stop_early: bool = False,
        output_fmt: str = "NCHW", intermediates_only: bool = False,
    ) -> Any:
        """timm's ResNetV2.forward_intermediates: feature 0 is the root conv's output, 1… the stages'; `norm`
        applies the final GroupNorm + ReLU to the last stage's. Returns (final features, intermediates) or the
        intermediates alone. Indices count the features of the model as built (feature_info), pruned or not."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt={output_fmt!r}: a CNN's features are maps, use 'NCHW'")
        last = len(self.stages)
        take, max_index = feature_take_indices(len(self.feature_info), indices)
        check_pixels(x, self.config.in_chans, self.stem.conv.weight)
        x = self.stem.conv(x)  # (N, 64·wf, H/2, W/2)
        inter = [x] if 0 in take else []
        x = self.stem_pool(x)
        stages = self.stages[:max_index] if stop_early else self.stages
        reached = 0
        for reached, stage in enumerate(stages, start=1):
            x = self.run_stage(stage, x)
            if reached in take:
                inter.append(self.final_norm(x) if norm and reached == last else x)
        if intermediates_only:
            return inter
        return (self.final_norm(x) if reached == last else x), inter

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's ResNetV2 rule: drop the stages after the last feature taken (feature 0 alone: the max-pool
        too, which feeds the stages). The final GroupNorm + ReLU goes when asked or when the last stage goes (it
        is sized for that stage), and the head when asked or when any stage goes; without a head nothing pools
        (global_pool ""), so `forward` returns the (N, C, H, W) map. The config keeps the stages it was built
        with, so feature_info and the indices stay timm's; `vitlab.save` refuses a pruned model (it no longer
        pools, or lacks its final norm)."""
        take, max_index = feature_take_indices(len(self.feature_info), indices)
        cut = max_index < len(self.stages)
        if prune_norm or cut:
            self.norm = nn.Identity()
        self.stages = self.stages[:max_index]
        if cut:
            self.num_features = self.feature_info[max_index]["num_chs"]
        if prune_head or cut:
            self.reset_classifier(0, "")
        return take


class FeatureExtractor(nn.Module):
    """`create_model(..., features_only=True)`: the model's `forward_intermediates` at `out_indices` as a list of
    (N, C, H, W) maps, with the blocks after the last one (and the head) removed, as timm's FeatureGetterNet."""

    def __init__(self, model: nn.Module, out_indices: int | list[int] | tuple[int, ...], norm: bool = False):
        super().__init__()
        indices = list(out_indices) if isinstance(out_indices, (list, tuple)) else out_indices
        take, max_index = feature_take_indices(len(model.feature_info), indices)
        self.feature_info = FeatureInfo(model.feature_info[i] for i in take)
        self.out_indices, self.norm = take, norm  # absolute: "the last n" would move once layers are removed
        if norm and not hasattr(model, "blocks") and max_index < len(model.stages):
            raise ValueError("norm=True applies BiT's final GroupNorm, which needs the last stage in out_indices")
        model.prune_intermediate_layers(take, prune_norm=not norm)  # later blocks or stages, the head, unused norms
        self.model = model

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model.forward_intermediates(x, indices=self.out_indices, norm=self.norm, intermediates_only=True)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.model.set_grad_checkpointing(enable)

    @property
    def pretrained_cfg(self) -> dict[str, Any]:  # timm.data.resolve_data_config(model=backbone) works too
        return self.model.pretrained_cfg

    @property
    def default_cfg(self) -> dict[str, Any]:
        return self.model.pretrained_cfg

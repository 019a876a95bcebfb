"""timm model names and constructor options -> vitlab configs (timm's vision_transformer.py and
vision_transformer_hybrid.py define what each name builds). timm options that change the computation in a way
vitlab cannot represent are WeightsErrors naming the option, never a silently different model.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from vitlab.constants import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, OFFICIAL_MEAN, OFFICIAL_STD
from vitlab.errors import WeightsError
from vitlab.models.config import ResNetConfig, ViTConfig
from vitlab.models.registry import VIT_SIZES, model_config, vitlab_name
from vitlab.models.timm_compat import crop_pct_for, timm_eval_crop  # noqa: F401  (re-exported: timm.py, timm_bit.py)
from vitlab.weights.tensors import units_per_stage

TIMM_SIZES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}
# Resolutions timm registers a plain name for, per (size, patch): "vit_base_patch16_384" exists, "…_512" does not.
PLAIN_RESOLUTIONS = {
    ("Ti", 16): (224, 384), ("S", 8): (224,), ("S", 16): (224, 384), ("S", 32): (224, 384), ("B", 8): (224,),
    ("B", 16): (224, 384), ("B", 32): (224, 384), ("L", 14): (224,), ("L", 16): (224, 384), ("L", 32): (224, 384),
    ("H", 14): (224,),
}  # fmt: skip
# timm's GAP models (class_token=False, global_pool="avg", fc_norm=False), by (size, patch).
GAP_NAMES = {("B", 16): "vit_base_patch16_gap_224", ("H", 14): "vit_huge_patch14_gap_224",
             ("H", 16): "vit_huge_patch16_gap_448"}  # fmt: skip
# timm hybrid name stem -> (vitlab hybrid, registered resolutions); timm's vision_transformer_hybrid.py.
HYBRID_NAMES = {
    "vit_tiny_r_s16_p8": ("R+ViT-Ti/16", (224, 384)), "vit_small_r26_s32": ("R26+ViT-S/32", (224, 384)),
    "vit_base_r26_s32": ("R26+ViT-B/32", (224,)), "vit_base_r50_s16": ("R50+ViT-B/16", (224, 384)),
    "vit_large_r50_s32": ("R50+ViT-L/32", (224, 384)),
}  # fmt: skip
# timm definitions that differ from the size table (vit_base_patch16_gap_224 really has 16 heads).
NAME_OVERRIDES = {"vit_base_patch16_gap_224": {"num_heads": 16}, "vit_base_patch16_224_miil": {"qkv_bias": False}}
# timm's models with register tokens and/or layer scale that vitlab builds exactly (Darcet et al. 2024 "Vision
# Transformers Need Registers"; DINOv2), as timm's vision_transformer.py defines them: name -> (patch, width, depth,
# heads, mlp_ratio, resolution, options). The gated-MLP (giant), RoPE and attention-pool ('map') ones are not here.
_REG_GAP = {"class_token": False, "no_embed_class": True, "reg_tokens": 4, "global_pool": "avg", "init_values": 1e-5}
_SO150M = {"class_token": False, "reg_tokens": 4, "global_pool": "avg", "fc_norm": False}
_DINOV2 = {"init_values": 1e-5}
LAYER_SCALE_NAMES: dict[str, tuple[int, int, int, int, float, int, dict[str, Any]]] = {
    "vit_base_patch16_reg4_gap_256": (16, 768, 12, 12, 4.0, 256, {**_REG_GAP, "init_values": None}),
    "vit_medium_patch16_reg4_gap_256": (16, 512, 12, 8, 4.0, 256, _REG_GAP),
    "vit_mediumd_patch16_reg4_gap_256": (16, 512, 20, 8, 4.0, 256, _REG_GAP),
    "vit_mediumd_patch16_reg4_gap_384": (16, 512, 20, 8, 4.0, 384, _REG_GAP),
    "vit_betwixt_patch16_reg4_gap_256": (16, 640, 12, 10, 4.0, 256, _REG_GAP),
    "vit_betwixt_patch16_reg4_gap_384": (16, 640, 12, 10, 4.0, 384, _REG_GAP),
    "vit_little_patch16_reg4_gap_256": (16, 320, 14, 5, 5.6, 256, _REG_GAP),
    "vit_so150m_patch16_reg4_gap_256": (16, 896, 18, 14, 2.572, 256, _SO150M),
    "vit_so150m_patch16_reg4_gap_384": (16, 896, 18, 14, 2.572, 384, _SO150M),
    "vit_small_patch14_reg4_dinov2": (14, 384, 12, 6, 4.0, 518, {**_DINOV2, "reg_tokens": 4, "no_embed_class": True}),
    "vit_base_patch14_reg4_dinov2": (14, 768, 12, 12, 4.0, 518, {**_DINOV2, "reg_tokens": 4, "no_embed_class": True}),
    "vit_large_patch14_reg4_dinov2": (14, 1024, 24, 16, 4.0, 518, {**_DINOV2, "reg_tokens": 4, "no_embed_class": True}),
    "vit_small_patch14_dinov2": (14, 384, 12, 6, 4.0, 518, _DINOV2),
    "vit_base_patch14_dinov2": (14, 768, 12, 12, 4.0, 518, _DINOV2),
    "vit_large_patch14_dinov2": (14, 1024, 24, 16, 4.0, 518, _DINOV2),
}  # fmt: skip
# timm's head size for a name without weights of its own (its pretrained cfg): DINOv2's are feature extractors.
DEFAULT_CLASSES = {name: 0 for name in LAYER_SCALE_NAMES if name.endswith("_dinov2")}
# Weights timm normalises with other statistics than Google's 0.5: by tag (DINO, MAE, BAMBOO) or by name prefix.
_TAG_NORMALISATION = {"dino": (IMAGENET_MEAN, IMAGENET_STD), "mae": (IMAGENET_MEAN, IMAGENET_STD),
                      "bamboo": (CLIP_MEAN, CLIP_STD)}  # fmt: skip
# timm's evaluation of BiT weights by tag (resnetv2_*_bit): (eval resize, input size); "": a tag not listed.
_TIMM_BIT_TAGS = {
    "": ("timm:bicubic:0.875", 224), "goog_distilled_in1k": ("timm:bicubic:0.875", 224),
    "goog_teacher_in21k_ft_in1k": ("timm:bicubic:0.875", 224), "goog_in21k": ("timm:bilinear:0.875", 224),
    "goog_in21k_ft_in1k": ("timm:bilinear:1.0", 448), "goog_teacher_in21k_ft_in1k_384": ("timm:bicubic:1.0", 384),
}  # fmt: skip
_TIMM_BIT_SIZES = {"resnetv2_152x4_bit.goog_in21k_ft_in1k": 480}  # the one BiT fine-tuned at another size
_TIMM_WHOLE_IMAGE_TAGS = ("bamboo",)  # ViT weights timm evaluates on the whole resized image at 224 px
HEADS_BY_WIDTH = {width: heads for _, width, _, heads in VIT_SIZES.values()}
_PLAIN_NAME = re.compile(r"^vit_(tiny|small|base|large|huge)_patch(\d+)(_gap)?_(\d+)(_miil)?(_in21k)?$")
_DEIT_NAME = re.compile(r"^deit_(tiny|small|base)_patch16_(224|384)$")  # DeiT without distillation: a plain ViT
_HYBRID_NAME = re.compile(r"^(vit_[a-z0-9_]+?)_(224|384)(_in21k)?$")
USE_TIMM = "vitlab implements the paper's ViT only; use timm for this model"

# timm options vitlab cannot represent: option -> (is it switched on?, what it does).
_UNSUPPORTED_OPTIONS: dict[str, tuple[Any, str]] = {
    "qk_norm": (bool, "LayerNorm on queries and keys"),
    "dynamic_img_pad": (bool, "padding inputs to a multiple of the patch size"),
    "pre_norm": (bool, "a LayerNorm before the blocks"),
    "final_norm": (lambda v: not v, "no final LayerNorm"),
    "proj_bias": (lambda v: not v, "projections without bias"),
    "scale_attn_norm": (bool, "a LayerNorm inside attention"),
    "scale_mlp_norm": (bool, "a LayerNorm inside the MLP"),
    "norm_layer": (lambda v: v not in (None, "layernorm"), "another norm layer"),
    "act_layer": (lambda v: v not in (None, "gelu", "gelu_tanh"), "an activation other than GELU"),
    "pos_embed": (lambda v: v not in ("learn", "", "none"), "another position embedding"),
    "global_pool": (lambda v: v not in ("token", "avg"), "pooling other than 'token' or 'avg'"),
    **{k: (lambda v: v is not None, "a custom layer") for k in
       ("embed_norm_layer", "mlp_layer", "block_fn", "attn_layer", "embed_layer")},
}  # fmt: skip
_MODEL_OPTIONS = {"img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio",
                  "qkv_bias", "class_token", "fc_norm", "reg_tokens", "no_embed_class", "init_values"}  # fmt: skip
# Training-time or runtime-only options: they do not change the computation at the native input size.
_HARMLESS_OPTIONS = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                     "drop_path_rate", "weight_init", "fix_init", "dynamic_img_size",
                     "pool_include_prefix"}  # fmt: skip


def timm_name_options(name: str, source: str | Path = "arch") -> dict[str, Any]:
    """timm's constructor options for a model name (a ".tag" is ignored) as timm defines it, plus "_resnet" for
    hybrids and "_img_size", the name's resolution (used only when the file does not tell)."""
    base = name.split(".", 1)[0]
    hybrid, plain = _HYBRID_NAME.match(base), _PLAIN_NAME.match(base) or _DEIT_NAME.match(base)
    if base in LAYER_SCALE_NAMES:
        patch, width, depth, heads, ratio, res, extra = LAYER_SCALE_NAMES[base]
        return {"_img_size": res, "patch_size": patch, "embed_dim": width, "depth": depth, "num_heads": heads,
                "mlp_ratio": ratio, **extra}
    if hybrid and hybrid.group(1) in HYBRID_NAMES:
        cfg = model_config(HYBRID_NAMES[hybrid.group(1)][0])
        opts: dict[str, Any] = {"_resnet": cfg.resnet, "_img_size": int(hybrid.group(2))}
    elif plain:
        if plain.re is _PLAIN_NAME:
            size, patch, gap, res = plain.group(1, 2, 3, 4)
        else:  # deit_{size}_patch16_{res}
            size, patch, gap, res = plain.group(1), "16", None, plain.group(2)
        cfg = model_config(f"ViT-{TIMM_SIZES[size]}/{patch}")
        opts = {"_img_size": int(res), "class_token": not gap, "global_pool": "avg" if gap else "token"}
        opts.update({"fc_norm": False} if gap else {})
    else:
        raise WeightsError(
            source,
            f"unknown timm architecture {name!r}",
            "vitlab reads timm's vit_{tiny,small,base,large,huge}_patch{P}[_gap]_{res}, the hybrids "
            + ", ".join(HYBRID_NAMES) + " and the register / layer-scale models " + ", ".join(LAYER_SCALE_NAMES),
        )
    opts.update(patch_size=cfg.patch_size, embed_dim=cfg.width, depth=cfg.depth, num_heads=cfg.num_heads,
                mlp_ratio=cfg.mlp_dim / cfg.width)  # fmt: skip
    opts.update(NAME_OVERRIDES.get(base, {}))
    return opts


def _arch_and_tag(name: str) -> tuple[str, str]:
    """("ARCH", "TAG") of a timm name; a bare ARCH takes its default tag in the catalogue ("" when it has none)."""
    from vitlab.hub.catalogue import timm_name

    arch, _, tag = name.partition(".")
    if not tag:
        known = timm_name(arch)
        tag = (known.tag if known else None) or ""
    return arch, tag


def timm_normalisation(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std timm's pretrained cfg gives the weights of a timm name ("ARCH.TAG"; a bare "ARCH" is its
    default tag): ImageNet's for DeiT, DINOv2, DINO and MAE, CLIP's for BAMBOO, 0.5 for Google's (augreg, orig,
    sam) and the others. A model of a timm name normalises as its weights were trained, however it was made."""
    arch, tag = _arch_and_tag(name)
    if arch.startswith("deit_") or arch.endswith("_dinov2"):
        return IMAGENET_MEAN, IMAGENET_STD
    return _TAG_NORMALISATION.get(tag, (OFFICIAL_MEAN, OFFICIAL_STD))


def timm_preprocessing(name: str) -> tuple[str, int]:
    """(eval resize, input size) timm's pretrained cfg gives the weights of a timm name ("ARCH.TAG"; a bare "ARCH" is
    its default tag), in the timm spelling of data/transforms.py: a model of a timm name evaluates as its weights
    were evaluated, however it was made. ViTs and DeiTs: bicubic, the central 0.9 of the resized image at 224 px,
    0.95 at 256 (the base register model 0.9), all of it from 384 px on; BiT's depend on the tag (_TIMM_BIT_TAGS)."""
    arch, tag = _arch_and_tag(name)
    if arch.startswith("resnetv2_"):
        resize, size = _TIMM_BIT_TAGS.get(tag, _TIMM_BIT_TAGS[""])
        return resize, _TIMM_BIT_SIZES.get(f"{arch}.{tag}", size)
    size = timm_name_options(arch)["_img_size"]
    if tag in _TIMM_WHOLE_IMAGE_TAGS or size >= 384:
        return "timm:bicubic:1.0", size
    crop_pct = 0.95 if size == 256 and arch != "vit_base_patch16_reg4_gap_256" else 0.9
    return f"timm:bicubic:{crop_pct}", size


def infer_timm_options(tensors: dict[str, torch.Tensor], path: str | Path, num_heads: int | None = None
                       ) -> dict[str, Any]:
    """A plain or BiT-hybrid timm ViT's options from tensor shapes alone; heads, unless given, from the standard
    width table."""
    proj = tensors.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4:
        raise WeightsError(path, "no 4-D tensor 'patch_embed.proj.weight'", "not a timm ViT state dict")
    width, _, ph, pw = proj.shape  # (D, C, P, P)
    if ph != pw:
        raise WeightsError(path, f"non-square patches {ph}x{pw} ('patch_embed.proj.weight')", USE_TIMM)
    blocks = [int(m.group(1)) for k in tensors if (m := re.match(r"blocks\.(\d+)\.", k))]
    if not blocks:
        raise WeightsError(path, "no transformer blocks ('blocks.0.…')", "not a timm ViT state dict")
    if num_heads is None and width not in HEADS_BY_WIDTH:
        raise WeightsError(
            path, f"cannot tell the number of heads of width {width} from the tensors",
            "pass arch=<timm model name>, or read a hub folder whose config.json has model_args.num_heads",
        )  # fmt: skip
    fc1 = tensors.get("blocks.0.mlp.fc1.weight")
    has_cls, reg = "cls_token" in tensors, tensors.get("reg_token")
    opts = {
        "patch_size": ph, "embed_dim": width, "depth": max(blocks) + 1,
        "num_heads": num_heads or HEADS_BY_WIDTH[width],
        "_mlp_dim": fc1.shape[0] if fc1 is not None else 4 * width, "class_token": has_cls,
        "global_pool": "token" if has_cls else "avg", "fc_norm": "fc_norm.weight" in tensors,
        "qkv_bias": "blocks.0.attn.qkv.bias" in tensors, "pos_embed": "learn" if "pos_embed" in tensors else "none",
        "reg_tokens": reg.shape[1] if reg is not None and reg.ndim == 3 else 0,
        # the value is an initialisation only: the file's gammas replace it
        "init_values": 1e-5 if "blocks.0.ls1.gamma" in tensors else None,
    }  # fmt: skip
    resnet = _infer_resnet(tensors, path)
    return {**opts, "_resnet": resnet} if resnet else opts


def _infer_resnet(tensors: dict[str, torch.Tensor], path: str | Path) -> ResNetConfig | None:
    """timm's BiT stem: root conv (64·wf channels) and bottleneck units counted per stage."""
    root = tensors.get("patch_embed.backbone.stem.conv.weight", tensors.get("patch_embed.backbone.conv.weight"))
    if root is None:
        return None
    units = units_per_stage(tensors, r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", first=0)
    if sorted(units) != list(range(len(units))):
        raise WeightsError(path, f"hybrid stem stages {sorted(units)} are not numbered 0..n-1", "the file is corrupt")
    return ResNetConfig(layers=tuple(units[s] for s in range(len(units))), width_factor=max(root.shape[0] // 64, 1))


def check_timm_options(opts: dict[str, Any], path: str | Path) -> None:
    """WeightsError naming the first timm option that vitlab cannot represent or does not know."""
    for key, value in opts.items():
        if key.startswith("_") or key in _MODEL_OPTIONS or key in _HARMLESS_OPTIONS:
            continue
        if key not in _UNSUPPORTED_OPTIONS:
            raise WeightsError(path, f"unknown timm option {key}={value!r}", "vitlab cannot tell what it changes")
        switched_on, what = _UNSUPPORTED_OPTIONS[key]
        if switched_on(value):
            raise WeightsError(path, f"timm option {key}={value!r} ({what}) has no vitlab equivalent", USE_TIMM)
    pool, cls = opts.get("global_pool", "token"), opts.get("class_token", True)
    if pool == "token" and not cls:
        raise WeightsError(path, "timm option global_pool='token' without a class token", "the file is inconsistent")


def config_from_timm_options(opts: dict[str, Any], path: str | Path, mean: Any = None, std: Any = None) -> ViTConfig:
    """The vitlab config for complete timm options (img_size, num_classes, … all present)."""
    check_timm_options(opts, path)
    width, patch, pool = opts["embed_dim"], opts["patch_size"], opts.get("global_pool", "token")
    if not isinstance(patch, int):
        patch = patch[0] if patch[0] == patch[1] else -1
    try:
        config = ViTConfig(
            image_size=opts["img_size"], patch_size=patch, width=width, depth=opts["depth"],
            mlp_dim=opts.get("_mlp_dim") or int(width * opts.get("mlp_ratio", 4.0)), num_heads=opts["num_heads"],
            num_classes=opts["num_classes"],
            classifier="token" if pool == "token" else "gap", class_token=bool(opts.get("class_token", True)),
            reg_tokens=int(opts.get("reg_tokens") or 0), pos_embed_prefix=not opts.get("no_embed_class", False),
            # timm's default: a LayerNorm after pooling exactly when the pooling is "avg"
            fc_norm=bool(pool == "avg" if opts.get("fc_norm") is None else opts["fc_norm"]),
            layer_scale=opts.get("init_values"),
            representation_size=opts.get("_representation_size"),
            pos_embed="learned" if opts.get("pos_embed", "learn") == "learn" else "none",
            gelu="tanh" if opts.get("act_layer") == "gelu_tanh" else "exact", ln_eps=1e-6,
            qkv_bias=bool(opts.get("qkv_bias", True)), in_chans=opts.get("in_chans", 3), resnet=opts.get("_resnet"),
            mean=tuple(mean or OFFICIAL_MEAN), std=tuple(std or OFFICIAL_STD),
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise WeightsError(path, f"invalid architecture ({e})", "check the timm options and the tensors") from None
    return config.replace(name=vitlab_name(config))


def complete_from_tensors(opts: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """What a timm name leaves open, from the tensors: class count, channels, representation layer, image size."""
    opts = dict(opts)
    head, pre = tensors.get("head.weight"), tensors.get("pre_logits.fc.weight")
    opts.setdefault("num_classes", head.shape[0] if head is not None else 0)
    if pre is not None:
        opts["_representation_size"] = pre.shape[0]
    first = next((tensors[k] for k in ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.conv.weight",
                                       "patch_embed.proj.weight") if k in tensors), None)  # fmt: skip
    if first is not None and first.ndim == 4:
        opts.setdefault("in_chans", first.shape[1])
    if "img_size" not in opts:
        opts["img_size"] = _image_size(opts, tensors.get("pos_embed"), "cls_token" in tensors, path)
    return opts


def _image_size(opts: dict[str, Any], pos_embed: torch.Tensor | None, has_cls: bool, path: Path) -> int:
    """Native input size from the position embedding: prefix + grid², times the effective patch size."""
    if pos_embed is None or pos_embed.ndim != 3:
        return opts.get("_img_size", 224)
    resnet, patch = opts.get("_resnet"), opts["patch_size"]
    stride = (patch if isinstance(patch, int) else patch[0]) * (resnet.reduction if resnet else 1)
    # (1, prefix + gh*gw, D), or (1, gh*gw, D) where the prefix tokens have no entry (timm's no_embed_class, told
    # by the name or the folder, else read from the shape); a file without class token read under a class-token
    # name has no prefix entry, and the key check then reports the missing 'cls_token' rather than a confusing size
    n = pos_embed.shape[1]
    prefix = (1 if opts.get("class_token", True) and has_cls else 0) + int(opts.get("reg_tokens") or 0)
    declared = opts.get("no_embed_class")
    for entries in ([0 if declared else prefix] if declared is not None else [prefix, 0]):
        side = math.isqrt(max(n - entries, 0))
        if side > 0 and side * side == n - entries:
            if prefix and not entries:
                opts["no_embed_class"] = True
            return side * stride
    raise WeightsError(
        path, f"'pos_embed' has {n} entries, not {prefix} prefix + a square grid",
        "for non-square inputs read a hub folder whose config.json has model_args.img_size",
    )  # fmt: skip


def timm_config(name: str, **options: Any) -> ViTConfig:
    """The vitlab config of a timm model name at its own resolution, with timm's head size and normalisation for
    it; `options` are timm constructor arguments (img_size=64, num_classes=10, …) as timm.create_model takes them."""
    base = name.split(".", 1)[0]
    opts = {"num_classes": DEFAULT_CLASSES.get(base, 1000), "in_chans": 3, **timm_name_options(name), **options}
    opts.setdefault("img_size", opts["_img_size"])
    return config_from_timm_options(opts, f"timm:{name}", *timm_normalisation(name))

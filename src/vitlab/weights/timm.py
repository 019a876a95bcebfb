"""timm's VisionTransformer weights, both ways: hub folders, bare state dicts, timm model names. timm's BiT
ResNetV2s (resnetv2_*_bit) go through the same two entry points, read_timm and write_timm (timm_bit.py).

Plain ViTs already use timm's key names; only the hybrid ResNet stem and old `pre_logits.fc` files need a key map.
timm builds ViTs with exact GELU and LayerNorm eps 1e-6. Its hybrid stem uses GroupNorm eps 1e-5 and weight
standardisation (w - mean) / sqrt(var + 1e-8) where the official code (and vitlab) uses 1e-6 and
(w - mean) / (std + 1e-5): same weights, slightly different outputs. timm's hybrid weights were converted from the
official ones, so vitlab's numerics are the ones they were trained with.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from vitlab.constants import timm_resize_name
from vitlab.errors import WeightsError
from vitlab.files.outputs import atomic_write, mark, mark_zip
from vitlab.models.config import BiTConfig, ModelConfig, ViTConfig
from vitlab.models.registry import HYBRIDS, VIT_SIZES
from vitlab.models.timm_compat import eval_resize_of
from vitlab.models.timm_keys import timm_key, vitlab_key
from vitlab.weights.card import CARD, model_card
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import (
    PICKLE_SUFFIXES,
    CheckpointRead,
    read_checkpoint,
    read_json,
    read_weights_folder,
    write_folder_atomically,
)
from vitlab.weights.timm_arch import (
    GAP_NAMES,
    HYBRID_NAMES,
    PLAIN_RESOLUTIONS,
    TIMM_SIZES,
    USE_TIMM,
    complete_from_tensors,
    config_from_timm_options,
    infer_timm_options,
    timm_config,
    timm_eval_crop,
    timm_name_options,
    timm_normalisation,
    timm_preprocessing,
)
from vitlab.weights.timm_bit import is_timm_bit, read_timm_bit, timm_bit_hub_config, to_timm_bit_state_dict
from vitlab.weights.validate import check_against, expected_shapes

__all__ = ["read_timm", "read_timm_module", "timm_config", "timm_model_args", "timm_model_name", "to_timm_state_dict",
           "write_timm"]

HUB_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "README.md")
HYBRID_NOTE = (
    "timm's hybrid stem uses GroupNorm eps 1e-5 and weight-standardisation eps 1e-8 on the variance; vitlab uses "
    "the official 1e-6 and 1e-5 on the std, so outputs differ slightly from timm's (the weights are the same)"
)

# Tensors of timm features vitlab cannot represent: key pattern -> what it is.
_UNSUPPORTED_TENSORS = [
    (r"\.attn\.[qk]_norm\.", "qk_norm"),
    (r"^norm_pre\.", "pre_norm (LayerNorm before the blocks)"), (r"^attn_pool\.", "attention pooling ('map')"),
    (r"^(dist_token|head_dist\.)", "a distillation token (DeiT)"), (r"^patch_embed\.norm\.", "embed_norm_layer"),
    (r"\.(attn|mlp)\.norm\.", "scale_attn_norm / scale_mlp_norm"), (r"\.mlp\.(fc1_[gx]|w12)\.", "a gated MLP"),
    (r"^patch_embed\.backbone\.(conv1|layer\d|stem\.conv1|\d)", "a backbone other than BiT's ResNet"),
]  # fmt: skip
def reject_unsupported_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    for key in tensors:
        for pattern, what in _UNSUPPORTED_TENSORS:
            if re.search(pattern, key):
                raise WeightsError(path, f"timm feature {what} has no vitlab equivalent (tensor {key!r})", USE_TIMM)


# --- reading -------------------------------------------------------------------------------------------------
def read_timm(path: str | Path, arch: str | None = None, use_ema: bool = False) -> WeightsRecord:
    """A timm hub folder (config.json + model.safetensors or pytorch_model.bin), a bare state dict
    (.safetensors/.pth/.bin) or a training checkpoint (timm's train.py `model_best.pth.tar`, a Lightning `.ckpt`:
    `training_hub` reads what it says of the model). `arch` (a timm model name) overrides the architecture the
    folder or checkpoint names; without either the architecture is inferred from the tensor shapes. `use_ema`: a
    training checkpoint's EMA weights (timm's use_ema)."""
    path = Path(path)
    hub: dict[str, Any] = {}
    if path.is_dir():
        if use_ema:
            raise WeightsError(path, "holds no EMA weights (a timm hub folder is one set of weights)",
                               "leave out use_ema / --use-ema")
        hub = _hub_config(path / "config.json")
        file, tensors = read_weights_folder(path, ("model.safetensors", "pytorch_model.bin"))
        named_by = file if arch else path / "config.json"
        return _timm_record(tensors, hub, arch or hub.get("architecture"), path, file, named_by)
    read = read_checkpoint(path, use_ema)
    hub = training_hub(read.entries)
    record = _timm_record(read.tensors, hub, arch or hub.get("architecture"), path, path, path)
    if read.entries or read.has_ema:
        record.meta["checkpoint"] = _checkpoint_summary(read, use_ema)
    return record


def training_hub(entries: dict[str, Any]) -> dict[str, Any]:
    """What a training checkpoint's settings say of its model, in the shape of timm's config.json: timm's train.py
    stores its command line as `args` (an argparse.Namespace): the model name (when vitlab knows it: the tensors
    decide otherwise), class count, `gp` pooling, `in_chans`, `model_kwargs`, and the mean/std it trained with.
    {} for a checkpoint without them (Lightning's: the tensors alone tell the architecture)."""
    args = entries.get("args")
    args = vars(args) if isinstance(args, argparse.Namespace) else args
    if not isinstance(args, dict):
        return {}
    name = args.get("model") if isinstance(args.get("model"), str) else None
    if name is not None:
        try:
            timm_name_options(name)
        except WeightsError:
            name = None  # a model vitlab has no timm name for (a vitlab name): read from the tensors
    model_args = dict(args["model_kwargs"]) if isinstance(args.get("model_kwargs"), dict) else {}
    for key, arg in (("global_pool", "gp"), ("in_chans", "in_chans")):
        if args.get(arg) not in (None, ""):
            model_args[key] = args[arg]
    hub: dict[str, Any] = {"architecture": name, "model_args": model_args,
                           "pretrained_cfg": {k: list(args[k]) for k in ("mean", "std")
                                              if isinstance(args.get(k), list | tuple)}}  # fmt: skip
    if isinstance(args.get("num_classes"), int):
        hub["num_classes"] = args["num_classes"]
    return hub


def _checkpoint_summary(read: CheckpointRead, use_ema: bool) -> dict[str, Any]:
    """What `vitlab info` says of a training checkpoint: its epoch and metric, and which of its weights were read."""
    summary = {k: read.entries[k] for k in ("epoch", "metric") if isinstance(read.entries.get(k), int | float)}
    summary["weights"] = "EMA" if use_ema else "trained" + (" (EMA weights too: use_ema / --use-ema)"
                                                             if read.has_ema else "")
    return summary


def read_timm_module(model: nn.Module) -> WeightsRecord:
    """A timm model object's weights (`vitlab.fit(init=model)`): read as its state dict is, with what the tensors do
    not tell (heads, image size, pooling, activation) taken from the module, and its normalisation from its
    pretrained_cfg. WeightsError, as for a file, for a timm feature vitlab cannot represent."""
    where = Path(f"<timm {type(model).__name__} object>")
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    pcfg = dict(getattr(model, "pretrained_cfg", None) or {})
    args: dict[str, Any] = {}
    blocks = getattr(model, "blocks", None)
    if blocks is not None and len(blocks):
        args["num_heads"] = int(blocks[0].attn.num_heads)
        if getattr(getattr(blocks[0].mlp, "act", None), "approximate", "none") == "tanh":
            args["act_layer"] = "gelu_tanh"
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None:
        args["img_size"] = int(img_size[0]) if img_size[0] == img_size[1] else tuple(img_size)
    for key in ("global_pool", "no_embed_class", "dynamic_img_size"):
        if isinstance(getattr(model, key, None), str | bool):
            args[key] = getattr(model, key)
    if hasattr(model, "cls_token"):
        args["class_token"] = model.cls_token is not None
    hub = {"architecture": None, "model_args": args, "num_classes": getattr(model, "num_classes", None),
           "pretrained_cfg": {k: pcfg[k] for k in ("mean", "std") if pcfg.get(k)}}
    name = pcfg.get("architecture") if is_timm_bit(pcfg.get("architecture"), tensors) else None
    return _timm_record(tensors, hub, name, where, where, where)


def _timm_record(tensors: dict[str, torch.Tensor], hub: dict[str, Any], name: str | None, path: Path, file: Path,
                 named_by: Path) -> WeightsRecord:
    """timm tensors as vitlab weights: `hub` (config.json's content, or {}), `name` (a timm model name or None:
    inferred from the tensors); the paths name the source in errors."""
    if is_timm_bit(name, tensors):  # BiT's ResNetV2 (resnetv2_*_bit), not a ViT
        config, state = read_timm_bit(tensors, hub, name, file, named_by)
        return WeightsRecord(config, state, source="timm", meta=_meta(name, hub, config))
    reject_unsupported_tensors(tensors, file)
    declared = path / "config.json" if hub and path.is_dir() else file  # where the architecture is declared
    args = hub.get("model_args") or {}
    if not isinstance(args, dict):
        raise WeightsError(declared, "'model_args' is not an object", "the config is corrupt")
    opts = timm_name_options(name, named_by) if name else infer_timm_options(tensors, file, args.get("num_heads"))
    opts.update(args)
    if isinstance(hub.get("num_classes"), int):
        opts["num_classes"] = hub["num_classes"]
    opts = complete_from_tensors(opts, tensors, file)
    pcfg = hub.get("pretrained_cfg") or {}
    mean, std = timm_normalisation(name) if name else (None, None)  # the file's own, else timm's for the name
    config = config_from_timm_options(opts, declared, pcfg.get("mean") or mean,
                                      pcfg.get("std") or std)  # fmt: skip
    # A timm name fixes a listed architecture (its tensor check names it); model_args or inference from the
    # tensors are the file's own declarations, bounded by its tensor count.
    count = None if name and not args else len(tensors)
    expected = {timm_key(k, config): shape for k, shape in expected_shapes(config, declared, count).items()}
    arch_text = f"{name or 'the inferred ' + (config.name or 'ViT')} at {config.image_size[0]}x{config.image_size[1]}"
    check_against(file, expected, tensors, arch_text)
    state = {vitlab_key(k): v for k, v in tensors.items()}
    return WeightsRecord(config, state, source="timm", meta=_meta(name, hub, config))


def _hub_config(path: Path) -> dict[str, Any]:
    """timm's config.json; the legacy single-dict layout (no "pretrained_cfg") is split as timm does."""
    cfg = read_json(path)
    if "pretrained_cfg" not in cfg:
        cfg = {"architecture": cfg.get("architecture"), "num_classes": cfg.get("num_classes"),
               "label_names": cfg.get("label_names", cfg.get("labels")), "pretrained_cfg": cfg}  # fmt: skip
    if not isinstance(cfg.get("architecture"), str):
        raise WeightsError(path, "no 'architecture' (not a timm config.json)", "pass the folder save_for_hf wrote")
    for key in ("pretrained_cfg", "model_args"):  # read with .get further on
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise WeightsError(path, f"'{key}' is a JSON {type(cfg[key]).__name__}, not an object",
                               "the config is corrupt")
    return cfg


def _meta(name: str | None, hub: dict[str, Any], config: ModelConfig) -> dict[str, Any]:
    meta: dict[str, Any] = {"timm_name": name} if name else {}
    pcfg = hub.get("pretrained_cfg") or {}
    labels = hub.get("label_names") or pcfg.get("label_names")
    if isinstance(labels, dict):  # {index: name} when the indices have gaps
        labels = [labels.get(str(i), labels.get(i)) for i in range(config.num_classes)]
    if isinstance(labels, list) and len(labels) == config.num_classes and all(isinstance(x, str) for x in labels):
        meta["class_names"] = labels
    notes = [] if "mean" in pcfg or name else ["input normalisation not in the file: assumed mean = std = 0.5"]
    if resize := _eval_resize(name, pcfg, notes):
        meta["eval_resize"] = resize
    if getattr(config, "resnet", None) is not None:
        notes.append(HYBRID_NOTE)
    if (hub.get("model_args") or {}).get("dynamic_img_size") is True:  # timm's model takes any size: so does vitlab's
        meta["dynamic_img_size"] = True
    return {**meta, "notes": notes} if notes else meta


def _eval_resize(name: str | None, pcfg: dict[str, Any], notes: list[str]) -> str | None:
    """How the weights are evaluated: the file's own pretrained cfg (interpolation, crop_pct, crop_mode) in the
    timm spelling (data/transforms.py), else timm's for the name; None for weights that say neither (a bare state
    dict of an inferred architecture: vitlab's default)."""
    fields = (pcfg.get("interpolation"), pcfg.get("crop_pct"), pcfg.get("crop_mode") or "center")
    if fields[0] is not None and fields[1] is not None:
        try:
            return timm_resize_name(*fields)
        except (ValueError, TypeError):
            notes.append(f"timm pre-processing interpolation={fields[0]!r}, crop_pct={fields[1]!r}, crop_mode="
                         f"{fields[2]!r} has no vitlab equivalent: " + ("timm's for the name used" if name else
                                                                         "vitlab's default used"))
    return timm_preprocessing(name)[0] if name else None


# --- writing -------------------------------------------------------------------------------------------------
def check_timm_representable(config: ModelConfig, where: str | Path = "model") -> None:
    """WeightsError for vitlab architectures timm's VisionTransformer cannot build."""
    if not isinstance(config, ViTConfig):
        raise WeightsError(where, "a BiT ResNet classifier has no timm ViT equivalent",
                           "write_timm exports it as timm's resnetv2_*_bit")  # fmt: skip
    problem = ""
    if config.pos_embed in ("2d", "relative"):
        problem = f"pos_embed={config.pos_embed!r}"
    elif config.ln_eps != 1e-6:
        problem = f"ln_eps={config.ln_eps} (timm's ViTs use 1e-6)"
    elif config.representation_size:
        problem = f"a representation layer (pre_logits, {config.representation_size} wide)"
    elif int(config.width * (config.mlp_dim / config.width)) != config.mlp_dim:  # timm: int(dim * mlp_ratio)
        problem = f"MLP width {config.mlp_dim} (timm computes int(width * mlp_ratio), which rounds it down)"
    elif config.resnet is not None and _hybrid_stem(config) is None:
        problem = f"a ResNet stem with layers={config.resnet.layers}, width_factor={config.resnet.width_factor}"
    if problem:
        raise WeightsError(where, f"timm's VisionTransformer has no equivalent of {problem}",
                           "export to vitlab's own format (or HF/npz where they fit) instead")  # fmt: skip


def _timm_size(config: ViTConfig) -> str | None:
    """timm's size word by width, as timm itself names a model whose depth or heads were overridden."""
    return next((t for t, s in TIMM_SIZES.items() if VIT_SIZES[s][1] == config.width), None)


def _hybrid_stem(config: ViTConfig) -> str | None:
    """timm's hybrid name stem for a vitlab hybrid: ResNet, patch size and width must match (depth and heads
    may differ, the model options carry them)."""
    if config.resnet is None or config.resnet.width_factor != 1:
        return None  # timm's hybrids all use width factor 1
    for stem, (hybrid, _) in HYBRID_NAMES.items():
        size, layers, patch = HYBRIDS[hybrid]
        if (config.resnet.layers, config.patch_size, config.width) == (layers, patch, VIT_SIZES[size][1]):
            return stem
    return None


def timm_model_name(config: ViTConfig) -> str:
    """The registered timm name closest to the architecture (timm's own name when there is one);
    `timm_model_args` gives the arguments that make it exact (image size, classes, width, depth, heads, patch,
    pooling), as timm's own save_for_hf records them: timm's ViT constructors take every one as an override, so
    a width or patch size timm registers no name for (vitlab's demo models) still loads."""
    check_timm_representable(config)
    h, w = config.image_size
    if config.resnet is not None:
        stem = _hybrid_stem(config)
        sizes = HYBRID_NAMES[stem][1]
        return f"{stem}_{h if h == w and h in sizes else sizes[0]}"
    size = _timm_size(config) or min(TIMM_SIZES, key=lambda t: abs(VIT_SIZES[TIMM_SIZES[t]][1] - config.width))
    patch = config.patch_size
    if (TIMM_SIZES[size], patch) not in PLAIN_RESOLUTIONS:  # the args' patch_size replaces the name's
        patch = min(p for s, p in PLAIN_RESOLUTIONS if s == TIMM_SIZES[size])
    key = (TIMM_SIZES[size], patch)
    gap = GAP_NAMES.get(key)
    if config.classifier == "gap" and gap and patch == config.patch_size and config.width == VIT_SIZES[key[0]][1] \
            and timm_name_options(gap)["num_heads"] == config.num_heads:
        return gap
    sizes = PLAIN_RESOLUTIONS[key]
    return f"vit_{size}_patch{patch}_{h if h == w and h in sizes else sizes[0]}"


def timm_model_args(config: ViTConfig) -> dict[str, Any]:
    """Keyword arguments for timm.create_model(timm_model_name(config), **args) (or timm's VisionTransformer for
    a plain ViT) that build exactly this architecture."""
    check_timm_representable(config)
    gap = config.classifier == "gap"
    args: dict[str, Any] = {
        "img_size": list(config.image_size), "patch_size": config.patch_size, "in_chans": config.in_chans,
        "num_classes": config.num_classes, "embed_dim": config.width, "depth": config.depth,
        "num_heads": config.num_heads, "mlp_ratio": config.mlp_dim / config.width, "qkv_bias": config.qkv_bias,
        "class_token": config.has_class_token, "global_pool": "avg" if gap else "token",
    }  # fmt: skip
    if gap or config.fc_norm:
        args["fc_norm"] = config.fc_norm  # the paper's GAP: final LayerNorm, then the mean (fc_norm=False)
    if config.reg_tokens:
        args["reg_tokens"] = config.reg_tokens
    if not config.pos_embed_prefix:
        args["no_embed_class"] = True
    if config.layer_scale is not None:
        args["init_values"] = config.layer_scale
    if config.gelu == "tanh":
        args["act_layer"] = "gelu_tanh"
    if config.pos_embed == "none":
        args["pos_embed"] = "none"
    return args


def to_timm_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under timm's names (shared with the model, not copied)."""
    config = model.config
    check_timm_representable(config)
    return {timm_key(k, config): v.detach() for k, v in model.state_dict().items()}


def timm_hub_config(
    config: ViTConfig, class_names: list[str] | None = None, eval_resize: str = "official"
) -> dict[str, Any]:
    """timm's config.json for this architecture, as save_for_hf writes it; the pre-processing fields say what
    vitlab evaluates with (bilinear, `eval_resize` as timm's crop_pct/crop_mode)."""
    args = timm_model_args(config)
    first_conv = timm_key("stem.conv.weight" if config.resnet else "patch_embed.proj.weight", config)[: -len(".weight")]
    hub: dict[str, Any] = {
        "architecture": timm_model_name(config), "num_classes": config.num_classes, "num_features": config.width,
        "global_pool": args["global_pool"], "model_args": args,
        "pretrained_cfg": {
            "input_size": [config.in_chans, *config.image_size], "fixed_input_size": True,
            **timm_eval_crop(config.image_size, eval_resize), "mean": list(config.mean),
            "std": list(config.std), "num_classes": config.num_classes, "first_conv": first_conv,
            "classifier": "head",
        },
    }  # fmt: skip
    if class_names:
        hub["label_names"] = list(class_names)
    return hub


def write_timm(model: nn.Module, path: str | Path, source: str | Path | None = None) -> None:
    """A path ending in .safetensors/.pth/.bin gets a bare timm state dict; any other path a timm hub folder
    (config.json + model.safetensors + a model card README.md naming `source`, the file converted) that
    timm.create_model("local-dir:<path>", pretrained=True) loads, at any size (config.json's model_args).
    Written atomically; an existing folder is replaced only if it holds nothing but an earlier export."""
    path = Path(path)
    folder = path.suffix != ".safetensors" and path.suffix not in PICKLE_SUFFIXES
    names = getattr(model, "class_names", None)
    resize = eval_resize_of(model)
    if isinstance(model.config, BiTConfig):  # BiT's ResNetV2: timm's resnetv2_*_bit
        hub = timm_bit_hub_config(model.config, names, path, resize) if folder else {}
        state = to_timm_bit_state_dict(model)
    else:
        check_timm_representable(model.config, path)
        state, hub = to_timm_state_dict(model), timm_hub_config(model.config, names, resize) if folder else {}
    tensors = {k: v.to("cpu").contiguous() for k, v in state.items()}

    def save(p: str | Path) -> None:
        save_file(tensors, str(p), metadata={"format": "pt", **mark()})  # timm/HF mark safetensors as PyTorch's

    if path.suffix == ".safetensors":
        atomic_write(path, save)
    elif path.suffix in PICKLE_SUFFIXES:
        atomic_write(path, lambda p: (torch.save(tensors, p), mark_zip(p)))  # torch.load ignores the comment
    else:

        card = model_card(model, "timm", path, source)

        def write(folder: Path) -> None:
            (folder / "config.json").write_text(json.dumps(hub, indent=2) + "\n", encoding="utf-8")
            (folder / CARD).write_text(card, encoding="utf-8")
            save(folder / "model.safetensors")

        write_folder_atomically(path, write, owned=HUB_FILES)

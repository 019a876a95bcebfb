"""timm's BiT ResNetV2 weights (`resnetv2_{50x1,50x3,101x1,101x3,152x2,152x4}_bit*`), both ways.

timm's model is big_transfer's (its weights were converted from the released BiT `.npz` files) under other names,
with a 1×1-convolution head and a weight-standardisation eps of 1e-8 where big_transfer uses 1e-10. A model read
from timm keeps ws_eps=1e-8, so its outputs equal timm's; a model written to timm is computed there with 1e-8,
which moves its outputs by about 1e-8 / var(w) relative (nothing for trained or initialised weights).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.constants import OFFICIAL_MEAN, OFFICIAL_STD
from vitlab.errors import WeightsError
from vitlab.models.config import BiTConfig
from vitlab.models.registry import RESNET_DEPTHS
from vitlab.models.timm_keys import bit_timm_key, bit_vitlab_key
from vitlab.weights.tensors import units_per_stage
from vitlab.weights.timm_arch import timm_eval_crop, timm_preprocessing
from vitlab.weights.validate import check_against, expected_shapes

__all__ = ["TIMM_BITS", "is_timm_bit", "read_timm_bit", "timm_bit_hub_config", "to_timm_bit_state_dict"]

TIMM_WS_EPS = 1e-8
# The BiT models timm registers: name -> (depth, width factor).
TIMM_BITS = {f"resnetv2_{d}x{w}_bit": (d, w) for d, w in
             (("50", 1), ("50", 3), ("101", 1), ("101", 3), ("152", 2), ("152", 4))}  # fmt: skip
# Today's names and timm < 0.9's (resnetv2_50x1_bitm_in21k, resnetv2_152x2_bit_teacher_384, …); ".tag" stripped.
_NAME = re.compile(r"^resnetv2_(\d+)x(\d+)_bit(?:m|m_in21k|_distilled|_teacher|_teacher_384)?$")
_READ_NAMES = "resnetv2_{" + ",".join(n[len("resnetv2_") : -len("_bit")] for n in TIMM_BITS) + "}_bit"
# timm ResNetV2 options and the value BiT has; any other value is another architecture.
_BIT_OPTIONS: dict[str, Any] = {"global_pool": "avg", "output_stride": 32, "stem_type": "fixed", "preact": True,
                                "basic": False, "bottle_ratio": 0.25, "avg_down": False}  # fmt: skip
_HARMLESS_OPTIONS = {"drop_rate", "drop_path_rate", "zero_init_last"}  # training-time only
_MODEL_OPTIONS = {"layers", "width_factor", "num_classes", "in_chans"}


def is_timm_bit(name: str | None, tensors: dict[str, torch.Tensor]) -> bool:
    """A timm ResNetV2 by its name, or (no name) by its top-level root conv: timm's ViTs have none."""
    if name:
        return name.split(".", 1)[0].startswith("resnetv2_")
    return "stem.conv.weight" in tensors


# --- reading -------------------------------------------------------------------------------------------------
def read_timm_bit(
    tensors: dict[str, torch.Tensor], hub: dict[str, Any], name: str | None, file: Path, named_by: Path
) -> tuple[BiTConfig, dict[str, torch.Tensor]]:
    """Config and vitlab-named state dict of a timm BiT; the architecture from `name` (a timm name, from arch= or
    the hub folder's config.json) or, without one, from the tensors. `file` is named in tensor errors."""
    if any(re.match(r"stages\.\d+\.\d+\.", k) for k in tensors):  # torch.save(bit.state_dict()): vitlab's names
        tensors = {bit_timm_key(k): _conv_head(k, v) for k, v in tensors.items()}
    opts = _name_options(name, named_by) if name else _infer_options(tensors, file)
    args = hub.get("model_args") or {}
    if not isinstance(args, dict):
        raise WeightsError(named_by, "'model_args' is not an object", "the config is corrupt")
    opts.update(args)
    if isinstance(hub.get("num_classes"), int):
        opts["num_classes"] = hub["num_classes"]
    _check_options(opts, named_by)
    head, root = tensors.get("head.fc.weight"), tensors.get("stem.conv.weight")
    opts.setdefault("num_classes", head.shape[0] if head is not None else 0)
    opts.setdefault("in_chans", root.shape[1] if root is not None and root.ndim == 4 else 3)
    pcfg = hub.get("pretrained_cfg") or {}
    config = _config(opts, pcfg, named_by if hub else file, timm_preprocessing(name)[1] if name else 224)
    expected = {bit_timm_key(k): (*s, 1, 1) if k == "head.weight" else s
                for k, s in expected_shapes(config, named_by if hub else file,
                                            None if name and not args else len(tensors)).items()}  # fmt: skip
    size = f"{config.image_size[0]}x{config.image_size[1]}"
    check_against(file, expected, tensors, f"{name or 'the inferred ' + (config.name or 'BiT')} at {size}")
    state = {bit_vitlab_key(k): v.flatten(1) if k == "head.fc.weight" else v for k, v in tensors.items()}
    return config, state


def _conv_head(key: str, value: torch.Tensor) -> torch.Tensor:
    return value[:, :, None, None] if key == "head.weight" and value.ndim == 2 else value


def _name_options(name: str, source: Path) -> dict[str, Any]:
    m = _NAME.match(name.split(".", 1)[0])
    if m is None or m.group(1) not in RESNET_DEPTHS or int(m.group(2)) < 1:
        raise WeightsError(source, f"unknown timm architecture {name!r}",
                           f"vitlab reads timm's BiT models {_READ_NAMES} (ResNetV2 without '_bit' is not BiT)")
    return {"layers": RESNET_DEPTHS[m.group(1)], "width_factor": int(m.group(2))}


def _infer_options(tensors: dict[str, torch.Tensor], file: Path) -> dict[str, Any]:
    """Depth from the units counted per stage, width from the root conv (64·wf filters)."""
    root = tensors.get("stem.conv.weight")
    if root is None or root.ndim != 4:
        raise WeightsError(file, "no 4-D tensor 'stem.conv.weight'", "not a timm BiT state dict")
    if root.shape[0] % 64:
        raise WeightsError(file, f"root conv 'stem.conv.weight' has {root.shape[0]} filters, not a multiple of 64",
                           "not a BiT ResNetV2 (BiT's root has 64·width-factor filters)")  # fmt: skip
    units = units_per_stage(tensors, r"stages\.(\d+)\.blocks\.(\d+)\.", first=0)
    if not units:
        raise WeightsError(file, "no ResNetV2 units ('stages.0.blocks.0.…')", "not a timm BiT state dict")
    if sorted(units) != list(range(len(units))):
        raise WeightsError(file, f"ResNetV2 stages {sorted(units)} are not numbered 0..n-1", "the file is corrupt")
    return {"layers": tuple(units[s] for s in range(len(units))), "width_factor": root.shape[0] // 64}


def _check_options(opts: dict[str, Any], source: Path) -> None:
    for key, value in opts.items():
        if key in _MODEL_OPTIONS or key in _HARMLESS_OPTIONS:
            continue
        if key not in _BIT_OPTIONS:
            raise WeightsError(source, f"unknown timm option {key}={value!r}", "vitlab cannot tell what it changes")
        if value != _BIT_OPTIONS[key]:
            raise WeightsError(source, f"timm option {key}={value!r} makes another ResNetV2 than BiT's "
                                       f"({key}={_BIT_OPTIONS[key]!r})", "use timm for this model")  # fmt: skip


def _config(opts: dict[str, Any], pcfg: dict[str, Any], source: Path, default_size: int) -> BiTConfig:
    """The input size is the file's, else the one timm evaluates the name's weights at (`default_size`)."""
    size = pcfg.get("input_size")
    image_size = tuple(size[1:]) if isinstance(size, list | tuple) and len(size) == 3 else (default_size,) * 2
    layers, wf = tuple(opts["layers"]), opts["width_factor"]
    depth = next((d for d, units in RESNET_DEPTHS.items() if units == layers), None)
    try:
        return BiTConfig(
            layers=layers, width_factor=wf, image_size=image_size, num_classes=opts["num_classes"],
            in_chans=opts["in_chans"], ws_eps=TIMM_WS_EPS, mean=tuple(pcfg.get("mean") or OFFICIAL_MEAN),
            std=tuple(pcfg.get("std") or OFFICIAL_STD), name=f"BiT-R{depth}x{wf}" if depth else "",
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise WeightsError(source, f"invalid architecture ({e})", "check the timm options and the tensors") from None


# --- writing -------------------------------------------------------------------------------------------------
def to_timm_bit_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under timm's names, the head as timm's 1×1 convolution (views, not copies)."""
    return {bit_timm_key(k): _conv_head(k, v.detach()) for k, v in model.state_dict().items()}


def timm_bit_name(config: BiTConfig, where: str | Path = "model") -> str:
    """timm's registered name for the architecture; WeightsError if timm registers none."""
    name = next((n for n, (d, w) in TIMM_BITS.items()
                 if (RESNET_DEPTHS[d], w) == (config.layers, config.width_factor)), None)  # fmt: skip
    if name is None:
        raise WeightsError(
            where, f"timm registers no BiT with layers {config.layers} and width factor {config.width_factor} "
            f"(it has {_READ_NAMES})", "write a bare timm state dict (.safetensors) or vitlab's format instead",
        )  # fmt: skip
    return name


def timm_bit_hub_config(
    config: BiTConfig, class_names: list[str] | None, where: str | Path, eval_resize: str = "official"
) -> dict[str, Any]:
    """timm's config.json for this BiT, as timm's save_for_hf writes it; the pre-processing fields say what
    vitlab evaluates with (bilinear, `eval_resize` as timm's crop_pct/crop_mode; mean/std the weights')."""
    h, w = config.image_size
    hub: dict[str, Any] = {
        "architecture": timm_bit_name(config, where), "num_classes": config.num_classes,
        "num_features": config.out_channels, "global_pool": "avg",
        "pretrained_cfg": {
            "input_size": [config.in_chans, h, w], "fixed_input_size": False,
            **timm_eval_crop(config.image_size, eval_resize), "mean": list(config.mean), "std": list(config.std),
            "num_classes": config.num_classes, "pool_size": [-(-h // 32), -(-w // 32)], "first_conv": "stem.conv",
            "classifier": "head.fc",
        },
    }  # fmt: skip
    if config.in_chans != 3:
        hub["model_args"] = {"in_chans": config.in_chans}
    if class_names:
        hub["label_names"] = list(class_names)
    return hub

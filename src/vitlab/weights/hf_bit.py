"""Hugging Face transformers BiT folders (`BitForImageClassification`, `BitModel`; config.json model_type "bit"),
both ways.

transformers' `modeling_bit.py` with layer_type "preactivation" is BiT's ResNetV2 (Kolesnikov et al. 2020, as
big_transfer's code builds it) with the same module names inside a unit (norm1, conv1, …, downsample.conv), so
every tensor carries over unchanged; only the prefixes differ. What its config.json can change and vitlab cannot
represent (SAME padding, dilation, another activation or group count, the hybrid's post-activation layer_type) is a
one-line WeightsError naming the setting. Its numerics are fixed in the code, not the config: weight
standardisation eps 1e-8, GroupNorm eps 1e-5, and a model read from a folder keeps them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.constants import CLIP_MEAN, CLIP_STD
from vitlab.errors import WeightsError
from vitlab.models.config import BiTConfig
from vitlab.models.registry import bit_name
from vitlab.models.timm_compat import eval_resize_of
from vitlab.weights.card import model_card
from vitlab.weights.hf_folder import (
    PREPROCESSOR,
    checkpoint_meta,
    eval_resize_from_processor,
    hf_architecture,
    hf_num_classes,
    image_processor,
    label_maps,
    write_hf_folder,
)
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import read_json, read_weights_folder
from vitlab.weights.validate import check_against, expected_shapes, warn_numerics

__all__ = ["HF_GN_EPS", "HF_WS_EPS", "config_from_hf_bit", "hf_bit_config", "read_hf_bit", "write_hf_bit"]

CLASSIFIER, BACKBONE = "BitForImageClassification", "BitModel"
HF_WS_EPS = 1e-8  # every WeightStandardizedConv2d in modeling_bit.py is built with eps=1e-8
HF_GN_EPS = 1e-5  # BitGroupNormActivation's default, never overridden
# transformers' BitConfig defaults, for config.json files that leave a field out.
HF_DEFAULTS: dict[str, Any] = {
    "num_channels": 3, "embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048], "depths": [3, 4, 6, 3],
    "layer_type": "preactivation", "hidden_act": "relu", "global_padding": None, "num_groups": 32,
    "drop_path_rate": 0.0, "embedding_dynamic_padding": False, "output_stride": 32, "width_factor": 1,
}  # fmt: skip
_FIX_CONFIG = "vitlab reads BiT's pre-activation ResNetV2 as google/bit-50 defines it"


def hf_key(key: str, base: str) -> str:
    """vitlab state-dict key -> transformers' name. `base` is "bit." inside BitForImageClassification, "" in a
    BitModel."""
    module, _, param = key.rpartition(".")
    if module == "stem.conv":
        return f"{base}embedder.convolution.{param}"
    if module == "norm":
        return f"{base}norm.{param}"
    if module == "head":
        return f"classifier.1.{param}"  # classifier = Sequential(Flatten, Linear)
    m = re.fullmatch(r"stages\.(\d+)\.(\d+)\.(\w+)", module)
    if m is None:
        raise ValueError(f"{key} has no place in transformers' BiT")
    layer = f"{base}encoder.stages.{m[1]}.layers.{m[2]}"
    return f"{layer}.downsample.conv.{param}" if m[3] == "downsample" else f"{layer}.{m[3]}.{param}"


# --- reading -------------------------------------------------------------------------------------------------
def read_hf_bit(path: str | Path) -> WeightsRecord:
    """A `save_pretrained` folder of BitForImageClassification or BitModel (a model without classifier: its
    forward returns the pooled representation), with optional preprocessor_config.json for mean, std and size."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    cfg_path = folder / "config.json"
    hf = read_json(cfg_path)
    if hf.get("model_type") != "bit":
        raise WeightsError(cfg_path, f"model_type {hf.get('model_type')!r} is not 'bit'",
                           f"vitlab reads HF {CLASSIFIER} / {BACKBONE} folders here")  # fmt: skip
    file, tensors = read_weights_folder(folder, ("model.safetensors", "pytorch_model.bin"))
    arch = hf_architecture(hf, tensors, cfg_path, (CLASSIFIER, BACKBONE), "bit.")
    base = "bit." if arch == CLASSIFIER else ""
    pre_path = folder / PREPROCESSOR
    config = config_from_hf_bit(hf, cfg_path, arch)
    if pre_path.is_file():  # without one, BiT's own input: [-1, 1] (mean = std = 0.5) at 224x224
        config = _with_preprocessing(config, read_json(pre_path), pre_path)
    shapes = expected_shapes(config, cfg_path, len(tensors))
    names = {key: hf_key(key, base) for key in shapes}
    check_against(file, {names[k]: s for k, s in shapes.items()}, tensors,
                  f"{arch} with this config.json")  # fmt: skip
    notes = [] if pre_path.is_file() else [f"no {PREPROCESSOR}: assumed mean = std = 0.5 and 224x224"]
    if float(hf.get("drop_path_rate") or 0):
        notes.append(f"ignored drop_path_rate={hf['drop_path_rate']}: a training-time setting")
    state = {key: tensors[name] for key, name in names.items()}
    meta = checkpoint_meta(hf, arch, config.num_classes, notes)
    if pre_path.is_file() and (resize := eval_resize_from_processor(read_json(pre_path), config.image_size)):
        meta["eval_resize"] = resize  # the processor crops the centre: `vitlab.transforms` does as it does
    return WeightsRecord(config, state, source="hf", meta=meta)


def config_from_hf_bit(hf: dict[str, Any], path: str | Path, arch: str) -> BiTConfig:
    """The vitlab config of an HF BiT config.json; WeightsError naming any setting that computes something else."""
    c = {**HF_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k == "global_padding"}}
    depths, hidden = list(c["depths"]), list(c["hidden_sizes"])
    refusals = [
        (c["layer_type"] != "preactivation", f"layer_type={c['layer_type']!r} (post-activation: the hybrid stem's "
                                             "ResNet, not BiT)"),
        (c["global_padding"] is not None, f"global_padding={c['global_padding']!r} (TF padding, not BiT's fixed "
                                          "symmetric padding)"),
        (bool(c["embedding_dynamic_padding"]), "embedding_dynamic_padding=true (TF padding before the max-pool)"),
        (c["hidden_act"] != "relu", f"hidden_act={c['hidden_act']!r} (BiT uses ReLU)"),
        (c["num_groups"] != 32, f"num_groups={c['num_groups']} (BiT's GroupNorm has 32 groups)"),
        (c["embedding_size"] % 64 != 0 or c["embedding_size"] <= 0,
         f"embedding_size={c['embedding_size']} (BiT's root width is 64·width factor)"),
        (len(hidden) != len(depths), f"{len(hidden)} hidden_sizes for {len(depths)} depths"),
    ]  # fmt: skip
    for refused, setting in refusals:
        if refused:
            raise WeightsError(path, f"unsupported setting {setting}", _FIX_CONFIG)
    wf = c["embedding_size"] // 64
    widths = [256 * wf * 2**i for i in range(len(depths))]
    if [h * c["width_factor"] for h in hidden] != widths or hidden[-1:] != widths[-1:]:
        raise WeightsError(path, f"unsupported setting hidden_sizes={hidden} with width_factor={c['width_factor']} "
                           f"(BiT's stage widths for embedding_size {c['embedding_size']} are {widths})", _FIX_CONFIG)
    stride = 4  # transformers dilates instead of striding once the stride reaches output_stride
    for _ in depths[1:]:
        if stride >= c["output_stride"]:
            raise WeightsError(path, f"unsupported setting output_stride={c['output_stride']} (dilated stages)",
                               _FIX_CONFIG)  # fmt: skip
        stride *= 2
    num_classes = hf_num_classes(hf, arch, CLASSIFIER)
    try:
        config = BiTConfig(layers=tuple(depths), width_factor=wf, in_chans=c["num_channels"], num_classes=num_classes,
                           gn_eps=HF_GN_EPS, ws_eps=HF_WS_EPS)  # fmt: skip
    except (ValueError, TypeError) as e:
        raise WeightsError(path, f"invalid BiT config ({e})", "the config.json is inconsistent") from None
    return config.replace(name=bit_name(config))


def _with_preprocessing(config: BiTConfig, pre: dict[str, Any], path: Path) -> BiTConfig:
    """Mean, std and input size from BitImageProcessor's settings (its class defaults where a field is absent);
    the size is the center crop if it crops, else the resize target."""
    mean, std = (0.0,) * 3, (1.0,) * 3
    if pre.get("do_normalize", True):
        mean, std = pre.get("image_mean") or CLIP_MEAN, pre.get("image_std") or CLIP_STD
    size = pre.get("crop_size", 224) if pre.get("do_center_crop", True) else pre.get("size", 224)
    try:
        if isinstance(size, dict):
            size = (size["height"], size["width"]) if "height" in size else size.get("shortest_edge", 224)
        return config.replace(mean=_triple(mean), std=_triple(std), image_size=size)
    except (ValueError, TypeError, KeyError) as e:
        raise WeightsError(path, f"invalid image processor settings ({e})", "the file is corrupt") from None


def _triple(v: Any) -> tuple[float, ...]:
    return (float(v),) * 3 if isinstance(v, (int, float)) else tuple(float(x) for x in v)


# --- writing -------------------------------------------------------------------------------------------------
def hf_bit_config(config: BiTConfig, class_names: list[str] | None = None) -> dict[str, Any]:
    """transformers' config.json: BitForImageClassification with a head, else BitModel. Widths are written out
    in hidden_sizes (width_factor 1): transformers sizes its final norm and classifier from hidden_sizes alone."""
    out: dict[str, Any] = {
        "architectures": [CLASSIFIER if config.num_classes else BACKBONE], "model_type": "bit",
        "num_channels": config.in_chans, "embedding_size": config.root_width,
        "hidden_sizes": [4 * config.root_width * 2**i for i in range(len(config.layers))],
        "depths": list(config.layers), "layer_type": "preactivation", "hidden_act": "relu", "global_padding": None,
        "num_groups": 32, "drop_path_rate": 0.0, "embedding_dynamic_padding": False,
        "output_stride": max(32, 4 * 2 ** (len(config.layers) - 1)), "width_factor": 1,
    }  # fmt: skip
    return {**out, **label_maps(config.num_classes, class_names)}


def write_hf_bit(model: nn.Module, folder: str | Path, source: str | Path | None = None) -> None:
    """A folder `transformers.BitForImageClassification.from_pretrained` loads (BitModel without a head).
    transformers standardises conv weights with eps 1e-8; a model with another eps is written unchanged and
    warned about. Written into a temporary folder and renamed into place."""
    config = getattr(model, "config", None)
    if not isinstance(config, BiTConfig):
        raise ValueError(f"write_hf_bit writes BiT models, not {type(model).__name__}")
    warn_numerics(model, "transformers' BiT", HF_WS_EPS, HF_GN_EPS)
    base = "bit." if config.num_classes else ""
    tensors = {hf_key(k, base): v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    cfg = hf_bit_config(config, getattr(model, "class_names", None))
    pre = image_processor(config.image_size, config.mean, config.std, eval_resize_of(model), "BitImageProcessor")

    write_hf_folder(folder, cfg, pre, model_card(model, "hf", folder, source), tensors)

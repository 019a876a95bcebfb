"""big_transfer's released BiT-S / BiT-M `.npz` checkpoints (Kolesnikov et al. 2020), read and written.

The file is a flat dict named as big_transfer's TF code named its variables; `bit_pytorch/models.py` (`load_from`)
and `bit_jax/models.py` read it the same way:

    resnet/root_block/standardized_conv2d/kernel               stem.conv.weight          (7, 7, C, 64·wf) HWIO
    resnet/block{s}/unit{uu}/a/group_norm/{gamma,beta}         stages.{s-1}.{u-1}.norm1  first GN, pre-activation
    resnet/block{s}/unit{uu}/a/standardized_conv2d/kernel      ….conv1                   1×1
    resnet/block{s}/unit{uu}/a/proj/standardized_conv2d/kernel ….downsample              1×1 (stride), units 01 only
    resnet/block{s}/unit{uu}/b/…                               ….norm2, ….conv2          3×3 (stride)
    resnet/block{s}/unit{uu}/c/…                               ….norm3, ….conv3          1×1
    resnet/group_norm/{gamma,beta}                             norm                      GN before the head
    resnet/head/conv2d/{kernel,bias}                           head                      (1, 1, 2048·wf, classes)

Units are numbered from 01 with two digits. GroupNorm parameters are (C,) in the released files, (1, 1, 1, C) in
trees saved from bit_jax; both are read and the writer can produce either. The architecture (units per block,
width factor, classes) is read from the names and shapes; the numerics are big_transfer's: GroupNorm eps 1e-5,
weight standardisation (w − mean) / sqrt(var + 1e-10).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitlab.errors import WeightsError
from vitlab.models.config import BiTConfig
from vitlab.models.registry import bit_name
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import atomic_savez, check_npz_tensor, read_npz_arrays, units_per_stage
from vitlab.weights.validate import expected_shapes, warn_numerics

__all__ = ["BIG_TRANSFER_WS_EPS", "is_bit_npz", "read_bit_npz", "write_bit_npz"]

BIG_TRANSFER_WS_EPS = 1e-10  # bit_jax / bit_pytorch StdConv: (w − mean) / sqrt(var + 1e-10)
BIG_TRANSFER_GN_EPS = 1e-5  # Flax / torch GroupNorm default, which big_transfer keeps
ROOT = "resnet/root_block/standardized_conv2d/kernel"
HEAD = "resnet/head/conv2d"
_CONV = "standardized_conv2d/kernel"
_FIX = "download or export the file again"

# vitlab module inside a unit -> big_transfer sub-block: each letter holds one GN and the conv that follows it.
_UNIT_PARTS = {"norm1": "a/group_norm", "conv1": f"a/{_CONV}", "downsample": f"a/proj/{_CONV}",
               "norm2": "b/group_norm", "conv2": f"b/{_CONV}", "norm3": "c/group_norm", "conv3": f"c/{_CONV}"}


def _npz_name(key: str) -> tuple[str, str]:
    """vitlab state-dict key -> (npz name, layout kind: "conv" | "gn" | "dense" | "raw")."""
    module, _, param = key.rpartition(".")
    gn_leaf = "gamma" if param == "weight" else "beta"
    if module == "stem.conv":
        return ROOT, "conv"
    if module == "norm":
        return f"resnet/group_norm/{gn_leaf}", "gn"
    if module == "head":
        return (f"{HEAD}/kernel", "dense") if param == "weight" else (f"{HEAD}/bias", "raw")
    if m := re.fullmatch(r"stages\.(\d+)\.(\d+)\.(\w+)", module):
        unit = f"resnet/block{int(m[1]) + 1}/unit{int(m[2]) + 1:02d}"
        part = _UNIT_PARTS.get(m[3])
        if part is not None:
            if part.endswith("group_norm"):
                return f"{unit}/{part}/{gn_leaf}", "gn"
            return f"{unit}/{part}", "conv"
    raise ValueError(f"{key} has no place in big_transfer's .npz layout")


def _to_npz(t: torch.Tensor, kind: str, gn_4d: bool) -> torch.Tensor:
    """One vitlab tensor -> its npz layout (works on meta tensors: the reader's expected shapes)."""
    if kind == "conv":
        return t.permute(2, 3, 1, 0)  # OIHW -> HWIO
    if kind == "dense":
        return t.T.reshape(1, 1, t.shape[1], t.shape[0])  # Linear (classes, C) -> 1×1 conv (1, 1, C, classes)
    if kind == "gn" and gn_4d:
        return t.reshape(1, 1, 1, -1)
    return t


def _to_vitlab(t: torch.Tensor, kind: str) -> torch.Tensor:
    """Inverse of `_to_npz` for a tensor whose shape has been checked."""
    if kind == "conv":
        return t.permute(3, 2, 0, 1)  # HWIO -> OIHW
    if kind == "dense":
        return t.reshape(t.shape[-2], t.shape[-1]).T
    if kind == "gn":
        return t.reshape(-1)
    return t


# --- reading ------------------------------------------------------------------------------------------------
def is_bit_npz(names: list[str]) -> bool:
    """Whether archive member names (or array names) are big_transfer's: everything lives under `resnet/`."""
    return any(n.startswith("resnet/") for n in names)


def read_bit_npz(path: str | os.PathLike) -> WeightsRecord:
    """A big_transfer BiT `.npz` -> WeightsRecord with vitlab's keys; the architecture comes from the file.
    meta: "gn_4d" (GroupNorm parameters stored as (1, 1, 1, C))."""
    arrays = read_npz_arrays(path)
    if not is_bit_npz(list(arrays)):
        hint = " (it is a ViT checkpoint: read it with vitlab.load)" if "embedding/kernel" in arrays else ""
        raise WeightsError(path, f"no {ROOT} tensor: not a big_transfer BiT checkpoint{hint}",
                           "use vitlab.load, which detects the format")  # fmt: skip
    gn_4d = arrays.get("resnet/group_norm/gamma", np.zeros(0)).ndim == 4
    config = _infer_config(path, arrays)
    plan = {key: (*_npz_name(key), shape) for key, shape in expected_shapes(config).items()}
    for name, kind, shape in plan.values():
        want = tuple(_to_npz(torch.empty(shape, device="meta"), kind, gn_4d).shape)
        check_npz_tensor(path, arrays, name, want, _FIX)
    extra = sorted(set(arrays) - {name for name, _, _ in plan.values()})
    if extra:
        shown = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        raise WeightsError(path, f"unknown tensors {shown} (not part of the {_describe(config)} the file "
                           "describes)", "remove them, or convert the file with the tool that wrote it")  # fmt: skip
    state = {key: _to_vitlab(torch.from_numpy(arrays.pop(name)), kind).contiguous()
             for key, (name, kind, _) in plan.items()}  # fmt: skip
    return WeightsRecord(config=config, state_dict=state, source="bit-npz", meta={"gn_4d": gn_4d})


def _infer_config(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> BiTConfig:
    """Width factor from the root conv (64·wf outputs), units per block from the names, classes from the head."""
    if ROOT not in arrays:
        raise WeightsError(path, f"missing tensor {ROOT}", f"the file is incomplete; {_FIX}")
    root = arrays[ROOT].shape
    if len(root) != 4 or root[3] % 64 or root[3] == 0:
        raise WeightsError(path, f"tensor {ROOT} has shape {root}, expected (7, 7, C, 64·width factor)", _FIX)
    units = units_per_stage(arrays, r"resnet/block(\d+)/unit(\d+)/")
    layers = tuple(units.get(s, 0) for s in range(1, max(units, default=0) + 1))
    if not layers or 0 in layers:
        block = layers.index(0) + 1 if 0 in layers else 1
        raise WeightsError(path, f"missing tensor resnet/block{block}/unit01/a/{_CONV}",
                           f"the file is incomplete; {_FIX}")
    head = arrays.get(f"{HEAD}/kernel")
    if head is not None and head.ndim != 4:
        raise WeightsError(path, f"tensor {HEAD}/kernel has shape {head.shape}, expected (1, 1, C, classes)", _FIX)
    if head is None and f"{HEAD}/bias" in arrays:
        raise WeightsError(path, f"missing tensor {HEAD}/kernel", f"the file is incomplete; {_FIX}")
    config = BiTConfig(layers=layers, width_factor=root[3] // 64, in_chans=root[2],
                       num_classes=int(head.shape[3]) if head is not None else 0,
                       gn_eps=BIG_TRANSFER_GN_EPS, ws_eps=BIG_TRANSFER_WS_EPS)  # fmt: skip
    return config.replace(name=bit_name(config))


def _describe(config: BiTConfig) -> str:
    return config.name or f"BiT ResNetV2 (units {config.layers}, width factor {config.width_factor})"


# --- writing ------------------------------------------------------------------------------------------------
def write_bit_npz(model: nn.Module, path: str | os.PathLike, gn_4d: bool = False) -> None:
    """Export a BiT model to big_transfer's layout (readable by bit_pytorch's / bit_jax's loaders and timm's
    `resnetv2_*_bit`). gn_4d stores GroupNorm parameters as (1, 1, 1, C) instead of the released (C,).
    Written to a temporary name and renamed: never left half-written."""
    config = getattr(model, "config", None)
    if not isinstance(config, BiTConfig):
        raise ValueError(f"big_transfer's .npz layout holds BiT ResNets, not {type(model).__name__}; "
                         "write ViTs with --to jax-npz")  # fmt: skip
    warn_numerics(model, "big_transfer", BIG_TRANSFER_WS_EPS, BIG_TRANSFER_GN_EPS)
    arrays: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for key, t in model.state_dict().items():
            name, kind = _npz_name(key)
            t = _to_npz(t.detach().cpu(), kind, gn_4d)
            arrays[name] = np.ascontiguousarray((t.float() if t.dtype == torch.bfloat16 else t).numpy())
    atomic_savez(Path(path), arrays)

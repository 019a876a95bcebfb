"""Official `.npz` checkpoints of github.com/google-research/vision_transformer: read and write.

The file is a flat dict of arrays named by their place in the Flax parameter tree
("Transformer/encoderblock_0/LayerNorm_0/scale"). One table (`_RULES`) maps each vitlab state-dict key to its
npz name(s) and a layout kind, and `_to_jax` / `_to_vitlab` convert one kind each way; reader and writer share
them, so the two directions cannot drift apart. The reader infers the architecture from tensor names and
shapes, builds that model on the meta device and demands exactly its tensors with exactly the shapes they
take in the file: nothing missing, nothing extra, no partial loads. Numerics other than the official ones travel
in `vitlab/` arrays beside the tensors (npz_numerics.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vitlab.errors import WeightsError
from vitlab.models.config import ResNetConfig, ViTConfig
from vitlab.models.registry import model_config, variant_names
from vitlab.models.vit import VisionTransformer
from vitlab.weights.npz_numerics import numerics_arrays, pop_numerics
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import atomic_savez, check_npz_tensor, read_npz_arrays, units_per_stage

# Module names inside an encoder block. The 2020 releases (pre-Linen Flax) number modules in creation order
# across all types; Linen numbers each module type separately.
NUMBERINGS: dict[str, dict[str, str]] = {
    "pre-linen": {"ln1": "LayerNorm_0", "attn": "MultiHeadDotProductAttention_1", "ln2": "LayerNorm_2",
                  "mlp": "MlpBlock_3"},
    "linen": {"ln1": "LayerNorm_0", "attn": "MultiHeadDotProductAttention_0", "ln2": "LayerNorm_1",
              "mlp": "MlpBlock_0"},
}
# Trees saved mid-training by the official code sit under flax.optim's `opt/target/` or under `params/`.
PREFIXES = ("", "opt/target/", "params/")
POSEMBED = "Transformer/posembed_input/pos_embedding"
_FIX_CORRUPT = "download or export the file again"

_Name = Callable[[re.Match, dict[str, str]], str]


def _blk(m: re.Match) -> str:
    return f"Transformer/encoderblock_{m[1]}"


def _unit(m: re.Match) -> str:
    return f"block{int(m[1]) + 1}/unit{int(m[2]) + 1}"  # official stage and unit numbers start at 1


# vitlab module (full regex match) -> npz module path, layout kind.
_RULES: list[tuple[str, _Name, str]] = [
    (r"patch_embed\.proj", lambda m, n: "embedding", "conv"),
    (r"blocks\.(\d+)\.norm1", lambda m, n: f"{_blk(m)}/{n['ln1']}", "norm"),
    (r"blocks\.(\d+)\.attn\.qkv", lambda m, n: f"{_blk(m)}/{n['attn']}", "qkv"),
    (r"blocks\.(\d+)\.attn\.proj", lambda m, n: f"{_blk(m)}/{n['attn']}/out", "out"),
    (r"blocks\.(\d+)\.norm2", lambda m, n: f"{_blk(m)}/{n['ln2']}", "norm"),
    (r"blocks\.(\d+)\.mlp\.fc([12])", lambda m, n: f"{_blk(m)}/{n['mlp']}/Dense_{int(m[2]) - 1}", "dense"),
    (r"norm", lambda m, n: "Transformer/encoder_norm", "norm"),
    (r"pre_logits\.0", lambda m, n: "pre_logits", "dense"),
    (r"head", lambda m, n: "head", "dense"),
    (r"stem\.conv", lambda m, n: "conv_root", "conv"),
    (r"stem\.norm", lambda m, n: "gn_root", "gn"),
    (r"stem\.stages\.(\d+)\.(\d+)\.conv([123])", lambda m, n: f"{_unit(m)}/conv{m[3]}", "conv"),
    (r"stem\.stages\.(\d+)\.(\d+)\.norm([123])", lambda m, n: f"{_unit(m)}/gn{m[3]}", "gn"),
    (r"stem\.stages\.(\d+)\.(\d+)\.downsample\.0", lambda m, n: f"{_unit(m)}/conv_proj", "conv"),
    (r"stem\.stages\.(\d+)\.(\d+)\.downsample\.1", lambda m, n: f"{_unit(m)}/gn_proj", "gn"),
]
_PARAMS = {"cls_token": "cls", "pos_embed": POSEMBED}  # bare parameters, stored as they are


def _npz_names(key: str, numbering: str) -> tuple[list[str], str, str]:
    """vitlab state-dict key -> (npz names, layout kind, leaf). q, k and v are three npz tensors for one key."""
    if key in _PARAMS:
        return [_PARAMS[key]], "raw", "raw"
    module, _, param = key.rpartition(".")
    for pattern, name, kind in _RULES:
        if m := re.fullmatch(pattern, module):
            base = name(m, NUMBERINGS[numbering])
            leaf = "bias" if param == "bias" else ("scale" if kind in ("norm", "gn") else "kernel")
            if kind == "qkv":
                return [f"{base}/{p}/{leaf}" for p in ("query", "key", "value")], kind, leaf
            return [f"{base}/{leaf}"], kind, leaf
    raise ValueError(f"{key} has no place in the official .npz format")


def _to_jax(t: torch.Tensor, kind: str, leaf: str, heads: int, gn_4d: bool) -> list[torch.Tensor]:
    """One vitlab tensor -> its npz tensor(s). Works on meta tensors too (the reader's expected shapes)."""
    if kind == "qkv":  # fused (3D, D) / (3D,) -> q, k, v
        d = t.shape[-1] if leaf == "kernel" else t.shape[0] // 3
        if leaf == "kernel":
            return [w.T.reshape(d, heads, d // heads) for w in t.chunk(3)]  # 3 × (D, heads, hd)
        return [b.reshape(heads, d // heads) for b in t.chunk(3)]  # 3 × (heads, hd)
    if kind == "gn":
        return [t.reshape(1, 1, 1, -1) if gn_4d else t]  # older files: (1, 1, 1, C)
    if leaf != "kernel":
        return [t]  # biases, LayerNorm scales, cls, pos-embed
    if kind == "conv":
        return [t.permute(2, 3, 1, 0)]  # OIHW -> HWIO
    if kind == "out":
        return [t.T.reshape(heads, -1, t.shape[0])]  # (D, heads·hd) -> (heads, hd, D)
    return [t.T]  # Dense: (out, in) -> (in, out)


def _to_vitlab(ts: list[torch.Tensor], kind: str, leaf: str) -> torch.Tensor:
    """Inverse of `_to_jax`: npz tensor(s), already shape-checked, -> one vitlab tensor (maybe a view)."""
    if kind == "qkv":
        if leaf == "kernel":
            return torch.cat([k.reshape(k.shape[0], -1).T for k in ts])  # (3D, D)
        return torch.cat([b.reshape(-1) for b in ts])  # (3D,)
    t = ts[0]
    if kind == "gn":
        return t.reshape(-1)  # (C,) or (1, 1, 1, C) -> (C,)
    if leaf != "kernel":
        return t
    if kind == "conv":
        return t.permute(3, 2, 0, 1)  # HWIO -> OIHW
    if kind == "out":
        return t.reshape(-1, t.shape[-1]).T  # (heads, hd, D) -> (D, heads·hd)
    return t.T  # Dense: (in, out) -> (out, in)


# --- reading ------------------------------------------------------------------------------------------------
def read_jax_npz(path: str | os.PathLike, image_size: int | tuple[int, int] | None = None) -> WeightsRecord:
    """An official `.npz` -> WeightsRecord with vitlab's keys and layouts; the architecture comes from the file.

    `image_size` is the size the file's position embedding was trained at: needed only when its grid is not
    square, or the model has no position embedding (default 224). Resizing to another size is the caller's job.
    meta: "jax_numbering" ("pre-linen" | "linen"), "gn_4d" (GroupNorm params stored as (1, 1, 1, C)), "prefix".
    """
    arrays, prefix = _open(path)
    numerics = pop_numerics(path, arrays)  # vitlab/gelu, vitlab/ln_eps: recorded when not the official ones
    numbering = _detect_numbering(path, arrays)
    gn_4d = "gn_root/scale" in arrays and arrays["gn_root/scale"].ndim == 4
    config = _infer_config(path, arrays, numbering, image_size).replace(**numerics)
    with torch.device("meta"):  # shapes and key names only, no memory
        expected = VisionTransformer(config).state_dict()
    plan = [(key, *_npz_names(key, numbering)) for key in expected]
    for key, names, kind, leaf in plan:
        wants = _to_jax(expected[key], kind, leaf, config.num_heads, gn_4d)
        for name, want in zip(names, wants, strict=True):
            check_npz_tensor(path, arrays, name, tuple(want.shape))
    extra = sorted(set(arrays) - {n for _, names, _, _ in plan for n in names})
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise WeightsError(path, f"unknown tensors {shown} (not part of the {_describe(config)} the file "
                           "describes)", "remove them, or convert the file with the tool that wrote it")
    state_dict = {}
    for key, names, kind, leaf in plan:  # pop as we go: peak memory stays near one copy of the weights
        state_dict[key] = _to_vitlab([torch.from_numpy(arrays.pop(n)) for n in names], kind, leaf).contiguous()
    meta = {"jax_numbering": numbering, "gn_4d": gn_4d, "prefix": prefix}
    return WeightsRecord(config=config, state_dict=state_dict, source="jax-npz", meta=meta)


def _open(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], str]:
    """All arrays of the archive, the tree prefix stripped; every way a file can be unreadable is a WeightsError."""
    arrays = read_npz_arrays(path)
    prefix = next((p for p in PREFIXES if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise WeightsError(path, "no embedding/kernel tensor: not an official ViT checkpoint",
                           "use vitlab.load for timm, Hugging Face or vitlab files")
    if prefix == "opt/target/":  # flax.optim keeps optimizer moments beside the weights: not model tensors
        arrays = {k: v for k, v in arrays.items() if not k.startswith("opt/state/")}
    return {k.removeprefix(prefix): v for k, v in arrays.items()}, prefix


def _detect_numbering(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> str:
    pattern = re.compile(r"Transformer/encoderblock_\d+/MultiHeadDotProductAttention_(\d+)/")
    found = {m[1] for k in arrays if (m := pattern.match(k))}
    if found == {"1"}:
        return "pre-linen"
    if found == {"0"}:
        return "linen"
    if found:
        raise WeightsError(path, "encoder blocks mix the pre-Linen (MultiHeadDotProductAttention_1) and Linen "
                           "(MultiHeadDotProductAttention_0) numberings", _FIX_CORRUPT)
    if any(k.startswith("Transformer/encoderblock/") for k in arrays):
        raise WeightsError(path, "scanned encoder (Transformer/encoderblock/ with stacked layers): a big_vision "
                           "file, not the vision_transformer layout", "convert it with big_vision's tools")
    raise WeightsError(path, "missing tensor Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
                       " (no encoder blocks)", _FIX_CORRUPT)


def _dim(path: str | os.PathLike, arrays: dict[str, np.ndarray], name: str, ndim: int, axis: int) -> int:
    """shape[axis] of a tensor the architecture is read from, after checking it exists with `ndim` axes."""
    if name not in arrays:
        raise WeightsError(path, f"missing tensor {name}", f"the file is incomplete; {_FIX_CORRUPT}")
    shape = arrays[name].shape
    if len(shape) != ndim:
        raise WeightsError(path, f"tensor {name} has shape {shape}, expected {ndim} axes", _FIX_CORRUPT)
    return int(shape[axis])


def _infer_config(path: str | os.PathLike, arrays: dict[str, np.ndarray], numbering: str,
                  image_size: int | tuple[int, int] | None) -> ViTConfig:
    """Architecture from tensor names and shapes; numerics are the official ones (tanh GELU, LN eps 1e-6)."""
    n = NUMBERINGS[numbering]
    query = f"Transformer/encoderblock_0/{n['attn']}/query/kernel"
    width, heads, head_dim = (_dim(path, arrays, query, 3, i) for i in range(3))  # (D, heads, hd)
    if heads * head_dim != width:
        raise WeightsError(path, f"tensor {query} has shape {arrays[query].shape}: heads × head_dim != width",
                           "vitlab's attention needs width = heads × head_dim")
    patch, patch_w = _dim(path, arrays, "embedding/kernel", 4, 0), _dim(path, arrays, "embedding/kernel", 4, 1)
    if patch != patch_w:
        raise WeightsError(path, f"tensor embedding/kernel has non-square patches {patch}x{patch_w}", _FIX_CORRUPT)
    blocks = [int(m[1]) for k in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))]
    resnet = _infer_resnet(path, arrays)
    in_chans = _dim(path, arrays, "conv_root/kernel" if resnet is not None else "embedding/kernel", 4, 2)
    rep = _dim(path, arrays, "pre_logits/kernel", 2, 1) if "pre_logits/kernel" in arrays else None
    fields = dict(
        patch_size=patch, width=width, depth=max(blocks) + 1, num_heads=heads, in_chans=in_chans,
        mlp_dim=_dim(path, arrays, f"Transformer/encoderblock_0/{n['mlp']}/Dense_0/kernel", 2, 1),
        num_classes=_dim(path, arrays, "head/kernel", 2, 1) if "head/kernel" in arrays else 0,
        classifier="token" if "cls" in arrays else "gap", representation_size=rep, resnet=resnet,
        gelu="tanh", ln_eps=1e-6,
    )
    stride = patch * (resnet.reduction if resnet is not None else 1)
    fields["pos_embed"], fields["image_size"] = _infer_image_size(
        path, arrays, 1 if "cls" in arrays else 0, stride, width, image_size)
    try:
        config = ViTConfig(**fields)
    except ValueError as e:
        raise WeightsError(path, f"inconsistent architecture ({e})", _FIX_CORRUPT) from e
    return config.replace(name=_registry_name(config))


def _infer_resnet(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> ResNetConfig | None:
    """Hybrid stem: width factor from the root conv's outputs, units per stage from block{s}/unit{u}. The
    official code takes any float width factor and builds int(64·wf) root channels, so r channels are
    wf = r/64 (exact in binary floating point, and int(64·r/64) = r): 96 channels are wf 1.5."""
    if "conv_root/kernel" not in arrays:
        return None  # any block{s}/… tensors are then reported as unknown
    root = _dim(path, arrays, "conv_root/kernel", 4, 3)  # (7, 7, C, int(64·wf))
    if root < 1 or root % 32:  # GroupNorm(32) over the root's channels, in the official code as here
        raise WeightsError(path, f"tensor conv_root/kernel has {root} output channels, not a positive multiple of "
                           "the 32 GroupNorm groups (root width int(64·width_factor))", _FIX_CORRUPT)
    units = units_per_stage(arrays, r"block(\d+)/unit(\d+)/")
    layers = tuple(units.get(s, 0) for s in range(1, max(units, default=0) + 1))
    if 0 in layers:
        raise WeightsError(path, f"missing tensor block{layers.index(0) + 1}/unit1/conv1/kernel", _FIX_CORRUPT)
    return ResNetConfig(layers=layers, width_factor=root / 64)


def _infer_image_size(path: str | os.PathLike, arrays: dict[str, np.ndarray], prefix: int, stride: int,
                      width: int, image_size: int | tuple[int, int] | None) -> tuple[str, tuple[int, int]]:
    """(pos_embed kind, native image size): the position embedding's grid times the pixels per token."""
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    if POSEMBED not in arrays:
        return "none", tuple(size or (224, 224))
    _dim(path, arrays, POSEMBED, 3, 1)
    check_npz_tensor(path, arrays, POSEMBED, (1, arrays[POSEMBED].shape[1], width))  # (1, prefix + N, D)
    n = arrays[POSEMBED].shape[1] - prefix
    if size is not None:
        h, w = size
        if h % stride or w % stride or (h // stride) * (w // stride) != n:
            raise WeightsError(path, f"{POSEMBED} holds {n} grid positions, not the {h // stride}x{w // stride} "
                               f"grid of a {h}x{w} image at {stride} pixels per token",
                               "pass the image size the checkpoint was trained at")
        return "learned", (h, w)
    g = math.isqrt(max(n, 0))
    if g * g != n or n == 0:
        raise WeightsError(path, f"{POSEMBED} holds {n} grid positions, not a square grid",
                           "pass image_size=(H, W) to read_jax_npz to give the grid's shape")
    return "learned", (g * stride, g * stride)


# Fields a registry name does not pin down: the head, the input size, numerics and training settings.
_NOT_IN_NAME = ("name", "num_classes", "image_size", "representation_size", "gelu", "ln_eps", "dropout",
                "attn_dropout", "mean", "std")


def _registry_name(config: ViTConfig) -> str:
    def arch(c: ViTConfig) -> dict:
        return {k: v for k, v in dataclasses.asdict(c).items() if k not in _NOT_IN_NAME}

    want = arch(config)
    for name in variant_names():
        candidate = model_config(name)
        if isinstance(candidate, ViTConfig) and arch(candidate) == want:
            return name
    return ""


def _describe(config: ViTConfig) -> str:
    return config.name or f"ViT (depth {config.depth}, width {config.width})"


# --- writing ------------------------------------------------------------------------------------------------
def write_jax_npz(model: VisionTransformer, path: str | os.PathLike, numbering: str = "pre-linen",
                  gn_4d: bool = False) -> None:
    """Export a ViT or hybrid to the official layout (readable by vit_jax's `load_pretrained` and timm).

    numbering: "pre-linen" (the 2020 releases) or "linen"; gn_4d stores GroupNorm params as (1, 1, 1, C) like
    the oldest hybrid files. The file is written to a temporary name and renamed: never left half-written.
    A BiT model goes to `bit_npz.write_bit_npz` (`convert.write` chooses it for "jax-npz" of a BiT).
    """
    if numbering not in NUMBERINGS:
        raise ValueError(f"numbering must be one of {sorted(NUMBERINGS)}, not {numbering!r}")
    config = _exportable(model)
    arrays: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for key, t in model.state_dict().items():
            names, kind, leaf = _npz_names(key, numbering)
            parts = _to_jax(t.detach().cpu(), kind, leaf, config.num_heads, gn_4d)
            for name, part in zip(names, parts, strict=True):
                if part.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
                    part = part.float()
                arrays[name] = np.ascontiguousarray(part.numpy())
    atomic_savez(Path(path), {**arrays, **numerics_arrays(config)})


def _exportable(model: VisionTransformer) -> ViTConfig:
    """The model's config, after refusing what the official format cannot hold."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"the official ViT .npz format holds ViTs and hybrids, not {type(model).__name__}; "
                         "save BiT ResNets with vitlab.save")
    config = model.config
    if config.pos_embed in ("2d", "relative"):
        raise ValueError(f"the official .npz format has no {config.pos_embed} position embeddings (only 1-D "
                         "learned or none); save this model with vitlab.save")
    if not config.qkv_bias:
        raise ValueError("the official .npz format needs query/key/value biases (qkv_bias=True)")
    if config.after_paper_features():
        raise ValueError(f"the official .npz format has no {config.after_paper_features()[0]}; save this model with "
                         "vitlab.save (or to timm's format)")
    differs = [f"gelu={config.gelu!r} (official: 'tanh')"] if config.gelu != "tanh" else []
    if config.ln_eps != 1e-6:
        differs.append(f"ln_eps={config.ln_eps} (official: 1e-6)")
    if differs:
        warnings.warn(f"the model uses {' and '.join(differs)}; the official JAX code will compute slightly "
                      "different outputs from these weights (the file records the values in vitlab/ arrays: "
                      "vitlab reads them back, the official code ignores them)", stacklevel=3)
    return config

"""The containers tensors come in, and their checks: safetensors (header checked against the file before anything
is read), weights-only torch pickles and training-checkpoint wrappers, sharded folders with their JSON index, .npz
archives (the official ViT and BiT formats), JSON configs; writing an .npz or an export folder atomically.
Every failure is a one-line WeightsError naming the file. The format modules (jax_npz, bit_npz, timm, hf,
vitlab_format) build on this; it knows no format's names.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.lib import format as npy
from safetensors.torch import load_file

from vitlab.errors import WeightsError
from vitlab.files.outputs import atomic_folder, atomic_write, mark_zip
from vitlab.files.reading import NotRegularFile, check_regular, open_regular, read_text_regular
from vitlab.progress import progress

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
ONNX_SUFFIX = ".onnx"  # a graph (vitlab export) served by ONNX Runtime, never weights to build a model from
# Training checkpoints nest the weights under one of these (timm, Lightning: "state_dict", DeiT/MAE: "model").
WRAPPER_KEYS = ("state_dict", "model", "module", "model_state_dict")
# ... and their exponential moving average under one of these (timm's train.py, DeiT), read when asked (use_ema).
EMA_KEYS = ("state_dict_ema", "model_ema")
# The plain Python types training checkpoints hold besides tensors (timm's train.py: its argparse.Namespace of
# settings; Lightning: paths among the hyper-parameters), allowed to the weights-only unpickler: building them runs
# no code of the file's. Anything else stays refused.
CHECKPOINT_GLOBALS = (argparse.Namespace, pathlib.PosixPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)
# DDP and torch.compile prefix every key; neither changes the weights.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit; a larger length means garbage, not a header
_FIX_CORRUPT = "download or export the file again"


# --- safetensors and torch pickles ---------------------------------------------------------------------------

def is_onnx_path(weights: object) -> bool:
    """Whether `weights` names an ONNX file (by its `.onnx` suffix): served by ONNX Runtime, not `vitlab.load`."""
    return isinstance(weights, str | os.PathLike) and Path(weights).suffix.lower() == ONNX_SUFFIX

def check_weights_file(path: str | os.PathLike) -> None:
    """WeightsError (one line) when `path` is a FIFO, device, socket or folder: opening one would block or read no
    weights (`files.reading`'s rule). An absent path passes: its reader says so."""
    try:
        check_regular(path)
    except NotRegularFile as err:
        raise WeightsError(path, f"is {err.kind}, not a regular file",
                           "vitlab reads weights from regular files only") from None


def safetensors_header(path: str | Path) -> dict[str, Any]:
    """The parsed JSON header; WeightsError if the file is not safetensors or is shorter than its header says."""
    path = Path(path)
    check_weights_file(path)
    size = path.stat().st_size
    with open_regular(path) as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(path, "file is too short to be safetensors", "re-download or re-export it")
        (n,) = struct.unpack("<Q", head)
        if n <= 0 or n > _MAX_HEADER or 8 + n > size:
            raise WeightsError(path, "not a safetensors file or truncated header", "re-download or re-export it")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # crafted nesting: RecursionError
            raise WeightsError(path, "corrupt safetensors header", "re-download or re-export it") from None
    _check_header_layout(path, header)
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + n + max(ends, default=0) > size:
        raise WeightsError(
            path, f"truncated: {size} bytes, header needs {8 + n + max(ends)}", "re-download or re-export the file"
        )
    return header


def _check_header_layout(path: Path, header: Any) -> None:
    """The header's shape as the safetensors format defines it (name -> {dtype, shape, data_offsets}, and a
    string -> string `__metadata__`), so that nothing after this meets a list where an object belongs."""
    def ints(value: Any, count: int | None = None) -> bool:
        return (isinstance(value, list) and (count is None or len(value) == count)
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))

    if not isinstance(header, dict):
        raise WeightsError(path, f"corrupt safetensors header (a JSON {type(header).__name__}, not an object)",
                           "re-download or re-export it")
    for key, entry in header.items():
        if key == "__metadata__":
            ok = isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
        else:
            ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and ints(entry.get("shape"))
                  and ints(entry.get("data_offsets"), 2))
        if not ok:
            raise WeightsError(path, f"corrupt safetensors header (entry {key[:80]!r} is malformed)",
                               "re-download or re-export it")


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    safetensors_header(path)  # precise errors first
    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # the library's own errors are not one-liners
        raise WeightsError(path, f"cannot read safetensors ({type(err).__name__})", "re-export the file") from None


def read_tensor_file(path: str | Path, use_ema: bool = False) -> dict[str, torch.Tensor]:
    """A flat name -> tensor dict from a .safetensors file or a weights-only pickle (.pth/.pt/.bin/.ckpt, timm's
    .pth.tar), with training-checkpoint wrappers removed (`read_checkpoint`). WeightsError naming the file for
    anything else."""
    return read_checkpoint(path, use_ema).tensors


class CheckpointRead(NamedTuple):
    tensors: dict[str, torch.Tensor]  # the model's state dict, wrappers and prefixes removed
    entries: dict[str, Any]  # a training checkpoint's plain top-level entries ("args", "epoch", …); {} otherwise
    has_ema: bool  # it also holds EMA weights (EMA_KEYS)


def read_checkpoint(path: str | Path, use_ema: bool = False) -> CheckpointRead:
    """A weights file as read: a training checkpoint (timm's train.py, Lightning, DeiT) yields its model's state
    dict and its plain entries; a bare state dict or safetensors file the tensors alone. `use_ema`: the
    exponential-moving-average weights (`EMA_KEYS`), as timm's use_ema; a WeightsError when the file holds none."""
    path = Path(path)
    check_weights_file(path)
    if not path.is_file():
        raise WeightsError(path, "no such file", "check the path")
    if path.suffix not in PICKLE_SUFFIXES:
        with open_regular(path) as f:
            magic = f.read(2)
        # torch.save writes a zip ("PK") or, before torch 1.6, a pickle (protocol byte 0x80); anything else goes
        # to the safetensors reader, which reports corrupt files precisely.
        if path.suffix == ".safetensors" or magic not in (b"PK", b"\x80\x02"):
            if use_ema:
                raise WeightsError(path, "holds no EMA weights (a safetensors file is one set of weights)",
                                   "leave out use_ema / --use-ema")
            return CheckpointRead(strip_prefixes(read_safetensors(path)), {}, False)
    obj = _read_pickle(path)
    entries = {k: v for k, v in obj.items() if not _holds_tensors(v)} if isinstance(obj, dict) else {}
    has_ema = isinstance(obj, dict) and any(obj.get(k) is not None for k in EMA_KEYS)
    return CheckpointRead(unwrap_state_dict(path, _ema_weights(path, obj) if use_ema else obj), entries, has_ema)


def _holds_tensors(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (isinstance(value, dict) and any(
        isinstance(v, torch.Tensor | dict) for v in value.values()))


def _ema_weights(path: Path, obj: Any) -> Any:
    """The EMA state dict of a training checkpoint, chosen as timm's use_ema chooses it."""
    found = next((obj[k] for k in EMA_KEYS if isinstance(obj, dict) and obj.get(k) is not None), None)
    if found is None:
        raise WeightsError(path, f"holds no EMA weights (none of {list(EMA_KEYS)})",
                           "leave out use_ema / --use-ema: the file's weights are its only ones")
    return found


def _allowing(types: tuple[type, ...]) -> contextlib.AbstractContextManager:
    """The weights-only unpickler allowed `types` for one load (torch >= 2.5); torch 2.4 has only the process-wide
    allow-list, to which these plain types are added."""
    scoped = getattr(torch.serialization, "safe_globals", None)
    if scoped is not None:
        return scoped(list(types))
    torch.serialization.add_safe_globals(list(types))
    return contextlib.nullcontext()


def _read_pickle(path: Path) -> Any:
    try:
        # weights_only: a pickle can run arbitrary code on load; tensors, plain containers and the few plain
        # types training checkpoints hold (CHECKPOINT_GLOBALS) cannot.
        with _allowing(CHECKPOINT_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"WeightsUnpickler error:\s*(.+?)(?: was not an allowed|\n|$)", str(e))
        detail = found.group(1).strip() if found else str(e).splitlines()[0]
        raise WeightsError(
            path,
            f"not loadable with weights_only=True ({detail})",
            "the file holds Python objects besides tensors, or is corrupt; from a trusted copy re-save just the "
            "weights: torch.save(model.state_dict(), path)",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise WeightsError(path, f"not a readable PyTorch file ({first})", "the file is truncated or corrupt") from None


def unwrap_state_dict(path: str | Path, obj: Any) -> dict[str, torch.Tensor]:
    """Find the state dict inside a training checkpoint ({"state_dict": …}, {"model": …}) and drop the prefixes
    that wrap a model without changing its weights: "module." / "_orig_mod." (DDP, torch.compile), and in a
    training checkpoint a module name every key shares ("model." of a LightningModule's `self.model`: a ViT's or
    BiT's own keys never all share one). Every value must then be a tensor."""
    wrapped = False
    for _ in range(3):  # wrappers nest at most a couple of levels ({"model": {"state_dict": …}})
        if not isinstance(obj, dict) or all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            break
        obj, wrapped = inner, True
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(path, f"holds a {type(obj).__name__}, not a state dict", "save model.state_dict()")
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise WeightsError(
                path,
                f"entry {key!r} is a {type(value).__name__}, not a tensor",
                f"expected a state dict (name -> tensor) or one under one of the keys {list(WRAPPER_KEYS)}",
            )
    obj = strip_prefixes(obj)
    while wrapped and len({k.split(".", 1)[0] for k in obj}) == 1 and all("." in k for k in obj):
        obj = {k.split(".", 1)[1]: v for k, v in obj.items()}
    return obj


def strip_prefixes(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for prefix in WRAPPER_PREFIXES:
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix) :]: v for k, v in tensors.items()}
    return tensors


def read_weights_folder(folder: Path, names: tuple[str, ...]) -> tuple[Path, dict[str, torch.Tensor]]:
    """The first of `names` present in `folder` (e.g. model.safetensors, pytorch_model.bin), or its sharded form
    (`<name>.index.json` listing the shard files). Returns the file to name in errors and the tensors."""
    for name in names:
        if (folder / name).is_file():
            return folder / name, read_tensor_file(folder / name)
        index = folder / f"{name}.index.json"
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise WeightsError(index, "has no 'weight_map'", "the shard index is corrupt")
            tensors: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                tensors.update(read_tensor_file(confined(folder, shard, index)))
            return index, tensors
    raise WeightsError(folder, f"holds none of {list(names)}", "point to the folder save_pretrained/save_for_hf wrote")


def confined(folder: Path, name: Any, named_in: Path) -> Path:
    """`folder / name` for a file name that another file (a shard index) gives; a name that is not a plain
    relative path inside `folder` (absolute, `..`, a symlink out) is refused: a downloaded index must not make
    vitlab open files elsewhere on the machine."""
    if not isinstance(name, str) or not name:
        raise WeightsError(named_in, f"names a shard {name!r} that is not a file name", "the index is corrupt")
    target = (folder / name).resolve()
    if not target.is_relative_to(folder.resolve()):
        raise WeightsError(named_in, f"names a shard outside its folder ({name!r})",
                           "shard files must lie in the model folder; the index is corrupt or malicious")
    return target


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object of a weights folder's config file (config.json, pretrained_cfg.json); WeightsError (one line)
    for anything else, a FIFO included."""
    check_weights_file(path)
    try:
        data = json.loads(read_text_regular(path))
    except FileNotFoundError:
        raise WeightsError(path, "no such file", "the folder needs the config.json its library wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(path, f"not valid JSON ({e})", "the file is truncated or corrupt") from None
    except RecursionError:  # a crafted file: nesting deeper than the parser's recursion limit
        raise WeightsError(path, "not valid JSON (nested too deeply)", "the file is corrupt or crafted") from None
    if not isinstance(data, dict):
        raise WeightsError(path, f"holds a JSON {type(data).__name__}, not an object", "the file is corrupt")
    return data


def write_folder_atomically(folder: str | Path, write: Callable[[Path], None], owned: tuple[str, ...]) -> None:
    """Call write(tmp) for a fresh folder beside `folder`, then rename it into place, so a reader never sees a
    half-written export. An existing `folder` is replaced only if it is empty or holds nothing but files named
    in `owned` (an earlier export): a mistyped path must not delete someone's data."""
    folder = Path(folder)
    if folder.exists():
        foreign = [p.name for p in folder.iterdir() if p.name not in owned] if folder.is_dir() else [folder.name]
        if foreign:
            raise WeightsError(folder, f"exists and holds {foreign[0]!r}", "write to a new or empty folder")
    atomic_folder(folder, write)


def units_per_stage(names: Iterable[str], pattern: str, first: int = 1) -> dict[int, int]:
    """{stage: units} from the names `pattern` matches as (stage, unit), unit numbers starting at `first`."""
    units: dict[int, int] = {}
    for name in names:
        if m := re.match(pattern, name):
            units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) - first + 1)
    return units


# --- .npz archives ------------------------------------------------------------------------------------------
def read_npz_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of an .npz archive by name; a file that is not one (a lone .npy, a corrupt or truncated zip,
    members that are not arrays) is a one-line WeightsError. Shared by the ViT and the BiT readers."""
    check_weights_file(path)
    with open_regular(path) as f:  # a missing file stays FileNotFoundError
        magic = f.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise WeightsError(path, "a single .npy array, not an .npz archive of named tensors",
                           "pass the official .npz checkpoint")
    if not magic.startswith(b"PK"):
        raise WeightsError(path, "not an .npz archive (no zip header)",
                           "official ViT and BiT weights are .npz files; use vitlab.load for other formats")
    check_npz_members(path)  # declared array sizes against the archive's, before numpy allocates them
    try:
        npz = np.load(path, allow_pickle=False)
        with npz:  # decompressing a multi-GB release takes a while: a bar per tensor on a terminal
            arrays = {k: npz[k] for k in progress(npz.files, desc=f"read {Path(path).name}", unit="tensor")}
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, zlib.error) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise WeightsError(path, f"truncated or corrupt .npz archive ({reason})", _FIX_CORRUPT) from e
    not_arrays = sorted(k for k, v in arrays.items() if not isinstance(v, np.ndarray))  # np.load returns bytes
    if not_arrays:
        raise WeightsError(path, f"member {not_arrays[0]} is not a numpy array: a zip, but not an .npz checkpoint",
                           "use vitlab.load for other formats")
    return arrays


def check_npz_members(path: str | os.PathLike) -> None:
    """WeightsError for an .npz member whose .npy header declares more data than the member holds: numpy
    allocates the declared shape before reading, so a 700-byte file could ask for hundreds of gigabytes."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as member:
                    version = npy.read_magic(member)
                    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read(member, max_header_size=10_000)
                declared = math.prod(shape) * dtype.itemsize
                if declared > info.file_size:
                    raise WeightsError(path, f"member {info.filename[:80]} declares shape {shape[:8]} ({declared:,} "
                                       f"bytes) but holds {info.file_size:,} bytes",
                                       "the file is truncated, corrupt or crafted; re-download it")
    except WeightsError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):  # np.load reports these itself, precisely
        return


def check_npz_tensor(path: str | os.PathLike, arrays: dict[str, np.ndarray], name: str, shape: tuple[int, ...],
                     fix: str = _FIX_CORRUPT) -> None:
    """One array of an .npz checkpoint: present, of `shape`, floating point; a one-line WeightsError otherwise."""
    if name not in arrays:
        raise WeightsError(path, f"missing tensor {name}", f"the file is incomplete; {fix}")
    a = arrays[name]
    if a.shape != shape:
        raise WeightsError(path, f"tensor {name} has shape {a.shape}, expected {shape}",
                           "the file mixes architectures or is corrupt; " + fix)
    if not np.issubdtype(a.dtype, np.floating):
        raise WeightsError(path, f"tensor {name} has dtype {a.dtype}, expected floating point", fix)


def atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez into a temporary file beside `path`, then rename: readers see the old file or the new one."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object keeps np.savez from appending ".npz" to the name
            np.savez(f, **arrays)
        mark_zip(tmp)  # the zip comment says vitlab wrote it (np.load and the official loaders ignore it)
        with open(tmp, "rb+") as f:
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)

"""The files foreign formats come in: reading safetensors, weights-only torch pickles, sharded folders and JSON
configs into a flat name -> tensor dict with one-line WeightsErrors naming the file; the shapes an architecture
needs, checked against a file in the file's own naming; writing an export folder atomically.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import WeightsError
from ..models.config import ModelConfig
from ..models.registry import build_model
from ..outputs import atomic_folder
from .io import read_safetensors
from .validate import check_state_dict

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# Training checkpoints nest the weights under one of these (timm: "state_dict", DeiT/MAE: "model").
WRAPPER_KEYS = ("state_dict", "model", "module", "model_state_dict")
# DDP and torch.compile prefix every key; neither changes the weights.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def read_tensor_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A flat name -> tensor dict from a .safetensors file or a weights-only pickle (.pth/.pt/.bin/.ckpt),
    with training-checkpoint wrappers removed. Raises WeightsError naming the file for anything else."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(path, "no such file", "check the path")
    if path.suffix not in PICKLE_SUFFIXES:
        with open(path, "rb") as f:
            magic = f.read(2)
        # torch.save writes a zip ("PK") or, before torch 1.6, a pickle (protocol byte 0x80); anything else goes
        # to the safetensors reader, which reports corrupt files precisely.
        if path.suffix == ".safetensors" or magic not in (b"PK", b"\x80\x02"):
            return strip_prefixes(read_safetensors(path))
    return unwrap_state_dict(path, _read_pickle(path))


def _read_pickle(path: Path) -> Any:
    try:
        # weights_only: a pickle can run arbitrary code on load; tensors and plain containers cannot.
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
    """Find the state dict inside a training checkpoint ({"state_dict": …}, {"model": …}) and drop
    "module." / "_orig_mod." prefixes. Every value must then be a tensor."""
    for _ in range(3):  # wrappers nest at most a couple of levels ({"model": {"state_dict": …}})
        if not isinstance(obj, dict) or all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(path, f"holds a {type(obj).__name__}, not a state dict", "save model.state_dict()")
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise WeightsError(
                path,
                f"entry {key!r} is a {type(value).__name__}, not a tensor",
                f"expected a state dict (name -> tensor) or one under one of the keys {list(WRAPPER_KEYS)}",
            )
    return strip_prefixes(obj)


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
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WeightsError(path, "no such file", "the folder needs the config.json its library wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(path, f"not valid JSON ({e})", "the file is truncated or corrupt") from None
    except RecursionError:  # a crafted file: nesting deeper than the parser's recursion limit
        raise WeightsError(path, "not valid JSON (nested too deeply)", "the file is corrupt or crafted") from None
    if not isinstance(data, dict):
        raise WeightsError(path, f"holds a JSON {type(data).__name__}, not an object", "the file is corrupt")
    return data


def check_npz_members(path: str | Path) -> None:
    """WeightsError for an .npz member whose .npy header declares more data than the member holds: numpy
    allocates the declared shape before reading, so a 700-byte file could ask for hundreds of gigabytes."""
    from numpy.lib import format as npy

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


def expected_shapes(config: ModelConfig, path: str | Path | None = None, tensors: int | None = None
                    ) -> dict[str, torch.Size]:
    """Every tensor the architecture needs, with its shape, without allocating or initialising weights. For a
    config read from a file, `path` and the file's tensor count bound the declared depth before anything is built
    (validate.check_declared_size)."""
    if path is not None:
        from .validate import check_declared_size

        check_declared_size(path, config, tensors)
    with torch.device("meta"):
        model = build_model(config)
    return {k: v.shape for k, v in model.state_dict().items()}


def check_against(
    path: str | Path, expected: Mapping[str, torch.Size], got: Mapping[str, torch.Tensor], arch: str
) -> None:
    """`check_state_dict`, with the architecture the expectation came from added to the message."""
    try:
        check_state_dict(path, expected, got)
    except WeightsError as e:
        raise WeightsError(e.path, f"{e.problem} (expected by {arch})", e.fix) from None


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

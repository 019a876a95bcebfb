"""vitlab's own format: safetensors with the model config (and optional class names) in the metadata.

Also the safetensors header reader the other readers share: it checks the file against its own header so that a
truncated or corrupt file is reported as such instead of failing deep inside a reader.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..errors import WeightsError
from ..models.config import config_from_dict
from ..outputs import atomic_write
from .checkpoint import Checkpoint

FORMAT_TAG = "vitlab"
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit; a larger length means garbage, not a header


def safetensors_header(path: str | Path) -> dict[str, Any]:
    """The parsed JSON header; WeightsError if the file is not safetensors or is shorter than its header says."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
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


def is_vitlab_file(path: str | Path) -> bool:
    meta = safetensors_header(path).get("__metadata__") or {}
    return meta.get("format") == FORMAT_TAG


def save(model: torch.nn.Module, path: str | Path, meta: dict[str, Any] | None = None) -> None:
    """Weights + config (+ meta such as class names) in one safetensors file, written atomically. A name that
    `load` would read as another format (`m.pt`: a PyTorch pickle) is refused, so that load(save(m)) holds."""
    from .files import PICKLE_SUFFIXES

    if Path(path).suffix in PICKLE_SUFFIXES:  # what detect_format reads as a pickle
        raise ValueError(f"{path}: vitlab.save writes safetensors, but a {Path(path).suffix} file is read as a PyTorch "
                         f"pickle; name it {Path(path).with_suffix('.safetensors').name}")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": FORMAT_TAG, "config": model.config.to_json()}
    class_names = (meta or {}).get("class_names", getattr(model, "class_names", None))
    extra = {**(meta or {}), **({"class_names": list(class_names)} if class_names else {})}
    if extra:
        metadata["meta"] = json.dumps(extra)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def read_vitlab(path: str | Path) -> Checkpoint:
    header = safetensors_header(path)
    metadata = header.get("__metadata__") or {}
    if metadata.get("format") != FORMAT_TAG or "config" not in metadata:
        raise WeightsError(path, "safetensors file has no vitlab config", "load it as timm weights with arch=NAME")
    try:
        config = config_from_dict(json.loads(metadata["config"]))
    except RecursionError:
        raise WeightsError(path, "invalid vitlab config in metadata (nested too deeply)", "re-save the model") from None
    except (ValueError, TypeError) as err:
        raise WeightsError(path, f"invalid vitlab config in metadata: {err}", "re-save the model") from None
    _check_header_shapes(path, config, header)
    try:
        meta = json.loads(metadata["meta"]) if "meta" in metadata else {}
    except (json.JSONDecodeError, RecursionError):
        raise WeightsError(path, "corrupt vitlab metadata ('meta' is not JSON)", "re-save the model") from None
    if not isinstance(meta, dict):
        raise WeightsError(path, "corrupt vitlab metadata ('meta' is not an object)", "re-save the model")
    return Checkpoint(config, read_safetensors(path), source="vitlab", meta=meta)


def _check_header_shapes(path: str | Path, config: Any, header: dict[str, Any]) -> None:
    """The config in the metadata against the tensor shapes in the header, before anything is built or read:
    a crafted config (image_size 40000 beside a small position embedding) must not make vitlab allocate for it."""
    from .files import expected_shapes
    from .validate import check_state_dict

    declared = {k: torch.empty(v["shape"], device="meta") for k, v in header.items() if k != "__metadata__"}
    check_state_dict(path, expected_shapes(config, path, len(declared)), declared)

"""vitlab's own format: safetensors with the model config (and optional class names, evaluation resize) in the
metadata; `vitlab.save` writes it, `vitlab.load` reads it back exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vitlab.errors import WeightsError
from vitlab.files.outputs import WEIGHTS, Kind, atomic_write, check_output, mark
from vitlab.models.config import config_from_dict
from vitlab.weights.arguments import check_matches_config, check_model
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import ONNX_SUFFIX, PICKLE_SUFFIXES, is_onnx_path, read_safetensors, safetensors_header
from vitlab.weights.validate import check_state_dict, expected_shapes

FORMAT_TAG = "vitlab"


WEIGHTS_KIND = Kind("vitlab", WEIGHTS)


def is_vitlab_file(path: str | Path) -> bool:
    meta = safetensors_header(path).get("__metadata__") or {}
    return meta.get("format") == FORMAT_TAG


def save(model: torch.nn.Module, path: str | Path, meta: dict[str, Any] | None = None, force: bool = False,
         fix: str | None = None, *, user_named: bool = True,
         inputs: tuple[str | os.PathLike, ...] = ()) -> None:
    """Weights + config (+ meta such as class names) in one safetensors file, written atomically. A name that `load`
    would read as another format (`m.pt`: a PyTorch pickle; `m.onnx`: a graph) is refused, so that load(save(m)) holds.
    The output rule (`outputs.check_output`, weights): an existing file is replaced only if it is vitlab's weights
    (or with `force`), never one of `inputs`, a run's own files, a device, FIFO, socket, link or folder; a refusal
    is a FileExistsError whose one line ends in `fix`. `user_named` False: a run's training writing its own files
    (only special files are refused there: the run's folder was checked when it started)."""
    check_model(model)
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"vitlab.save takes a file path (str or pathlib.Path), got {type(path).__name__}")
    if Path(path).suffix in PICKLE_SUFFIXES:  # what detect_format reads as a pickle
        raise ValueError(f"{path}: vitlab.save writes safetensors, but a {Path(path).suffix} file is read as a PyTorch "
                         f"pickle; name it {Path(path).with_suffix('.safetensors').name}")
    if is_onnx_path(path):  # what predict and eval serve as a graph
        raise ValueError(f"{path}: vitlab.save writes safetensors, but a {ONNX_SUFFIX} file is served as an ONNX "
                         f"graph; name it {Path(path).with_suffix('.safetensors').name} (export_onnx writes ONNX)")
    check_matches_config(model, model.state_dict(), expected_shapes(model.config))  # load must rebuild it
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if user_named:
        check_output(path, force, fix, kind=WEIGHTS_KIND, inputs=inputs)  # before the tensors are copied
    metadata = {"format": FORMAT_TAG, **mark(), "config": model.config.to_json()}
    class_names = (meta or {}).get("class_names", getattr(model, "class_names", None))
    extra = {**(meta or {}), **({"class_names": list(class_names)} if class_names else {})}
    if extra:
        metadata["meta"] = json.dumps(extra)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), user_named=user_named, force=force,
                 kind=WEIGHTS_KIND, inputs=inputs)


def read_vitlab(path: str | Path) -> WeightsRecord:
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
    return WeightsRecord(config, read_safetensors(path), source="vitlab", meta=meta)


def _check_header_shapes(path: str | Path, config: Any, header: dict[str, Any]) -> None:
    """The config in the metadata against the tensor shapes in the header, before anything is built or read:
    a crafted config (image_size 40000 beside a small position embedding) must not make vitlab allocate for it."""
    declared = {k: torch.empty(v["shape"], device="meta") for k, v in header.items() if k != "__metadata__"}
    check_state_dict(path, expected_shapes(config, path, len(declared)), declared)

"""ONNX files that `vitlab export` wrote, served by `vitlab predict` and `vitlab eval` in ONNX Runtime.

The file's metadata (written by `onnx_export`) says how to feed it: `vitlab_config` (the model's config, its
class count included), `image_size` [H, W], `mean` and `std` (the normalisation, per RGB channel, of pixels scaled
to [0, 1]), `eval_resize` (the evaluation resize, a `vitlab.transforms` name), `precision` and, when the weights
had them, `class_names`. The pre-processing is rebuilt from them with the transform PyTorch weights are evaluated
with (`data.transforms.EvalTransform`), so the same image gives the same pixels whichever form of the model runs.

The graph is held to the metadata before anything runs (`check_graph`): one float32 input of rank 4 whose channel and
image sides, where the graph fixes them, are the config's, and one output of rank 2 whose width, where fixed, is the
class count (checked again on every run where it is not). A graph traced for a fixed batch of one image is fed one
image at a time; another fixed batch is refused.

A file is opened as an `InferenceSession` whose model runs the graph on ONNX Runtime's CPU provider: the evaluation
and prediction code that serves PyTorch weights serves it unchanged.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitlab.constants import check_eval_resize
from vitlab.deploy.onnx_check import graph_precision, require_onnxruntime, session
from vitlab.models import config_from_dict
from vitlab.models.config import ModelConfig
from vitlab.runtime.compiling import CompileChoice, compile_request
from vitlab.runtime.precision import Precision
from vitlab.runtime.session import InferenceSession

# What `onnx_export` writes and serving needs: without one of these a file cannot be fed as its weights expect.
REQUIRED_METADATA = ("vitlab_config", "image_size", "mean", "std")
# Files from before the key: evaluated as any weights without a recorded resize are (`eval_resize_of`).
DEFAULT_EVAL_RESIZE = "official"
log = logging.getLogger("vitlab")


class OnnxModel(nn.Module):
    """An exported graph behind a module's call: float32 (N, 3, H, W), normalised, in; (N, classes) logits out,
    computed by ONNX Runtime on the CPU and returned on the input's device. It carries what vitlab's evaluation
    reads from a model: `config`, `class_names` (None when the file has none) and `eval_resize`."""

    def __init__(self, path: Path, ort_session, config: ModelConfig, class_names: list[str] | None,
                 eval_resize: str, one_at_a_time: bool = False):
        super().__init__()
        self.path = path
        self.session = ort_session
        self.input_name = ort_session.get_inputs()[0].name
        self.config = config
        self.class_names = class_names
        self.eval_resize = eval_resize
        self.one_at_a_time = one_at_a_time  # a graph traced for a fixed batch of 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pixels = x.detach().to("cpu", torch.float32).contiguous().numpy()
        parts = [pixels[i : i + 1] for i in range(len(pixels))] if self.one_at_a_time else [pixels]
        logits = np.concatenate([self.session.run(None, {self.input_name: part})[0] for part in parts])
        if logits.ndim != 2 or logits.shape != (len(pixels), self.config.num_classes):
            raise ValueError(f"{self.path}: its graph returned logits of shape {tuple(logits.shape)} for "
                             f"{len(pixels)} images of a {self.config.num_classes}-class model (its metadata); "
                             "re-export the weights (vitlab export)")
        return torch.from_numpy(logits.astype(np.float32, copy=False)).to(x.device)


def open_onnx_session(path: str | os.PathLike, *, device: str = "auto", precision: str = "auto",
                      compile: bool | str = "auto") -> InferenceSession:
    """An inference session on the vitlab-exported ONNX file at `path` (see the module docstring). The file runs
    as exported: on the CPU, in the precision it was exported in; a `device`, `precision` or `compile` that asks
    for something else is refused in one line (they apply to PyTorch weights). ValueError (one line) for a missing
    onnxruntime, a file ONNX Runtime cannot load, or one without vitlab's metadata (naming what is missing)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such ONNX file; export one with: vitlab export WEIGHTS {path}")
    require_onnxruntime()
    try:
        sess = session(path)
    except Exception as err:  # ONNX Runtime's own exception types (InvalidProtobuf, Fail, …)
        said = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ValueError(f"{path} is not an ONNX file ONNX Runtime can load ({said}); export one with: vitlab "
                         f"export WEIGHTS {path}") from None
    meta = dict(sess.get_modelmeta().custom_metadata_map)
    config, names, resize, recorded = _read_metadata(path, meta)
    exported, read_from = graph_precision(path, recorded)  # a graph quantized after export says int8, not its metadata
    _check_settings(path, exported, device, precision, compile)
    if not config.num_classes:
        raise ValueError(f"{path} outputs features (its model has no classifier head); vitlab predict and eval "
                         "need a file that outputs logits: export weights with a head")
    one_at_a_time = check_graph(path, sess, config)
    model = OnnxModel(path, sess, config, names, resize, one_at_a_time).eval()
    reason = f"{read_from}, ONNX Runtime {require_onnxruntime().__version__} (CPU)"
    return InferenceSession(model, torch.device("cpu"), Precision(exported, reason),
                            tuple(names or (str(i) for i in range(config.num_classes))),
                            CompileChoice(False, "ONNX Runtime optimises the graph itself"))


def _read_metadata(path: Path, meta: dict[str, str]) -> tuple[ModelConfig, list[str] | None, str, str]:
    """(config, class names or None, eval resize, precision) from the file's metadata; one line naming what is
    missing or unreadable otherwise."""
    missing = [key for key in REQUIRED_METADATA if key not in meta]
    if missing:
        what = "no vitlab metadata" if len(missing) == len(REQUIRED_METADATA) else "incomplete vitlab metadata"
        raise ValueError(f"{path} has {what} (missing: {', '.join(missing)}), so vitlab cannot tell how to feed "
                         f"it; serve a file vitlab export wrote (vitlab export WEIGHTS {path.name}), or run this "
                         "one in ONNX Runtime with its own pre-processing")
    try:
        config = config_from_dict(json.loads(meta["vitlab_config"]))
        names = json.loads(meta["class_names"]) if "class_names" in meta else None
        image_size, mean, std = (tuple(json.loads(meta[k])) for k in ("image_size", "mean", "std"))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: its vitlab metadata cannot be read ({err}); re-export the weights with this "
                         "vitlab (vitlab export)") from None
    if (image_size, mean, std) != (tuple(config.image_size), tuple(config.mean), tuple(config.std)):
        raise ValueError(f"{path}: its metadata's image_size, mean and std disagree with its vitlab_config; "
                         "re-export the weights (vitlab export)")
    if names is not None and len(names) != config.num_classes:
        raise ValueError(f"{path}: its metadata names {len(names)} classes for a model of {config.num_classes}; "
                         "re-export the weights (vitlab export)")
    resize = meta.get("eval_resize")
    try:
        check_eval_resize(resize if resize is not None else DEFAULT_EVAL_RESIZE)
    except ValueError as err:  # a tampered value would set what one image costs to resize
        raise ValueError(f"{path}: its metadata's {err}; re-export the weights (vitlab export)") from None
    if resize is None:
        log.warning("%s records no eval_resize (exported by an earlier vitlab): resizing as %s; re-export it to "
                    "record the weights' own (vitlab eval also takes --eval-resize)", path, DEFAULT_EVAL_RESIZE)
    return config, names, resize or DEFAULT_EVAL_RESIZE, meta.get("precision", "fp32")


def check_graph(path: Path, ort_session, config: ModelConfig) -> bool:
    """The graph's input and output against the metadata's config (module docstring): one line naming the file and
    the mismatch. Returns whether the graph takes a fixed batch of one image (then fed one at a time)."""
    inputs, outputs = ort_session.get_inputs(), ort_session.get_outputs()
    if len(inputs) != 1 or not outputs:
        raise ValueError(f"{path}: its graph has {len(inputs)} inputs and {len(outputs)} outputs; vitlab feeds one "
                         "input (pixels) and reads one output (logits): serve a file vitlab export wrote")
    pixels, logits = inputs[0], outputs[0]
    h, w = config.image_size
    wanted = {1: config.in_chans, 2: h, 3: w}
    if pixels.type != "tensor(float)":
        raise ValueError(f"{path}: its input {pixels.name!r} is {pixels.type}; vitlab feeds float32 pixels, as vitlab "
                         "export writes them: re-export the weights (vitlab export)")
    shape = list(pixels.shape)
    fixed = {axis: shape[axis] for axis in wanted if len(shape) == 4 and isinstance(shape[axis], int)}
    if len(shape) != 4 or any(fixed[axis] != wanted[axis] for axis in fixed):
        raise ValueError(f"{path}: its input {pixels.name!r} has shape {_shape(shape)}, its metadata says "
                         f"(N, {config.in_chans}, {h}, {w}); re-export the weights (vitlab export)")
    batch = shape[0] if isinstance(shape[0], int) else None
    if batch is not None and batch != 1:
        raise ValueError(f"{path}: its graph takes batches of exactly {batch} images; vitlab serves graphs with a "
                         "dynamic batch (vitlab export writes them) or a batch of 1")
    out = list(logits.shape or [])
    if len(out) != 2 or (isinstance(out[1], int) and out[1] != config.num_classes):
        raise ValueError(f"{path}: its output {logits.name!r} has shape {_shape(out)}, its metadata says "
                         f"(N, {config.num_classes}) logits; re-export the weights (vitlab export)")
    return batch == 1


def _shape(shape: list) -> str:
    return "(" + ", ".join(str(d) if isinstance(d, int) else str(d or "?") for d in shape) + ")"


def _check_settings(path: Path, exported: str, device: str, precision: str, compile: bool | str) -> None:
    """The settings of PyTorch inference that an ONNX file cannot take: each refused in one line."""
    if str(device) not in ("auto", "cpu"):
        raise ValueError(f"--device {device}: {path.name} runs on ONNX Runtime's CPU provider; pass --device cpu "
                         "(or none), or serve the PyTorch weights on the GPU")
    if precision not in ("auto", exported):
        raise ValueError(f"--precision {precision}: {path.name} computes in {exported}, as it was exported; pass "
                         "--precision auto, or export the precision you want (vitlab export --precision)")
    if compile_request(compile) == "on":
        raise ValueError("--compile applies to PyTorch weights; ONNX Runtime optimises the graph itself, so "
                         f"serve {path.name} without it")

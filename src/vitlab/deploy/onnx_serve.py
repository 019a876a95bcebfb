"""ONNX files that `vitlab export` wrote, served by `vitlab predict` and `vitlab eval` in ONNX Runtime.

The file's metadata (written by `onnx_export`) says how to feed it: `vitlab_config` (the model's config, its
class count included), `image_size` [H, W], `mean` and `std` (the normalisation, per RGB channel, of pixels scaled
to [0, 1]), `eval_resize` (the evaluation resize, a `vitlab.transforms` name), `precision` and, when the weights
had them, `class_names`. The pre-processing is rebuilt from them with the transform PyTorch weights are evaluated
with (`data.transforms.EvalTransform`), so the same image gives the same pixels whichever form of the model runs.

A file is opened as an `InferenceSession` whose model runs the graph on ONNX Runtime's CPU provider: the evaluation
and prediction code that serves PyTorch weights serves it unchanged.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch import nn

from vitlab.deploy.onnx_check import graph_precision, require_onnxruntime, session
from vitlab.models import config_from_dict
from vitlab.models.config import ModelConfig
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
                 eval_resize: str):
        super().__init__()
        self.path = path
        self.session = ort_session
        self.input_name = ort_session.get_inputs()[0].name
        self.config = config
        self.class_names = class_names
        self.eval_resize = eval_resize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pixels = x.detach().to("cpu", torch.float32).contiguous().numpy()
        logits = self.session.run(None, {self.input_name: pixels})[0]  # (N, classes)
        return torch.from_numpy(logits).to(x.device)


def open_onnx_session(path: str | os.PathLike, *, device: str = "auto", precision: str = "auto",
                      compile: bool = False) -> InferenceSession:
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
    model = OnnxModel(path, sess, config, names, resize).eval()
    reason = f"{read_from}, ONNX Runtime {require_onnxruntime().__version__} (CPU)"
    return InferenceSession(model, torch.device("cpu"), Precision(exported, reason),
                            tuple(names or (str(i) for i in range(config.num_classes))))


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
    if resize is None:
        log.warning("%s records no eval_resize (exported by an earlier vitlab): resizing as %s; re-export it to "
                    "record the weights' own (vitlab eval also takes --eval-resize)", path, DEFAULT_EVAL_RESIZE)
    return config, names, resize or DEFAULT_EVAL_RESIZE, meta.get("precision", "fp32")


def _check_settings(path: Path, exported: str, device: str, precision: str, compile: bool) -> None:
    """The settings of PyTorch inference that an ONNX file cannot take: each refused in one line."""
    if str(device) not in ("auto", "cpu"):
        raise ValueError(f"--device {device}: {path.name} runs on ONNX Runtime's CPU provider; pass --device cpu "
                         "(or none), or serve the PyTorch weights on the GPU")
    if precision not in ("auto", exported):
        raise ValueError(f"--precision {precision}: {path.name} computes in {exported}, as it was exported; pass "
                         "--precision auto, or export the precision you want (vitlab export --precision)")
    if compile:
        raise ValueError("--compile applies to PyTorch weights; ONNX Runtime optimises the graph itself, so "
                         f"serve {path.name} without it")

"""ONNX export (`vitlab export WEIGHTS model.onnx`, `vitlab.export_onnx(model, path)`): one input `pixels`
(N, 3, H, W), normalised as the weights expect, with a dynamic batch dimension N; one output `logits` (N, classes),
or `features` for a model without a head. H, W are the model's image size (the position embedding is traced at
that size).

The file is checked before it is written: ONNX Runtime runs it at the traced batch size and at another one, and
its output must agree with PyTorch's float32 within the precision's bound (onnx_check.py: float32 1e-5 relative,
int8 10 %); a failing check is one line and no file (the write is atomic).

The exporter is torch's TorchScript-based one (`dynamo=False`): both exporters reproduce ViT, hybrid and BiT
within the bound, and it takes seconds where the dynamo exporter takes far longer (BENCHMARKS.md "int8, ONNX and
compile"), which is what a user waits for on every export.

Precisions: fp32 (and auto, which is fp32: an ONNX file's precision is then the runtime's choice) or int8 (ONNX
Runtime's dynamic quantization of the encoder's MatMul weights, head kept float32). bf16 is refused: ONNX Runtime's
CPU provider has no bf16 kernels (its Conv rejects tensor(bfloat16)), so the check could not run.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vitlab.deploy.onnx_check import (
    FP32_BOUND,
    Agreement,
    compare,
    quantize_graph,
    require_onnx,
    sample_inputs,
    session,
)
from vitlab.files.outputs import ONNX, Kind, atomic_write, check_output, mark_text
from vitlab.runtime.quantize import is_int8

ONNX_KIND = Kind("vitlab export", ONNX)  # what an earlier export left: replaced by the next one

EXPORT_PRECISIONS = ("auto", "fp32", "int8", "bf16")
INT8_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear")  # what the int8 graph computes with
MAX_PROTO_BYTES = 2**31 - 1  # protobuf's limit on one file; larger models need external data, not written here


@dataclass(frozen=True)
class ExportReport:
    path: Path
    precision: str  # "fp32" or "int8"
    bytes: int
    check: Agreement
    note: str = ""  # what the reader would otherwise misread: a widened bound, an int8 file with nothing in int8

    def line(self) -> str:
        c = self.check
        sizes = " and ".join(str(n) for n in c.batch_sizes)
        note = f"; {self.note}" if self.note else ""
        return (f"wrote {self.path} ({self.precision}, {self.bytes / 2**20:.1f} MiB): ONNX Runtime agrees with "
                f"PyTorch float32 within {c.error:.2g} relative (bound {c.bound:.2g}) at batch {sizes}{note}")


def export_onnx(model: nn.Module, path: str | Path, *, precision: str = "fp32", batch_size: int = 2,
                opset: int | None = None, force: bool = False, inputs: tuple[str | os.PathLike, ...] = ()
                ) -> ExportReport:
    """Write `model` (a vitlab model in float32) to `path` as ONNX, checked against ONNX Runtime first (see the
    module docstring). The output rule (outputs.check_output, kind `ONNX_KIND`): never one of `inputs` (the
    weights the model came from) or a run's files, never over weights; `force`: replace a file vitlab did not write.
    ValueError in one line for a missing package, a precision ONNX Runtime cannot check or a failed check; nothing
    is written then."""
    onnx, _ = require_onnx()
    name = _export_precision(precision)
    model = _float32_cpu(model)
    if batch_size < 1:
        raise ValueError(f"batch size must be positive, not {batch_size}")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > MAX_PROTO_BYTES:
        raise ValueError(f"the model's {size / 2**30:.1f} GiB of weights exceed ONNX's 2 GiB for one file (external "
                         "data, which vitlab export does not write); export a smaller model")
    samples = sample_inputs(model, (batch_size, batch_size + 1))
    path = Path(path)
    result: list[Agreement] = []
    quantized: list[int] = []

    def write(tmp: str) -> None:
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".vitlab-onnx-") as work:
            traced = Path(work) / "float32.onnx"
            _trace(model, samples[0], traced, opset)
            if name == "int8":
                quantize_graph(traced, Path(work) / "int8.onnx")
                traced = Path(work) / "int8.onnx"
            proto = onnx.load(str(traced))
            quantized.append(sum(n.op_type in INT8_OPS for n in proto.graph.node))
            _describe(proto, model, name)
            onnx.save(proto, tmp)
        agreement = compare(session(tmp), model, samples, name)
        if not agreement.passed:
            raise ValueError(f"ONNX Runtime's output differs from PyTorch's by {agreement.error:.3g} relative "
                             f"(bound {agreement.bound:.3g}, {name}); nothing written to {path}")
        result.append(agreement)

    atomic_write(path, write, user_named=True, force=force, kind=ONNX_KIND, inputs=inputs)
    return ExportReport(path, name, os.path.getsize(path), result[0], _note(name, result[0], quantized[0]))


def _note(precision: str, check: Agreement, quantized: int) -> str:
    if precision == "int8" and not quantized:
        return "no Linear layer outside the head, so nothing is int8 (BiT: convolutions only)"
    if check.bound > FP32_BOUND and precision == "fp32":
        return (f"the bound is twice PyTorch float32's own error on this input ({check.float32_rounding:.2g} "
                "against float64)")
    return ""


def export_weights(weights: str | Path, path: str | Path, **kwargs) -> ExportReport:
    """`export_onnx` of what `vitlab.load` reads from `weights` (a file, folder, run or published name), which the
    export never replaces."""
    from vitlab.weights.load import load

    require_onnx()  # before minutes of loading
    check_output(path, kwargs.get("force", False), kind=ONNX_KIND, inputs=(weights,))
    return export_onnx(load(weights), path, inputs=(weights,), **kwargs)


def _export_precision(precision: str) -> str:
    if precision not in EXPORT_PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(EXPORT_PRECISIONS)}, not {precision!r}")
    if precision == "bf16":
        raise ValueError("ONNX Runtime's CPU provider has no bf16 kernels, so a bf16 file could not be checked; "
                         "export fp32 (a GPU runtime may compute it in bf16/fp16) or int8")
    return "fp32" if precision == "auto" else precision


def _float32_cpu(model: nn.Module) -> nn.Module:
    """The model to trace: float32, on the CPU, in eval mode; refuse one already prepared for another precision
    (the export applies the precision itself, to the graph)."""
    if getattr(model, "config", None) is None:
        raise ValueError("export_onnx takes a vitlab model (one with a .config): vitlab.load or create_model")
    if is_int8(model) or any(p.dtype != torch.float32 for p in model.parameters()):
        raise ValueError("export the float32 model and pass precision='int8' (or --precision int8) instead of a "
                         "model already converted to another precision")
    if any(p.device.type != "cpu" for p in model.parameters()):
        model = model.to("cpu")
    return model.eval()


def _trace(model: nn.Module, x: torch.Tensor, dst: Path, opset: int | None) -> None:
    output = "logits" if model.config.num_classes else "features"
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        # The tracer's warnings are about Python conditions on shapes (fixed here: only the batch varies, and the
        # check runs a second batch size) and its own deprecation: nothing the user can act on.
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(dst), dynamo=False, input_names=["pixels"], output_names=[output],
                          dynamic_axes={"pixels": {0: "batch"}, output: {0: "batch"}},
                          **({"opset_version": opset} if opset else {}))


def _describe(proto, model: nn.Module, precision: str) -> None:
    """vitlab's mark (doc_string, serialised before the graph, so `outputs.written_by` finds it in the file's
    first bytes) and what a deployment needs to feed the model: its config, normalisation and class names."""
    cfg = model.config
    proto.doc_string = mark_text(ONNX_KIND.writer)
    meta = {"vitlab_config": json.dumps(cfg.to_dict()), "precision": precision,
            "image_size": json.dumps(list(cfg.image_size)), "mean": json.dumps(list(cfg.mean)),
            "std": json.dumps(list(cfg.std))}
    names = getattr(model, "class_names", None)
    if names:
        meta["class_names"] = json.dumps(list(names))
    del proto.metadata_props[:]
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value

"""ONNX export (`vitlab export WEIGHTS model.onnx`, `vitlab.export_onnx(model, path)`): one input `pixels`
(N, 3, H, W), normalised as the weights expect, with a dynamic batch dimension N; one output `logits` (N, classes),
or `features` for a model without a head. H, W are the model's image size (the position embedding is traced at
that size).

The file is checked before it is written: ONNX Runtime runs it at the traced batch size and at another one, and
its output must agree with PyTorch's float32 within the precision's bound (onnx_check.py: float32 1e-5 relative,
int8 10 %); a failing check is one line and no file (the write is atomic).

The exporter is torch's TorchScript-based one (`dynamo=False`): both exporters reproduce ViT, hybrid and BiT
within the bound, and it takes seconds where the dynamo exporter takes far longer (BENCHMARKS.md "int8, ONNX and
compile"), which is what a user waits for on every export. The opsets are `vitlab.ranges.ONNX_OPSET`'s, those it
writes for every vitlab model. What torch prints on the way (warnings, the graph it dumps when it fails) is the
exporter's, not the user's: it is captured, logged at debug level (`vitlab -v export`) and, when the export fails,
summed up in the error's one line.

Precisions: fp32 (and auto, which is fp32: an ONNX file's precision is then the runtime's choice) or int8 (ONNX
Runtime's dynamic quantization of the encoder's MatMul weights, head kept float32). bf16 is refused: ONNX Runtime's
CPU provider has no bf16 kernels (its Conv rejects tensor(bfloat16)), so the check could not run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vitlab.deploy.onnx_check import (
    FP32_BOUND,
    INT8_OPS,
    Agreement,
    compare,
    quantize_graph,
    require_onnx,
    sample_inputs,
    session,
)
from vitlab.errors import setting
from vitlab.files.outputs import ONNX, Kind, atomic_write, check_output, mark_text
from vitlab.models.timm_compat import eval_resize_of
from vitlab.ranges import EXPORT_BATCH, ONNX_OPSET, check_choice
from vitlab.runtime.quantize import is_int8
from vitlab.weights.tensors import is_onnx_path

ONNX_KIND = Kind("vitlab export", ONNX)  # what an earlier export left: replaced by the next one

EXPORT_PRECISIONS = ("auto", "fp32", "int8", "bf16")
MAX_PROTO_BYTES = 2**31 - 1  # protobuf's limit on one file; larger models need external data, not written here
log = logging.getLogger("vitlab.deploy")


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
    weights the model came from) or a run's files, never inside a run or sweep those weights are not from, never
    over weights; `force`: replace a file vitlab did not write.
    ValueError in one line for a missing package, a precision ONNX Runtime cannot check, an export torch cannot
    make or a failed check; nothing is written then. A wrong argument is one line naming it (`check_arguments`)."""
    name = check_arguments(path, precision, batch_size, opset, force)
    onnx, _ = require_onnx()
    check_output(path, force, kind=ONNX_KIND, inputs=inputs)  # before the tracing; again before the rename
    check_onnx_name(path)
    model = _float32_cpu(model)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > MAX_PROTO_BYTES:
        raise ValueError(f"the model's {size / 2**30:.1f} GiB of weights exceed ONNX's 2 GiB for one file (external "
                         "data, which vitlab export does not write); export a smaller model")
    samples = sample_inputs(model, (batch_size, batch_size + 1))
    path = Path(path)
    result: list[Agreement] = []
    quantized: list[int] = []

    def write(tmp: str) -> None:
        # The exporter's own files go in a folder named after the temporary: a failure to write them names the
        # destination (outputs.storage_error), and the folder of a killed export is removed as its temporary is.
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=f"{Path(tmp).name}-") as work:
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


def export_weights(weights: str | Path, path: str | Path, *, precision: str = "fp32", batch_size: int = 2,
                   opset: int | None = None, force: bool = False) -> ExportReport:
    """`export_onnx` of what `vitlab.load` reads from `weights` (a file, folder, run or published name), which the
    export never replaces."""
    from vitlab.weights.load import load

    check_arguments(path, precision, batch_size, opset, force)  # before minutes of loading
    require_onnx()
    check_output(path, force, kind=ONNX_KIND, inputs=(weights,))
    check_onnx_name(path)
    return export_onnx(load(weights), path, precision=precision, batch_size=batch_size, opset=opset, force=force,
                       inputs=(weights,))


def check_arguments(path: object, precision: object, batch_size: object, opset: object, force: object) -> str:
    """The precision to export ("fp32" or "int8"), once every argument but the model is of its type and range
    (`vitlab.ranges`: the command line's flags parse by the same ranges); else a TypeError or ValueError naming the
    argument, before anything is loaded or traced."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a file path (str or pathlib.Path), got {type(path).__name__}")
    name = _export_precision(precision)
    EXPORT_BATCH.check("batch_size", batch_size)
    if opset is not None:
        ONNX_OPSET.check("opset", opset)
    if not isinstance(force, bool):
        raise TypeError(f"force must be True or False, got {force!r}")
    return name


def check_onnx_name(path: str | os.PathLike) -> None:
    """An export's file name ends in .onnx: predict and eval serve a graph by that name, and a graph under a weights
    name (.safetensors, .pt) would be read as weights by everything else."""
    if not is_onnx_path(path):
        raise ValueError(f"{path}: an export is an ONNX graph, which predict and eval serve by its .onnx name; write "
                         f"{Path(path).with_suffix('.onnx').name} (vitlab convert writes weights in other formats)")


def _export_precision(precision: object) -> str:
    check_choice("precision", precision, EXPORT_PRECISIONS)
    if precision == "bf16":
        raise ValueError("ONNX Runtime's CPU provider has no bf16 kernels, so a bf16 file could not be checked; "
                         "export fp32 (a GPU runtime may compute it in bf16/fp16) or int8")
    return "fp32" if precision == "auto" else precision


def _float32_cpu(model: nn.Module) -> nn.Module:
    """The model to trace: float32, on the CPU, in eval mode; refuse one already prepared for another precision
    (the export applies the precision itself, to the graph)."""
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise TypeError(f"model must be a vitlab model (from vitlab.load or create_model: a module with a .config), "
                        f"got {type(model).__name__}")
    if is_int8(model) or any(p.dtype != torch.float32 for p in model.parameters()):
        raise ValueError(f"export the float32 model and pass {setting('precision', value='int8')} instead of a "
                         "model already converted to another precision")
    if any(p.device.type != "cpu" for p in model.parameters()):
        model = model.to("cpu")
    return model.eval()


def _trace(model: nn.Module, x: torch.Tensor, dst: Path, opset: int | None) -> None:
    """`model` traced at `x` into the ONNX file `dst`. The tracer's warnings are about Python conditions on shapes
    (fixed here: only the batch varies, and the check runs a second batch size) and its own deprecations, and its
    C++ side prints the whole graph when it fails: nothing the user can act on, so all of it is logged at debug
    level. A failure of the storage stays an OSError (the caller names the destination); any other is one line."""
    output = "logits" if model.config.num_classes else "features"
    printed: list[str] = []
    try:
        with _captured(printed), torch.inference_mode(False), torch.no_grad():
            torch.onnx.export(model, (x,), str(dst), dynamo=False, input_names=["pixels"], output_names=[output],
                              dynamic_axes={"pixels": {0: "batch"}, output: {0: "batch"}},
                              **({"opset_version": opset} if opset else {}))
    except OSError:
        raise
    except Exception as err:
        said = str(err).strip().splitlines() or [type(err).__name__]
        at = f"opset {opset}" if opset else "its default opset"
        raise ValueError(f"torch's ONNX exporter cannot export this {type(model).__name__} at {at}: {said[0][:300]} "
                         "(what it printed is logged at debug level: vitlab -v export)") from err
    finally:
        if printed:
            log.debug("torch's ONNX exporter said:\n%s", "\n".join(printed))


@contextlib.contextmanager
def _captured(lines: list[str]) -> Iterator[None]:
    """What is printed inside the block, by Python warnings and by native code writing to the process's stdout
    and stderr (file descriptors 1 and 2), appended to `lines` instead of reaching the terminal."""
    with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryFile() as sink:
        warnings.simplefilter("always")
        _flush()
        try:
            saved = [os.dup(1), os.dup(2)]
        except OSError:  # no stdout or stderr to capture (closed by a daemon): native output goes nowhere anyway
            saved = []
        for fd in (1, 2) if saved else ():
            os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            _flush()
            for fd, copy in zip((1, 2), saved, strict=False):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            lines.extend(f"{w.category.__name__}: {w.message}" for w in caught)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def _flush() -> None:
    """Python's and C's buffered output written out, so that each lands on the side of the capture it was
    printed on."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


def _describe(proto, model: nn.Module, precision: str) -> None:
    """vitlab's mark (doc_string, serialised before the graph, so `outputs.written_by` finds it in the file's
    first bytes) and what a deployment needs to feed the model: its config, size, normalisation, evaluation resize
    (the `vitlab.transforms` name, as the weights are evaluated: `onnx_serve` rebuilds the transform from it) and
    class names. The keys are listed for ONNX Runtime users in docs/deployment.md."""
    cfg = model.config
    proto.doc_string = mark_text(ONNX_KIND.writer)
    meta = {"vitlab_config": json.dumps(cfg.to_dict()), "precision": precision,
            "image_size": json.dumps(list(cfg.image_size)), "mean": json.dumps(list(cfg.mean)),
            "std": json.dumps(list(cfg.std)), "eval_resize": eval_resize_of(model)}
    names = getattr(model, "class_names", None)
    if names:
        meta["class_names"] = json.dumps(list(names))
    del proto.metadata_props[:]
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value

"""ONNX Runtime's side of an export: the optional packages, a session on the written file, int8 quantization of
the graph, and the comparison with PyTorch on sample inputs."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch import nn

INSTALL = "pip install 'vitlab[onnx]'"
FP32_BOUND = 1e-5  # ONNX Runtime float32 against PyTorch float32: max |difference| / max |PyTorch logit|
# int8 against PyTorch float32, same measure: well above an honest graph's error (larger on randomly initialised
# models, whose logits have no margins) and well below a broken one's (a wrong scale or a saturated product is off
# by the logits' whole size), so it fails only the broken. The errors: BENCHMARKS.md "Bounds and choices in the code".
INT8_BOUND = 0.10


# What an int8 graph computes with: ONNX Runtime's dynamic quantization (MatMulInteger after DynamicQuantizeLinear,
# or its fused DynamicQuantizeMatMul / MatMulIntegerToFloat) and static QLinear / ConvInteger kernels.
INT8_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear", "MatMulIntegerToFloat",
            "QLinearMatMul", "QLinearConv", "ConvInteger")


def graph_precision(path: str | Path, recorded: str) -> tuple[str, str]:
    """(precision, where it was read) of the ONNX graph at `path`: "int8" when its nodes compute with integer
    kernels (INT8_OPS), however it was quantized (vitlab export --precision int8, or ONNX Runtime's
    quantize_dynamic run on an fp32 export, which keeps the metadata's "fp32"); else the metadata's `recorded`.
    Without the onnx package the graph cannot be read, and the metadata is all there is."""
    try:
        import onnx
    except ImportError:
        return recorded, "metadata (the onnx package, which reads the graph, is missing)"
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    integer = sum(n.op_type in INT8_OPS for n in nodes)
    if integer:
        return "int8", f"{integer} integer-kernel nodes in the graph" + (
            f", metadata says {recorded}" if recorded != "int8" else "")
    return recorded, "as exported"


def require_onnx() -> tuple[ModuleType, ModuleType]:
    """(onnx, onnxruntime), or ValueError in one line with the install command."""
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise ValueError(f"ONNX export needs the onnx and onnxruntime packages ({err.name} is missing): "
                         f"{INSTALL}") from None
    return onnx, onnxruntime


def require_onnxruntime() -> ModuleType:
    """onnxruntime, or ValueError in one line with the install command: running a file needs nothing else."""
    try:
        import onnxruntime
    except ImportError:
        raise ValueError(f"running an ONNX file needs the onnxruntime package, which is missing: {INSTALL}") from None
    return onnxruntime


def session(path: str | Path):
    """An ONNX Runtime CPU session on `path`, using as many threads as torch does."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3  # errors only: its warnings about unused initialisers are not the user's
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def quantize_graph(src: Path, dst: Path) -> None:
    """The float32 graph at `src` with its MatMul weights in int8 (per output channel) and activations quantized
    per batch at run time (ONNX Runtime's dynamic quantization), written to `dst`. The encoder's Linear layers
    (on (N, T, D) tokens) are exported as MatMul; the classifier head (on (N, D)) as Gemm, which stays float32 as
    `vitlab.runtime.quantize` keeps it in PyTorch. The quantizer first rewrites every Gemm as MatMul + Add, the MatMul
    named `<gemm>_MatMul`: both names are excluded (tests/deploy/test_onnx_export.py checks that BiT's head stays
    float)."""
    onnx, _ = require_onnx()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = onnx.load(str(src), load_external_data=False).graph.node
    head = [name for n in nodes if n.name.startswith("/head/") for name in (n.name, f"{n.name}_MatMul")]
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # its advice (root logger) to run a pre-processing script: shapes are static
    try:
        # reduce_range: 7-bit weights. On x86 without VNNI (AVX2, AVX512F) the u8 x s8 products are summed in
        # saturating int16 pairs; full-range weights overflow them (BENCHMARKS.md "int8, ONNX and
        # compile"). The file may run on any machine, so it is written to be exact enough on all of them.
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         op_types_to_quantize=["MatMul"], nodes_to_exclude=head)
    finally:
        logging.disable(previous)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref|; the absolute difference when ref is all zeros (a zero-initialised head)."""
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    diff = float(np.abs(out.astype(np.float64) - ref.astype(np.float64)).max()) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


@dataclass(frozen=True)
class Agreement:
    """ONNX Runtime's output against PyTorch's float32 on sample inputs of two batch sizes."""

    batch_sizes: tuple[int, ...]
    error: float  # the largest relative_error over the batches
    bound: float
    float32_rounding: float  # PyTorch float32 against float64 on the same input: what float32 itself misses

    @property
    def passed(self) -> bool:
        return self.error <= self.bound


def sample_inputs(model: nn.Module, batch_sizes: tuple[int, ...]) -> list[torch.Tensor]:
    """Images of uniform random pixels, normalised as the model's weights expect: realistic input ranges."""
    cfg = model.config
    mean = torch.tensor(cfg.mean).view(1, 3, 1, 1)
    std = torch.tensor(cfg.std).view(1, 3, 1, 1)
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(n, 3, *cfg.image_size, generator=g) - mean) / std for n in batch_sizes]


def compare(sess, model: nn.Module, inputs: list[torch.Tensor], precision: str) -> Agreement:
    """Run every input through the session and through `model` (float32, CPU); the float32 bound is 1e-5, or
    twice float32's own rounding error on these inputs where that is larger (a deep random network can amplify
    rounding past 1e-5, and then no float32 implementation agrees with another more closely than that)."""
    name = sess.get_inputs()[0].name
    errors, rounding = [], 0.0
    # no_grad, not inference_mode: the float64 copy's parameters stay ordinary tensors, whose version counter lets
    # the hybrids' and BiT's weight standardisation reuse its kernels (an inference tensor has none)
    with torch.no_grad():
        wide = copy.deepcopy(model).double() if precision == "fp32" else None
        for x in inputs:
            ref = model(x)
            out = sess.run(None, {name: x.numpy()})[0]
            errors.append(relative_error(out, ref.numpy()))
            if wide is not None:
                rounding = max(rounding, relative_error(ref.double().numpy(), wide(x.double()).numpy()))
    bound = max(FP32_BOUND, 2 * rounding) if precision == "fp32" else INT8_BOUND
    return Agreement(tuple(len(x) for x in inputs), max(errors), bound, rounding)

"""The GEMM peak a benchmark's precision is set against, measured in the same run: a bf16 matmul for bf16, the
dynamic int8 linear `--precision int8` computes with (`vitlab.runtime.quantize`, activation quantization included) for
int8.

Their speed differs by orders of magnitude between processors (bf16: native with AMX or AVX512-BF16, emulated
elsewhere; BENCHMARKS.md "int8, ONNX and compile"), so the size is found, not fixed: it doubles from 256 while
one product takes under a quarter of a second, up to the float32 peak's size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

START_SIZE = 256
STEP_SECONDS = 0.25


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _product(precision: str, size: int, device: torch.device) -> Callable[[], object]:
    """One size x size x size product in `precision`, inputs allocated once."""
    if precision == "int8":
        from vitlab.runtime.quantize import quantize_int8

        layer = quantize_int8(nn.Sequential(nn.Linear(size, size, bias=False)))  # no `head`: every Linear
        x = torch.randn(size, size)
        return lambda: layer(x)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(size, size, device=device, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def precision_peak(precision: str, device: str | torch.device = "cpu", max_size: int = 4096,
                   repeats: int = 3) -> tuple[float, int]:
    """(best GFLOP/s, matrix side) of a square product in `precision` (fp32, bf16 or int8) at the current thread
    count, the side found as the module docstring says."""
    device = torch.device(device)
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"the int8 peak is measured on the CPU only, not {device}")
    size = START_SIZE
    with torch.inference_mode():
        while True:
            step = _product(precision, size, device)
            step()  # warm: first-call allocations and packing
            if size * 2 > max_size or _timed(step, device) >= STEP_SECONDS:
                break
            size *= 2
        best = min((_timed(step, device) for _ in range(repeats)), default=math.inf)
    return 2 * size**3 / best / 1e9, size

"""Throughput of a named model, and of timm's equivalent measured interleaved in the same process.

Inference runs under `torch.inference_mode`; a training step is forward + cross-entropy + backward + AdamW step.
Each implementation gets warm-up steps, then `repeats` timed repeats; the implementations take turns within
every repeat (alternating who goes first) on the same input, threads and optimizer settings, so that a slow
spell of a shared machine hits both. GFLOP/s = 2 × multiply-adds × images/s, with the multiply-adds counted
analytically (`vitlab.models.flops`), and is set against this machine's measured GEMM peak.
"""

from vitlab.bench.compare import TIMM_NAMES, timm_equivalent
from vitlab.bench.machine import environment
from vitlab.bench.measure import build_models, gemm_peak_gflops, make_step, run_benchmark, time_steps
from vitlab.bench.peaks import precision_peak
from vitlab.bench.result import MODES, BenchResult, BenchSettings, Measurement
from vitlab.runtime.allocator import tune_malloc

__all__ = [
    "MODES", "TIMM_NAMES", "BenchResult", "BenchSettings", "Measurement", "build_models", "environment",
    "gemm_peak_gflops", "make_step", "precision_peak", "run_benchmark", "time_steps", "timm_equivalent", "tune_malloc",
]

"""Batch-1 latency of the serving forms, beside `vitlab bench --mode infer`'s throughput: float32, bf16 and int8 as
`vitlab eval --precision` prepares each (`open_session`), and an exported ONNX file in ONNX Runtime (`--onnx`).

The forms take turns call by call (one call of each, then the next round), so a slow spell of a shared machine hits
every form alike; p50 and p90 are the nearest-rank percentiles (`result.percentile`) of each form's calls after its
warm-up.
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn

from vitlab.bench.result import BenchSettings, Latency
from vitlab.runtime.precision import resolve_precision
from vitlab.runtime.session import compile_for_inference, open_session

LATENCY_FORMS = ("fp32", "bf16", "int8")
COMPUTES = {"fp32": "float32 weights and compute", "bf16": "as eval --precision bf16 (a ViT: bf16 weights)",
            "int8": "dynamic int8 Linear layers, head float32"}
MIN_SAMPLES = 20  # calls per form at least, whatever --min-time asks
MAX_SAMPLES = 2000


def serving_forms(model: nn.Module, settings: BenchSettings,
                  device: torch.device) -> list[tuple[str, str, nn.Module, torch.Tensor]]:
    """[(form, how it computes, model, batch-1 input)]: each precision the device runs (int8: the CPU only), then the
    ONNX file of `settings.onnx`; compiled with frozen weights under `settings.compile`."""
    forms = []
    size = settings.image_size
    for name in LATENCY_FORMS:
        if name == "int8" and device.type != "cpu":
            continue
        chosen = resolve_precision(name, device, use="infer")
        session = open_session(copy.deepcopy(model), device=device, precision=chosen)
        prepared = compile_for_inference(session.model) if settings.compile else session.model
        computes = COMPUTES[name] if session.precision.name == name else session.precision.reason  # BiT's int8
        forms.append((name, computes, prepared, torch.randn(1, 3, size, size, device=device)))
    if settings.onnx:
        from vitlab.deploy.onnx_serve import open_onnx_session

        session = open_onnx_session(settings.onnx, device="cpu")
        height, width = session.model.config.image_size
        forms.append((f"onnx {session.precision.name}", session.precision.reason, session.model,
                      torch.randn(1, 3, height, width)))
    return forms


def measure_latency(model: nn.Module, settings: BenchSettings, device: torch.device) -> list[Latency]:
    """Batch-1 latency of every serving form of `model` (see the module docstring): at least `MIN_SAMPLES` calls
    each, and as many as fill `--min-time` × `--repeats` seconds per form."""
    forms = serving_forms(model, settings, device)
    with torch.inference_mode():
        per_call = {}
        for form, _, m, x in forms:
            for _ in range(max(settings.warmup, 1)):
                m(x)
            per_call[form] = _timed(m, x, device)
        budget = settings.min_time * settings.repeats
        n = min(MAX_SAMPLES, max(MIN_SAMPLES, math.ceil(budget / max(max(per_call.values()), 1e-9))))
        samples: dict[str, list[float]] = {form: [] for form, *_ in forms}
        for i in range(n):
            for form, _, m, x in forms if i % 2 == 0 else forms[::-1]:
                samples[form].append(_timed(m, x, device))
    return [Latency(form, reason, [1000 * s for s in samples[form]]) for form, reason, *_ in forms]


def _timed(model: nn.Module, x: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    model(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0

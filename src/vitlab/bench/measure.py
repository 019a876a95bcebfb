"""The measuring protocol of `vitlab bench` (see the package docstring)."""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.bench import forms
from vitlab.bench.compare import timm_equivalent
from vitlab.bench.latency import measure_latency
from vitlab.bench.machine import environment
from vitlab.bench.peaks import precision_peak
from vitlab.bench.result import MODES, BenchResult, BenchSettings, Measurement
from vitlab.models.attention import set_attention_form
from vitlab.models.config import BiTConfig, ViTConfig
from vitlab.models.flops import count_macs
from vitlab.models.registry import build_model, model_config
from vitlab.models.unobserved import unread_tokens_skipped
from vitlab.runtime.allocator import allocator_name, tune_for_compute
from vitlab.runtime.attention import config_attention
from vitlab.runtime.precision import autocast_for
from vitlab.runtime.session import compile_for_inference
from vitlab.weights.timm_bit import to_timm_bit_state_dict


def gemm_peak_gflops(device: str = "cpu", size: int | None = None, repeats: int = 5) -> float:
    """Best GFLOP/s of a large square matmul at the current thread count: fp32 on CPU, bf16 on CUDA (the
    precision the benchmark's autocast computes in)."""
    dev = torch.device(device)
    size = size or (8192 if dev.type == "cuda" else 4096)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a, b = torch.randn(size, size, device=dev, dtype=dtype), torch.randn(size, size, device=dev, dtype=dtype)
    out = torch.empty(size, size, device=dev, dtype=dtype)  # preallocated: time the GEMM, not the allocator
    torch.mm(a, b, out=out)
    best = math.inf
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def build_models(settings: BenchSettings) -> list[tuple[str, str, nn.Module]]:
    """[(impl, name in that library, model)]: vitlab's, then the comparison's with the same weights where the
    tensors map one to one (plain ViTs share timm's names; BiT is renamed to timm's ResNetV2)."""
    overrides = {"num_classes": settings.num_classes, "image_size": settings.image_size}
    ours = build_model(model_config(settings.model, **overrides))
    models = [("vitlab", settings.model, ours)]
    if settings.compare == "timm":
        name, theirs = timm_equivalent(settings.model, settings.num_classes, settings.image_size)
        state = to_timm_bit_state_dict(ours) if isinstance(ours.config, BiTConfig) else ours.state_dict()
        try:
            theirs.load_state_dict(state)
        except RuntimeError:
            pass  # the hybrids name their stems differently; random weights time the same
        models.append(("timm", name, theirs))
    elif settings.compare is not None:
        raise ValueError(f"--compare supports 'timm' only, not {settings.compare!r}")
    return models


def make_step(model: nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor,
              autocast: AbstractContextManager | None = None, plain: nn.Module | None = None) -> Callable[[], None]:
    """One inference pass or one training step (forward, cross-entropy, backward, AdamW) as a closure, under
    `autocast` (default: nothing, float32). The training forward is the trainer's: a vitlab ViT's last block on the
    class token alone while nothing observes it (`vitlab.models.unobserved`); `plain` is the module `model`
    compiles, whose forward the call runs (default: `model` itself)."""
    autocast = nullcontext() if autocast is None else autocast
    plain = model if plain is None else plain
    if mode == "infer":
        model.eval()

        def infer() -> None:
            with torch.inference_mode(), autocast:
                model(x)

        return infer
    model.train()
    # The same optimizer for every implementation: fused AdamW (one kernel over all parameters; CPU and CUDA).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=True)

    def train() -> None:
        with autocast, unread_tokens_skipped(plain):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train


def time_steps(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds for `steps` calls, the garbage collector paused so that it cannot land in one side's repeat."""
    gc.collect()
    gc.disable()
    try:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        return time.perf_counter() - t0
    finally:
        gc.enable()


def run_benchmark(settings: BenchSettings, progress: Callable[[str], None] | None = None) -> BenchResult:
    """Measure every implementation in every mode; see the module docstring for the protocol."""
    _check(settings)
    device = torch.device(settings.device)
    if settings.tune_malloc:
        tune_for_compute()
    malloc = allocator_name()  # what the process runs with, whoever tuned it
    old_threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        torch.manual_seed(settings.seed)
        models = [(impl, name, m.to(device)) for impl, name, m in build_models(settings)]
        chosen = forms.resolve(settings)
        peak, peaks = _peaks(settings, device, chosen.name)
        env = {**environment(settings), "malloc": malloc, "precision": chosen.name}
        if "train" in settings.modes:  # vitlab's model trains in the attention form vitlab train would take
            attention = config_attention(settings.attention, models[0][2].config, device, chosen.name,
                                         settings.batch_size)
            set_attention_form(models[0][2], attention.name)
            env["attention"] = attention.to_dict()
        result = BenchResult(settings, env, peak, precision={"requested": settings.precision, **chosen.to_dict(),
                                                             "forms": forms.describe(chosen, settings.compare)},
                             gemm_peaks=peaks)
        size = (settings.image_size, settings.image_size)
        x = torch.randn(settings.batch_size, 3, *size, device=device)
        y = torch.randint(0, settings.num_classes, (settings.batch_size,), device=device)
        for mode in settings.modes:
            steps = {}
            for impl, _, m in models:
                m = forms.inference_model(impl, m, chosen) if mode == "infer" else m
                plain = m
                if settings.compile:  # inference: weights frozen into the graph; training: the plain form
                    m = compile_for_inference(m) if mode == "infer" else torch.compile(m)
                steps[impl] = make_step(m, mode, x, y, autocast_for(device, chosen), plain)
            times = _interleaved(steps, settings, device, mode, progress)
            for impl, name, _ in models:
                n_steps, seconds = times[impl]
                ips = [settings.batch_size * n_steps / s for s in seconds]
                result.measurements.append(_measurement(settings, impl, name, mode, ips, peak, n_steps))
        if "infer" in settings.modes and settings.latency:
            result.latency = measure_latency(models[0][2], settings, device)
        return result
    finally:
        torch.set_num_threads(old_threads)


def _peaks(settings: BenchSettings, device: torch.device, precision: str) -> tuple[float, dict[str, dict[str, float]]]:
    """(the peak of `precision`, every peak measured): the default peak (fp32 on CPU, bf16 on CUDA) always, so that
    runs at different precisions share one reference, and the precision's own where it differs."""
    size = settings.gemm_size or (8192 if device.type == "cuda" else 4096)
    base = "bf16" if device.type == "cuda" else "fp32"
    peaks = {base: {"gflops": gemm_peak_gflops(settings.device, settings.gemm_size), "size": size}}
    if precision != base:
        gflops, side = precision_peak(precision, device, max_size=size)
        peaks[precision] = {"gflops": gflops, "size": side}
    return peaks[precision]["gflops"], peaks


def _interleaved(
    steps: dict[str, Callable[[], None]], settings: BenchSettings, device: torch.device, mode: str,
    progress: Callable[[str], None] | None,
) -> dict[str, tuple[int, list[float]]]:
    """{impl: (steps per repeat, [seconds per repeat])}; every implementation warms up first, then the
    repeats alternate between them, the first implementation changing every repeat."""
    per_step = {}
    for impl, step in steps.items():
        for _ in range(max(settings.warmup, 1)):
            step()
        per_step[impl] = time_steps(step, 1, device)  # calibrates the steps per repeat
    n = max(1, math.ceil(settings.min_time / min(per_step.values())))
    order = list(steps)
    seconds: dict[str, list[float]] = {impl: [] for impl in steps}
    for r in range(settings.repeats):
        for impl in order if r % 2 == 0 else order[::-1]:
            seconds[impl].append(time_steps(steps[impl], n, device))
            if progress:
                ips = settings.batch_size * n / seconds[impl][-1]
                progress(f"{mode} {impl} repeat {r + 1}/{settings.repeats}: {ips:.2f} img/s")
    return {impl: (n, s) for impl, s in seconds.items()}


def _measurement(
    settings: BenchSettings, impl: str, name: str, mode: str, ips: list[float], peak: float, steps: int
) -> Measurement:
    cfg = model_config(settings.model, num_classes=settings.num_classes, image_size=settings.image_size)
    full = count_macs(cfg)
    # vitlab's inference session and training step compute only the class token in the last block; timm computes
    # every token.
    fast = impl == "vitlab" and isinstance(cfg, ViTConfig)
    executed = count_macs(cfg, class_token_last_block=fast)
    pick = (lambda c: c.total) if mode == "infer" else (lambda c: c.training)
    return Measurement(impl, name, mode, ips, pick(full), pick(executed), peak, steps)


def _check(settings: BenchSettings) -> None:
    if settings.batch_size < 1 or settings.repeats < 1 or settings.image_size < 1:
        raise ValueError("batch size, repeats and image size must be positive")
    if settings.onnx and ("infer" not in settings.modes or not settings.latency):
        raise ValueError("--onnx times the file's batch-1 latency beside inference: add --mode infer, without "
                         "--no-latency")
    if settings.onnx and not os.path.isfile(settings.onnx):
        raise FileNotFoundError(f"{settings.onnx}: no such ONNX file; export one with: vitlab export WEIGHTS "
                                f"{settings.onnx}")
    if settings.threads is not None and settings.threads < 1:
        raise ValueError(f"--threads must be positive, not {settings.threads}")
    bad = [m for m in settings.modes if m not in MODES]
    if bad or not settings.modes:
        raise ValueError(f"modes must be among {MODES}, not {list(settings.modes)}")
    try:
        dev = torch.device(settings.device)
    except RuntimeError as err:
        raise ValueError(f"--device must be cpu or cuda[:N], not {settings.device!r}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"no {dev}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], not {settings.device!r}")
    # Unknown names and sizes the patch size does not divide fail here, with the registry's message.
    model_config(settings.model, image_size=settings.image_size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""Levers toward the bf16 peak, each timed against the form vitlab runs today, interleaved in one process, with the
bf16 GEMM peak measured in the same run (BENCHMARKS.md "Levers toward the peak").

    python benchmarks/levers.py infer --model ViT-B/16 --batch 16   # frozen inference: Inductor options, oneDNN
    python benchmarks/levers.py train --model ViT-S/16 --batch 32   # the bf16 training step

infer (the session's bf16 form, weights in bf16, under torch.inference_mode):
- frozen: `compile_for_inference`, what `--compile` runs (the baseline of the ratios);
- eager: the session's model uncompiled;
- autotune: the same frozen compile with Inductor's max-autotune and its C++ GEMM template beside ATen's;
- onednn: TorchScript traced and frozen with oneDNN graph fusion on (`torch.jit.enable_onednn_fusion`).

train (one fused-AdamW step under bf16 autocast, `--attention` form as given):
- base: float32 parameters, what `vitlab train` runs (the baseline);
- bf16-params: bf16 parameters with a float32 master copy the optimizer steps (autocast's weight casts gone);
- fused-mlp: each block's MLP compiled by Inductor (bias + GELU fused into one kernel, forward and backward).

A form that fails to build is reported with its error and left out. Compiled forms compile in their first call;
run once under `heavy` to fill the Inductor cache before a timed run.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["infer", "train"])
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--forms", nargs="+", help="the forms to time (default: all of the mode's)")
    p.add_argument("--attention", choices=["flash", "matmul"], default="matmul", help="train: the attention form")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=1.5)
    args = p.parse_args()

    import torch

    from vitlab.bench import precision_peak
    from vitlab.runtime import cpu_name, tune_for_compute

    tune_for_compute()
    peak, _ = precision_peak("bf16")
    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; bf16 GEMM peak "
          f"{peak:.1f} GFLOP/s", flush=True)
    if args.mode == "infer":
        name, batch = args.model or "ViT-B/16", args.batch or 16
        steps, flops = infer_forms(name, batch, args.forms)
        base = "frozen"
    else:
        name, batch = args.model or "ViT-S/16", args.batch or 32
        steps, flops = train_forms(name, batch, args.forms, args.attention)
        base = "base"
    seconds = interleaved(steps, args.repeats, args.min_time)
    for form, times in seconds.items():
        ratios = [b / t for b, t in zip(seconds[base], times, strict=True)] if base in seconds else [float("nan")]
        med = statistics.median(times)
        print(f"{name} b{batch} {args.mode} {form:12s}: {batch / med:7.2f} img/s, {flops / med / 1e9:6.1f} GFLOP/s "
              f"({100 * flops / med / 1e9 / peak:5.1f} % of peak); x{statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}) against {base}", flush=True)


def infer_forms(name: str, batch: int, only: list[str] | None) -> tuple[dict, float]:
    import torch

    from vitlab.models import build_model, count_macs, model_config
    from vitlab.runtime import compile_for_inference, frozen_call, open_session

    torch.manual_seed(0)
    cfg = model_config(name, image_size=224)
    model = open_session(build_model(cfg).eval(), device="cpu", precision="bf16").model
    x = torch.randn(batch, 3, 224, 224)
    builders = {
        "frozen": lambda: compile_for_inference(model, say=lambda line: None),
        "eager": lambda: model,
        "autotune": lambda: frozen_call(torch.compile(model, dynamic=False, options={
            "freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"})),
        "onednn": lambda: _onednn(model, x),
    }
    steps = {}
    for form, build in builders.items():
        if only and form not in only:
            continue
        try:
            fn = build()
            t0 = time.perf_counter()
            with torch.inference_mode():
                fn(x)
            print(f"{form}: built, first call {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as err:  # a lever this torch or CPU cannot build: reported, left out
            print(f"{form}: not built ({type(err).__name__}: {str(err).splitlines()[0][:200]})", flush=True)
            continue

        def step(fn=fn) -> None:
            with torch.inference_mode():
                fn(x)

        steps[form] = step
    return steps, 2 * batch * count_macs(cfg).total  # the full model's multiply-adds, as bench's % peak


def _onednn(model, x):
    import torch

    torch.jit.enable_onednn_fusion(True)
    with torch.no_grad():
        traced = torch.jit.freeze(torch.jit.trace(model, x, check_trace=False))
        for _ in range(2):  # the profiling executor fuses after its warm-up calls
            traced(x)
    return traced


def train_forms(name: str, batch: int, only: list[str] | None, attention: str) -> tuple[dict, float]:
    import torch
    import torch.nn.functional as F

    from vitlab.models import build_model, count_macs, model_config, set_attention_form
    from vitlab.runtime import autocast_for

    torch.manual_seed(0)
    cfg = model_config(name, num_classes=1000, image_size=224)
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, 1000, (batch,))
    base_model = set_attention_form(build_model(cfg).train(), attention)

    def plain(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step() -> None:
            with autocast_for("cpu", "bf16"):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    def bf16_params(model):
        params = list(model.parameters())
        master = [p.detach().float().clone().requires_grad_(True) for p in params]
        model.to(torch.bfloat16)
        params = list(model.parameters())
        opt = torch.optim.AdamW(master, lr=1e-4, fused=True)

        def step() -> None:
            with autocast_for("cpu", "bf16"):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            for m, p in zip(master, params, strict=True):
                m.grad = p.grad.float()
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                torch._foreach_copy_(params, master)
            for p in params:
                p.grad = None

        return step

    def fused_mlp(model):
        for block in model.blocks:
            block.mlp = torch.compile(block.mlp, dynamic=False)
        return plain(model)

    builders = {"base": plain, "bf16-params": bf16_params, "fused-mlp": fused_mlp}
    steps = {}
    for form, build in builders.items():
        if only and form not in only:
            continue
        try:
            step = build(copy.deepcopy(base_model))
            t0 = time.perf_counter()
            step()
            print(f"{form}: built, first step {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as err:
            print(f"{form}: not built ({type(err).__name__}: {str(err).splitlines()[0][:200]})", flush=True)
            continue
        steps[form] = step
    return steps, 2 * batch * count_macs(cfg).training


def interleaved(steps: dict, repeats: int, min_time: float) -> dict[str, list[float]]:
    """Seconds per call of each step, `repeats` times: the forms take turns, in reversed order every other repeat,
    each run often enough to last about `min_time`, so that a drift of the machine falls on every form alike."""
    per_call = {}
    for form, step in steps.items():
        step()  # warm
        t0 = time.perf_counter()
        step()
        per_call[form] = time.perf_counter() - t0
    n = max(1, round(min_time / min(per_call.values())))
    order = list(steps)
    seconds: dict[str, list[float]] = {form: [] for form in steps}
    for r in range(repeats):
        for form in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            for _ in range(n):
                steps[form]()
            seconds[form].append((time.perf_counter() - t0) / n)
    return seconds


if __name__ == "__main__":
    sys.exit(main())

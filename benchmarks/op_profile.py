"""Where the time of a bf16 forward or training step goes, op by op (torch.profiler), beside the bf16 GEMM peak
measured in the same run: frozen compiled inference (`--compile`'s form) and a training step (fused AdamW, bf16
autocast) in either attention form (BENCHMARKS.md "What keeps bf16 from the peak").

    python benchmarks/op_profile.py --infer ViT-B/16 --batch 16          # eager and frozen compiled inference
    python benchmarks/op_profile.py --train ViT-S/16 --batch 32          # a training step, flash and matmul

Each case is warmed (compiled), then profiled over --steps calls; the table lists the ops by self CPU time with
their share, the matmul ops (GEMMs, oneDNN linears, SDPA's products) summed apart, and the whole call's rate as a
share of the GEMM peak (multiply-adds from vitlab.models.flops: the forward for inference, 3x it for training).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from vitlab.bench import precision_peak
from vitlab.models import build_model, count_macs, model_config, set_attention_form
from vitlab.runtime import autocast_for, compile_for_inference, cpu_name, open_session, tune_for_compute

GEMM_WORDS = ("addmm", "mm", "bmm", "matmul", "linear", "_linear_pointwise", "mkldnn_rnn", "convolution",
              "flash_attention", "scaled_dot_product", "onednn", "mkl_linear", "baddbmm")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--infer", help="a model to profile in inference (eager bf16 and frozen compiled bf16)")
    p.add_argument("--train", help="a model to profile in a bf16 training step (flash and matmul attention)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=14)
    args = p.parse_args()
    tune_for_compute()
    peak = precision_peak("bf16")[0]
    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; bf16 GEMM peak {peak:.0f} "
          f"GFLOP/s", flush=True)
    if args.infer:
        cfg = model_config(args.infer)
        x = torch.randn(args.batch, 3, *cfg.image_size)
        flops = 2 * count_macs(cfg, class_token_last_block=True).total * args.batch
        torch.manual_seed(0)
        eager = open_session(build_model(cfg), device="cpu", precision="bf16").model
        frozen = compile_for_inference(open_session(build_model(cfg), device="cpu", precision="bf16").model,
                                       say=lambda line: None)
        for label, model in (("eager", eager), ("frozen compiled", frozen)):
            with torch.inference_mode():
                _report(f"{args.infer} inference b{args.batch}, {label}", lambda m=model: m(x), flops, peak, args)
    if args.train:
        cfg = model_config(args.train)
        x = torch.randn(args.batch, 3, *cfg.image_size)
        y = torch.randint(0, cfg.num_classes, (args.batch,))
        flops = 3 * 2 * count_macs(cfg, class_token_last_block=True).total * args.batch
        for form in ("flash", "matmul"):
            torch.manual_seed(0)
            model = set_attention_form(build_model(cfg).train(), form)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

            def step(model=model, opt=opt) -> None:
                with autocast_for("cpu", "bf16"):
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            _report(f"{args.train} training b{args.batch}, {form} attention", step, flops, peak, args)


def _report(label: str, call, flops: float, peak: float, args) -> None:
    for _ in range(2):
        call()  # warm: compile, pack, allocate
    t0 = time.perf_counter()
    for _ in range(args.steps):
        call()
    seconds = (time.perf_counter() - t0) / args.steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            call()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if _is_gemm(e.key))
    print(f"\n{label}: {1e3 * seconds:.1f} ms per call, {flops / seconds / 1e9:.0f} GFLOP/s = "
          f"{100 * flops / seconds / 1e9 / peak:.1f} % of the bf16 peak; matmul ops {100 * gemm / total:.1f} % of "
          f"the profiled time, the rest {100 * (total - gemm) / total:.1f} %", flush=True)
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {100 * e.self_cpu_time_total / total:5.1f} %  {e.self_cpu_time_total / 1e3 / args.steps:8.1f} ms  "
              f"{'GEMM ' if _is_gemm(e.key) else '     '}{e.key[:90]}", flush=True)


def _is_gemm(name: str) -> bool:
    return any(word in name.split("::")[-1] for word in GEMM_WORDS)


if __name__ == "__main__":
    main()

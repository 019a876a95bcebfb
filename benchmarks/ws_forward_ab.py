"""vitlab vs timm inference on the weight-standardised models (ResNet hybrids, BiT), by CPU time on one thread.

Each case builds vitlab's model and timm's with the same weights (timm's holds vitlab's tensors under timm's
names), eval mode, torch.no_grad, float32, and times forwards interleaved (the order flips every repeat) with
`time.thread_time`, which counts only this thread's cycles and so survives other load on a shared machine. It
prints vitlab/timm speed per case (median over repeat pairs, min and max), and with `--profile` the operators
that take vitlab's time at the first case's smallest size (torch.profiler). Run it with another
`PYTHONPATH=…/src` to time another vitlab against the same timm.

    python benchmarks/ws_forward_ab.py --repeats 15
    python benchmarks/ws_forward_ab.py --models vit_small_r26_s32_224 --sizes 64 --batch-sizes 1 --profile
    python benchmarks/ws_forward_ab.py --fx --models vit_small_r26_s32_224 resnetv2_50x1_bit --sizes 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import timm
import torch

import vitlab
from vitlab.weights import to_timm_bit_state_dict, to_timm_state_dict

MODELS = ["vit_tiny_r_s16_p8_224", "vit_small_r26_s32_224", "vit_base_r50_s16_224", "resnetv2_50x1_bit"]


def build(name: str, size: int, fx: bool = False) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(vitlab's, timm's) with the same random weights, taking `size` pixels; vitlab's traced by torch.fx if `fx`."""
    torch.manual_seed(0)
    bit = name.startswith("resnetv2")
    kwargs = {} if bit else {"img_size": size}
    ours = vitlab.create_model(name, **kwargs)
    with torch.no_grad():  # off the zero initialisations (heads, last GroupNorm scales)
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    theirs = timm.create_model(name, **kwargs)
    theirs.load_state_dict(to_timm_bit_state_dict(ours) if bit else to_timm_state_dict(ours))
    ours = torch.fx.symbolic_trace(ours.eval()) if fx else ours
    return ours.eval(), theirs.eval()


def time_pair(models: dict[str, torch.nn.Module], x: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {impl: [] for impl in models}
    with torch.no_grad():
        for m in models.values():  # warm-up (and vitlab's first forward fills its caches)
            m(x)
        for r in range(repeats):
            for impl in list(models) if r % 2 == 0 else list(models)[::-1]:
                t0 = time.thread_time()
                models[impl](x)
                seconds[impl].append(time.thread_time() - t0)
    return seconds


def profile(model: torch.nn.Module, x: torch.Tensor, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch.no_grad():
        model(x)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                model(x)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=MODELS, help="timm names (vitlab takes them too)")
    p.add_argument("--sizes", nargs="+", type=int, default=None, help="default: 64 and 224 (native)")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--profile", action="store_true", help="torch.profiler table of both at the first case")
    p.add_argument("--fx", action="store_true", help="time vitlab's model as a torch.fx.symbolic_trace graph")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    torch.set_num_threads(1)  # thread_time is this thread's time: all compute must run on it
    report = {"settings": vars(args), "torch": torch.__version__, "timm": timm.__version__,
              "vitlab": vitlab.__file__, "cases": []}
    for name in args.models:
        for size in args.sizes or [64, 224]:  # 224: every listed model's native size
            ours, theirs = build(name, size, args.fx)
            for n in args.batch_sizes:
                x = torch.randn(n, 3, size, size)
                if args.profile:
                    for impl, m in (("vitlab", ours), ("timm", theirs)):
                        print(f"--- {impl} {name} {size}px batch {n}\n{profile(m, x)}")
                    args.profile = False
                s = time_pair({"vitlab": ours, "timm": theirs}, x, args.repeats)
                pairs = [t / v for v, t in zip(s["vitlab"], s["timm"], strict=True)]
                case = {"model": name, "size": size, "batch": n, "seconds": s,
                        "ratio_median": statistics.median(pairs), "ratio_min": min(pairs), "ratio_max": max(pairs)}
                report["cases"].append(case)
                print(f"{name:24s} {size:4d}px batch {n:2d}: CPU ms vitlab {1e3 * statistics.median(s['vitlab']):8.2f}"
                      f"  timm {1e3 * statistics.median(s['timm']):8.2f}  vitlab/timm speed median "
                      f"{case['ratio_median']:.3f} (min {min(pairs):.3f}, max {max(pairs):.3f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

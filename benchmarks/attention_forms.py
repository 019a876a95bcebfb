"""The training attention's two forms against each other on this CPU (BENCHMARKS.md "Training attention"): torch's
fused SDPA ("flash") and explicit matmuls ("matmul", `vitlab.models.attention.attend`), forward + backward of the
attention alone over shapes (batch, heads, tokens, head dim) and a whole training step of catalogue models, with
the GEMM peaks of float32 and bf16 measured in the same run; ends by setting the measurements beside what
`--attention auto` (`vitlab.runtime.attention.training_attention`) decides on this CPU.

    python benchmarks/attention_forms.py                         # ops and steps, bf16 (~3 min)
    python benchmarks/attention_forms.py --rows ops --precisions bf16 fp32
    python benchmarks/attention_forms.py --rows steps --models ViT-S/16 --repeats 5

Each pair is timed flash / matmul / matmul / flash ... interleaved in one process (each repeat at least
--min-time seconds); a ratio is flash's seconds over matmul's (above 1: matmul is faster), the median of the
per-repeat ratios with their min-max. bf16 rows compute as training does, under bf16 autocast (q, k, v in bf16);
a step is forward, cross-entropy, backward and fused AdamW, random data at 224 px.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from levers import interleaved  # a sibling script: each form timed in turns, the order reversed every repeat

from vitlab.bench import precision_peak
from vitlab.models import attend, build_model, model_config, set_attention_form
from vitlab.runtime import autocast_for, config_shape, cpu_flags, cpu_name, training_attention, tune_for_compute

# (label, batch, heads, tokens, head dim): the catalogue's training shapes at 224 px and the demo's
OPS = [
    ("ViT-S/16 b32", 32, 6, 197, 64),
    ("ViT-Ti/16 b32", 32, 3, 197, 64),
    ("ViT-B/16 b16", 16, 12, 197, 64),
    ("ViT-S/16 b8", 8, 6, 197, 64),
    ("S/16 shape, 101 tokens b32", 32, 6, 101, 64),
    ("S/16 shape, 50 tokens b32", 32, 6, 50, 64),
    ("demo b128 (17 tokens, hd 32)", 128, 4, 17, 32),
    ("hd 32, 197 tokens b32", 32, 6, 197, 32),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", choices=["ops", "steps"], default=["ops", "steps"])
    p.add_argument("--precisions", nargs="+", choices=["bf16", "fp32"], default=["bf16"])
    p.add_argument("--models", nargs="+", default=["ViT-S/16"])
    p.add_argument("--batch-size", type=int, default=32, help="batch of the steps rows")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--json", help="also write every measurement here")
    args = p.parse_args()
    tune_for_compute()
    flags = cpu_flags()
    peaks = {name: precision_peak(name)[0] for name in ("fp32", "bf16")}
    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, amx_bf16: "
          f"{'amx_bf16' in flags}, avx512_bf16: {'avx512_bf16' in flags}; GEMM peak fp32 {peaks['fp32']:.0f} "
          f"GFLOP/s, bf16 {peaks['bf16']:.0f}", flush=True)
    rows = []
    for precision in args.precisions:
        if "ops" in args.rows:
            for label, n, h, t, hd in OPS:
                row = _op_row(label, n, h, t, hd, precision, args)
                rows.append(row)
                print(_line(row), flush=True)
        if "steps" in args.rows:
            for name in args.models:
                row = _step_row(name, precision, args)
                row["peak_gflops"] = peaks[precision]
                rows.append(row)
                print(_line(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "peaks": peaks, "rows": rows}, f, indent=2)


def _op_row(label: str, n: int, h: int, t: int, hd: int, precision: str, args) -> dict:
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, t, hd, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(n, h, t, hd, generator=g, dtype=dtype)

    def step(form: str):
        def run() -> None:
            attend(q, k, v, form=form).backward(grad)
            q.grad = k.grad = v.grad = None
        return run

    seconds = interleaved({form: step(form) for form in ("flash", "matmul")}, args.repeats, args.min_time)
    # forward + backward of the two products: 3 × the forward's 2 × 2·n·h·t²·hd
    flops = 3 * 4 * n * h * t * t * hd
    decided = training_attention("auto", "cpu", precision=precision, tokens=t, head_dim=hd, batch=n)
    return {"row": "op", "label": label, "precision": precision, "shape": [n, h, t, hd],
            **_ratio(seconds), "flash_ms": 1e3 * statistics.median(seconds["flash"]),
            "matmul_ms": 1e3 * statistics.median(seconds["matmul"]),
            "matmul_gflops": flops / statistics.median(seconds["matmul"]) / 1e9, "auto": decided.name}


def _step_row(name: str, precision: str, args) -> dict:
    torch.manual_seed(0)
    cfg = model_config(name, num_classes=1000, image_size=224)
    x = torch.randn(args.batch_size, 3, 224, 224)
    y = torch.randint(0, 1000, (args.batch_size,))
    steps = {}
    for form in ("flash", "matmul"):
        model = set_attention_form(build_model(cfg).train(), form)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def run(model=model, opt=opt) -> None:
            with autocast_for("cpu", precision):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps[form] = run
    seconds = interleaved(steps, args.repeats, args.min_time)
    shape = config_shape(cfg)
    decided = training_attention("auto", "cpu", precision=precision, tokens=shape["tokens"],
                                 head_dim=shape["head_dim"], batch=args.batch_size)
    return {"row": "step", "label": f"{name} b{args.batch_size}", "precision": precision, **_ratio(seconds),
            "flash_img_s": args.batch_size / statistics.median(seconds["flash"]),
            "matmul_img_s": args.batch_size / statistics.median(seconds["matmul"]), "auto": decided.name}


def _ratio(seconds: dict[str, list[float]]) -> dict:
    ratios = [f / m for f, m in zip(seconds["flash"], seconds["matmul"], strict=True)]
    return {"ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def _line(row: dict) -> str:
    speed = (f"flash {row['flash_ms']:.2f} ms, matmul {row['matmul_ms']:.2f} ms ({row['matmul_gflops']:.0f} GFLOP/s)"
             if row["row"] == "op" else f"flash {row['flash_img_s']:.2f} img/s, matmul {row['matmul_img_s']:.2f}")
    return (f"{row['label']:30s} {row['precision']}: {speed}; matmul x{row['ratio']:.2f} "
            f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f}); auto says {row['auto']}")


if __name__ == "__main__":
    main()

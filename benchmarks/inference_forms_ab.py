"""Inference forms of one model, interleaved in one process: float32 against int8 (`vitlab.runtime.quantize`) or against
`torch.compile` (BENCHMARKS.md "int8, ONNX and compile"). Each repeat runs every form once, the order alternating,
and the ratio reported is the median of the per-repeat ratios, so a shared machine's slow spells hit both sides.

    python benchmarks/inference_forms_ab.py --model ViT-B/16 --batch-size 16 --forms int8 --repeats 3
    python benchmarks/inference_forms_ab.py --model ViT-S/16 --batch-size 16 --forms compile --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import vitlab
from vitlab.runtime import quantize_int8


def build(form: str, model: torch.nn.Module) -> torch.nn.Module:
    if form == "int8":
        return quantize_int8(copy.deepcopy(model))
    if form == "compile":
        return torch.compile(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forms", nargs="+", default=["int8"], choices=["int8", "compile"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = vitlab.create_model(args.model, num_classes=1000, image_size=args.image_size).eval()
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    forms = {"fp32": model, **{f: build(f, model) for f in args.forms}}
    ips: dict[str, list[float]] = {f: [] for f in forms}
    with torch.inference_mode():
        for form, m in forms.items():
            t0 = time.perf_counter()
            m(x)  # warm: allocation, packing, compilation
            print(f"{form}: first call {time.perf_counter() - t0:.1f} s", flush=True)
        for r in range(args.repeats):
            for form in list(forms) if r % 2 == 0 else list(forms)[::-1]:
                t0 = time.perf_counter()
                forms[form](x)
                ips[form].append(args.batch_size / (time.perf_counter() - t0))
    for form, values in ips.items():
        pairs = [a / b for a, b in zip(values, ips["fp32"], strict=True)]
        print(f"{form}: img/s {', '.join(f'{v:.3f}' for v in values)} (median {statistics.median(values):.3f}); "
              f"/ fp32 per repeat {', '.join(f'{v:.2f}' for v in pairs)}, median {statistics.median(pairs):.2f}x")


if __name__ == "__main__":
    main()

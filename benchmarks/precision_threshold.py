"""Measure bf16 against float32 on this CPU over the catalogue's sizes and the experiment models, and print the
width threshold of `--precision auto` (vitlab.runtime.precision.MIN_BF16_WIDTH) that the measurements support.

    python benchmarks/precision_threshold.py                 # inference and training, every model (~15 min)
    python benchmarks/precision_threshold.py --quick         # fewer models and repeats (~3 min)
    python benchmarks/precision_threshold.py --json out.json

Meant for a CPU that computes bf16 natively (flags amx_bf16 or avx512_bf16: Intel Sapphire/Emerald/Granite
Rapids, Cooper Lake, AMD Zen 4); elsewhere bf16 is emulated and every ratio is below 1, which the script says.
Each model is timed fp32 / bf16 / fp32 / bf16 ... interleaved (median of --repeats), in the form vitlab uses:
inference with `prepare_for_inference` (bf16 weights for a ViT) under `autocast_for`; a training step (AdamW,
forward + backward + step) under autocast with float32 master weights. A model "gains" when bf16 is at least
--gain (default 1.05x) faster in both uses. The threshold printed is the smallest width W such that every
measured model of width >= W gains and none below it does; if no W separates them it says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from reproduction.families import MODELS
from vitlab.models.registry import build_model, model_config
from vitlab.runtime.device import cpu_name
from vitlab.runtime.precision import (
    MIN_BF16_WIDTH,
    autocast_for,
    config_width,
    cpu_flags,
    native_bf16,
    prepare_for_inference,
)

# (label, model name, model args, image size, inference batch, training batch)
CATALOGUE = [
    ("ViT-Ti/16", "ViT-Ti/16", {}, 224, 16, 32),
    ("ViT-S/16", "ViT-S/16", {}, 224, 16, 32),
    ("ViT-B/16", "ViT-B/16", {}, 224, 16, 16),
    ("ViT-L/16", "ViT-L/16", {}, 224, 8, 8),
    ("R50+ViT-B/16", "R50+ViT-B/16", {}, 224, 8, 8),
    ("BiT-R50x1", "BiT-R50x1", {}, 224, 16, 16),
]
EXPERIMENTS = [(f"{family}-{size} (experiments)", name, args, 32, 64, 64)
               for (family, size), (name, args) in MODELS.items()]
QUICK = {"ViT-Ti/16", "ViT-S/16", "ViT-B/16", "ViT-M (experiments)", "ViT-L (experiments)", "BiT-L (experiments)"}


def _median_seconds(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _inference(name: str, args: dict, size: int, batch: int, precision: str) -> Callable[[], None]:
    model = prepare_for_inference(build_model(model_config(name, image_size=size, num_classes=1000, **args)).eval(),
                                  precision)
    x = torch.randn(batch, 3, size, size)

    def step() -> None:
        with torch.inference_mode(), autocast_for("cpu", precision):
            model(x)

    return step


def _training(name: str, args: dict, size: int, batch: int, precision: str) -> Callable[[], None]:
    model = build_model(model_config(name, image_size=size, num_classes=1000, **args)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,))

    def step() -> None:
        with autocast_for("cpu", precision):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure(row: tuple, repeats: int) -> dict:
    label, name, args, size, infer_batch, train_batch = row
    result = {"model": label, "width": config_width(model_config(name, **args)), "image_size": size}
    for use, build, batch in (("infer", _inference, infer_batch), ("train", _training, train_batch)):
        steps = {p: build(name, args, size, batch, p) for p in ("fp32", "bf16")}
        for fn in steps.values():  # warm-up: allocations, oneDNN kernel selection
            fn()
        seconds: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for _ in range(repeats):  # interleaved, so that a change of load hits both alike
            for p, fn in steps.items():
                seconds[p].append(_median_seconds(fn, 1))
        fp32, bf16 = statistics.median(seconds["fp32"]), statistics.median(seconds["bf16"])
        result[use] = {"batch": batch, "fp32_img_s": round(batch / fp32, 2), "bf16_img_s": round(batch / bf16, 2),
                       "speedup": round(fp32 / bf16, 3)}
    return result


def threshold(results: list[dict], gain: float) -> tuple[int | None, str]:
    """The smallest width W with every model >= W gaining (both uses) and every one below not gaining."""
    gains = {r["model"]: min(r["infer"]["speedup"], r["train"]["speedup"]) >= gain for r in results}
    if not any(gains.values()):
        return None, f"no measured model gains >= {gain}x from bf16 on this CPU: auto must pick float32 for all"
    widths = sorted({r["width"] for r in results})
    for w in widths:
        if all(gains[r["model"]] == (r["width"] >= w) for r in results):
            return w, f"every measured model of width >= {w} gains >= {gain}x in both uses, none below"
    return None, "no width separates the models that gain from those that do not: see the table"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="six models, 3 repeats")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats per model and use (default 5)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--gain", type=float, default=1.05, help="the speed-up that counts as a gain (default 1.05)")
    p.add_argument("--models", nargs="+", metavar="LABEL", help="only these rows (labels as printed)")
    p.add_argument("--json", metavar="PATH", help="also write the measurements here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    flags = cpu_flags()
    native = [f for f in ("amx_bf16", "avx512_bf16", "amx_int8") if f in flags]
    print(f"{cpu_name()}; flags: {' '.join(native) or 'no native bf16'}; {torch.get_num_threads()} threads; "
          f"torch {torch.__version__}")
    if not native_bf16(flags):
        print("this CPU emulates bf16: expect every ratio below 1 (auto picks float32 here whatever the threshold)")
    wanted = set(args.models or (QUICK if args.quick else ()))
    rows = [r for r in CATALOGUE + EXPERIMENTS if not wanted or r[0] in wanted]
    repeats = 3 if args.quick else args.repeats
    results = []
    print(f"{'model':28} {'width':>5} {'px':>4}  {'infer fp32':>10} {'bf16':>8} {'x':>6}  {'train fp32':>10} "
          f"{'bf16':>8} {'x':>6}")
    for row in rows:
        r = measure(row, repeats)
        results.append(r)
        i, t = r["infer"], r["train"]
        print(f"{r['model']:28} {r['width']:>5} {r['image_size']:>4}  {i['fp32_img_s']:>10} {i['bf16_img_s']:>8} "
              f"{i['speedup']:>5.2f}x  {t['fp32_img_s']:>10} {t['bf16_img_s']:>8} {t['speedup']:>5.2f}x", flush=True)
    width, why = threshold(results, args.gain)
    print(f"threshold supported: {width if width is not None else 'none'} ({why}); "
          "vitlab.runtime.precision.MIN_BF16_WIDTH "
          f"is {MIN_BF16_WIDTH}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "flags": native, "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "results": results, "threshold": width}, f, indent=1)


if __name__ == "__main__":
    main()

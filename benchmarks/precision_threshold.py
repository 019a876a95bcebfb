"""Measure bf16 against float32 on this CPU over sweeps of widths, token counts and head dims, the catalogue's sizes
and the experiment models, and check `--precision auto`'s rule (vitlab.constants.BF16_GAINS, the regions where bf16
gains, one set per use) against them: the models it puts in bf16 that run slower, and those it keeps in float32
that would gain.

    python benchmarks/precision_threshold.py                       # every row set (~35 min)
    python benchmarks/precision_threshold.py --rows widths         # the width sweep alone (~8 min)
    python benchmarks/precision_threshold.py --rows tokens         # the token sweep alone (~8 min)
    python benchmarks/precision_threshold.py --rows heads          # the demo's shape by head dim (~5 min)
    python benchmarks/precision_threshold.py --quick               # fewer models and repeats (~4 min)
    python benchmarks/precision_threshold.py --json out.json

Meant for a CPU that computes bf16 natively (flags amx_bf16 or avx512_bf16: Intel Sapphire/Emerald/Granite
Rapids, Cooper Lake, AMD Zen 4); elsewhere bf16 is emulated and every ratio is below 1, which the script says.
Each model is timed fp32 / bf16 / fp32 / bf16 ... interleaved (median of --repeats), in the form vitlab uses:
inference with `prepare_for_inference` (bf16 weights for a ViT) under `autocast_for`; a training step (fused AdamW
as `vitlab train` takes it, forward + backward + step) under autocast with float32 master weights. A model gains in
a use when bf16 is at least --gain (default 1.05x) faster there, at every batch size measured (the rule has no
batch term).

- widths: a ViT-Ti/16 with width W (64, 128, 192, 256, 384; heads W/64, MLP 4W: 192 is ViT-Ti/16 and 384
  ViT-S/16) at 224 px, inference at batch 1, 8 and 32, training at batch 32.
- tokens: ViT-Ti/16 shapes of width 64, 128, 160 and 192 (head dim 64; 80 at 160) at 64, 112, 160 and 224 px
  (17, 50, 101 and 197 tokens), inference at batch 8, training at 32.
- heads: the demo's shape (ViT-Ti/4, 4 layers, 16 px: 17 tokens, training batch 128) at widths 128-384, head dim
  32 or 64 and MLP ratio 2 or 4: with few tokens the head dim decides the gain as much as the width.
- catalogue, experiments: every catalogue size at 224 px and the experiment models at 32 px.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from reproduction.families import MODELS
from vitlab.constants import BF16_GAINS
from vitlab.models import build_model, model_config
from vitlab.runtime import (
    NATIVE_BF16_FLAGS,
    autocast_for,
    config_shape,
    cpu_flags,
    cpu_name,
    native_bf16,
    prepare_for_inference,
    resolve_precision,
    tune_for_compute,
)
from vitlab.train.optim import fused_adamw_fits

# (label, model name, model args, image size, inference batches, training batch)
WIDTHS = [(f"width {w}", "ViT-Ti/16", {"width": w, "num_heads": max(1, w // 64), "mlp_dim": 4 * w}, 224, (1, 8, 32),
           32) for w in (64, 128, 192, 256, 384)]
CATALOGUE = [
    ("ViT-Ti/16", "ViT-Ti/16", {}, 224, (16,), 32),
    ("ViT-S/16", "ViT-S/16", {}, 224, (16,), 32),
    ("ViT-B/16", "ViT-B/16", {}, 224, (16,), 16),
    ("ViT-L/16", "ViT-L/16", {}, 224, (8,), 8),
    ("R50+ViT-B/16", "R50+ViT-B/16", {}, 224, (8,), 8),
    ("BiT-R50x1", "BiT-R50x1", {}, 224, (16,), 16),
]
TOKENS = [(f"width {w}, {px} px", "ViT-Ti/16", {"width": w, "num_heads": max(1, w // 64), "mlp_dim": 4 * w}, px,
           (8,), 32) for w in (64, 128, 160, 192) for px in (64, 112, 160, 224)]
# The demo's shape (ViT-Ti/4, 4 layers, 16 px: 17 tokens, batch 128) at widths, head dims and MLP ratios: at few
# tokens the per-head attention matmuls are as narrow as the head dim, so it decides the gain as much as the width.
HEADS = [(f"width {w}, head {hd}, MLP {r}x", "ViT-Ti/4",
          {"depth": 4, "width": w, "num_heads": w // hd, "mlp_dim": r * w}, 16, (8,), 128)
         for w, hd, r in ((128, 32, 2), (256, 32, 2), (384, 32, 2), (128, 32, 4), (256, 32, 4), (384, 32, 4),
                          (128, 64, 4), (192, 64, 4), (256, 64, 4), (384, 64, 4), (192, 64, 2), (256, 64, 2))]
EXPERIMENTS = [(f"{family}-{size} (experiments)", name, args, 32, (64,), 64)
               for (family, size), (name, args) in MODELS.items()]
ROWS = {"widths": WIDTHS, "tokens": TOKENS, "heads": HEADS, "catalogue": CATALOGUE, "experiments": EXPERIMENTS}
QUICK = {"width 64", "width 192", "width 384", "ViT-B/16", "ViT-M (experiments)", "BiT-L (experiments)"}


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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw_fits(list(model.parameters())))
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,))

    def step() -> None:
        with autocast_for("cpu", precision):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _timed(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each precision's step, interleaved so that a change of load hits both alike."""
    for fn in steps.values():  # warm-up: allocations, oneDNN kernel selection
        fn()
    seconds: dict[str, list[float]] = {p: [] for p in steps}
    for _ in range(repeats):
        for p, fn in steps.items():
            seconds[p].append(_median_seconds(fn, 1))
    return {p: statistics.median(s) for p, s in seconds.items()}


def _speed(batch: int, seconds: dict[str, float]) -> dict:
    return {"batch": batch, "fp32_img_s": round(batch / seconds["fp32"], 2),
            "bf16_img_s": round(batch / seconds["bf16"], 2), "speedup": round(seconds["fp32"] / seconds["bf16"], 3)}


def measure(row: tuple, repeats: int) -> dict:
    """Inference at each of the row's batches and training at its batch; each use's `speedup` is its smallest."""
    label, name, args, size, infer_batches, train_batch = row
    config = model_config(name, image_size=size, **args)
    result = {"model": label, **config_shape(config), "image_size": size}
    batches = [_speed(b, _timed({p: _inference(name, args, size, b, p) for p in ("fp32", "bf16")}, repeats))
               for b in infer_batches]
    result["infer"] = {"batches": batches, "speedup": min(b["speedup"] for b in batches)}
    train = _speed(train_batch, _timed({p: _training(name, args, size, train_batch, p) for p in ("fp32", "bf16")},
                                       repeats))
    result["train"] = {"batches": [train], "speedup": train["speedup"]}
    return result


def check_rule(results: list[dict], gain: float, use: str) -> tuple[list[str], list[str]]:
    """The measured models on which `auto`'s rule (BF16_GAINS, as resolve_precision reads it on a CPU with native
    bf16) is wrong in `use`: those it puts in bf16 that run slower than float32 there (the rule must never be), and
    those it keeps in float32 that gain at least `gain` (unused gains)."""
    slower, unused = [], []
    for r in results:
        picked = resolve_precision("auto", torch.device("cpu"), use=use, width=r["width"], tokens=r["tokens"],
                                   head_dim=r["head_dim"], flags=frozenset(NATIVE_BF16_FLAGS)).name
        if picked == "bf16" and r[use]["speedup"] < 1.0:
            slower.append(f"{r['model']} ({r[use]['speedup']:.2f}x)")
        if picked == "fp32" and r[use]["speedup"] >= gain:
            unused.append(f"{r['model']} ({r[use]['speedup']:.2f}x)")
    return slower, unused


def _cell(use: dict) -> str:
    return " ".join(f"b{b['batch']} {b['fp32_img_s']}/{b['bf16_img_s']} {b['speedup']:.2f}x" for b in use["batches"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="six models, 3 repeats")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), help="which sets of models (default: all)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats per model and use (default 5)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--gain", type=float, default=1.05, help="the speed-up that counts as a gain (default 1.05)")
    p.add_argument("--models", nargs="+", metavar="LABEL", help="only these rows (labels as printed)")
    p.add_argument("--json", metavar="PATH", help="also write the measurements here")
    args = p.parse_args()
    tune_for_compute()  # the allocator every verb computes with
    if args.threads:
        torch.set_num_threads(args.threads)
    flags = cpu_flags()
    native = [f for f in ("amx_bf16", "avx512_bf16", "amx_int8") if f in flags]
    print(f"{cpu_name()}; flags: {' '.join(native) or 'no native bf16'}; {torch.get_num_threads()} threads; "
          f"torch {torch.__version__}")
    if not native_bf16(flags):
        print("this CPU emulates bf16: expect every ratio below 1 (auto picks float32 here whatever the threshold)")
    sets = args.rows or list(ROWS)
    wanted = set(args.models or (QUICK if args.quick else ()))
    rows = [r for key in sets for r in ROWS[key] if not wanted or r[0] in wanted]
    repeats = 3 if args.quick else args.repeats
    results = []
    print(f"{'model':28} {'width':>5} {'tok':>4} {'px':>4}  inference (batch: fp32/bf16 img/s, bf16 speed-up) | "
          "training")
    for row in rows:
        r = measure(row, repeats)
        results.append(r)
        print(f"{r['model']:28} {r['width']:>5} {r['tokens'] or '-':>4} {r['image_size']:>4}  {_cell(r['infer'])} | "
              f"{_cell(r['train'])}",
              flush=True)
    verdict = {}
    for use in ("infer", "train"):
        slower, unused = check_rule(results, args.gain, use)
        verdict[use] = {"bf16_but_slower": slower, "fp32_but_gains": unused}
        print(f"{use}: BF16_GAINS[{use!r}] = {BF16_GAINS[use]}")
        print(f"  auto picks bf16 where it is slower: {', '.join(slower) or 'none'}")
        print(f"  auto keeps float32 where bf16 gains >= {args.gain}x: {', '.join(unused) or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "flags": native, "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "gain": args.gain, "results": results, "rule": verdict},
                      f, indent=1)


if __name__ == "__main__":
    main()

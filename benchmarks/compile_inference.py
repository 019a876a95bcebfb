"""Compiled inference against eager, interleaved in one process: eager, plain `torch.compile` and `torch.compile`
with Inductor's freezing (`vitlab.runtime.session.compile_for_inference`, what `--compile` does on the inference
verbs), for float32 and bf16 (the session's bf16 form, as `vitlab eval --precision bf16` computes: a ViT's weights
in bf16 under its own autocast), over models and batch sizes (BENCHMARKS.md "Frozen compiled inference").

    python benchmarks/compile_inference.py                               # ViT-Ti/16, S/16, B/16; batch 1, 8, 64
    python benchmarks/compile_inference.py --models ViT-B/16 --batches 16 --precisions bf16 --repeats 5
    python benchmarks/compile_inference.py --cold ...                    # an empty Inductor cache (first-run cost)

For each (model, precision, batch) every form is built and called once (the compiled forms compile in that call:
its seconds less one eager call are the compile seconds), then each repeat times every form for at least
`--min-time` seconds, the order alternating between repeats; a form's ratio to eager is the median of the
per-repeat ratios. The crossing point is the number of images after which compiling has paid for itself:
compile seconds / (eager seconds per image - compiled seconds per image), "never" where the compiled form is not
faster. Runs under torch.inference_mode, random weights and input at the model's native 224 px.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

FORMS = ("eager", "compile", "frozen")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["ViT-Ti/16", "ViT-S/16", "ViT-B/16"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=2.0, help="seconds each timed repeat lasts at least")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--cold", action="store_true", help="compile from an empty Inductor cache (a fresh directory)")
    p.add_argument("--json", help="also write every measurement here")
    args = p.parse_args()
    if args.cold:  # before torch is imported: Inductor reads its cache directory from the environment
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

    import torch

    from vitlab.models import build_model, model_config
    from vitlab.runtime import allocator_name, compile_for_inference, cpu_name, open_session, tune_for_compute

    tune_for_compute()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, malloc: {allocator_name()}, "
          f"Inductor cache: {'empty at start' if args.cold else 'as found'}", flush=True)
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        base = build_model(model_config(name, image_size=args.image_size)).eval()
        for precision in args.precisions:
            prepared = open_session(copy.deepcopy(base), device="cpu", precision=precision).model
            for batch in args.batches:
                x = torch.randn(batch, 3, args.image_size, args.image_size)
                forms = {"eager": prepared, "compile": torch.compile(prepared, dynamic=False),
                         "frozen": compile_for_inference(prepared, say=lambda line: None)}
                first = {}
                with torch.inference_mode():
                    for form, model in forms.items():
                        t0 = time.perf_counter()
                        model(x)
                        first[form] = time.perf_counter() - t0
                    per_call = _seconds(forms["eager"], x, 1)
                    n = max(1, round(args.min_time / per_call))
                    seconds: dict[str, list[float]] = {f: [] for f in forms}
                    order = list(forms)
                    for r in range(args.repeats):
                        for form in order if r % 2 == 0 else order[::-1]:
                            seconds[form].append(_seconds(forms[form], x, n) / (n * batch))
                row = _row(name, precision, batch, seconds, first, per_call)
                rows.append(row)
                print(_line(row), flush=True)
                del forms
                torch._dynamo.reset()  # the next shape compiles from scratch, as a new process would
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows}, f, indent=2)


def _seconds(model, x, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        model(x)
    return time.perf_counter() - t0


def _row(name: str, precision: str, batch: int, seconds: dict[str, list[float]], first: dict[str, float],
         eager_call: float) -> dict:
    eager = seconds["eager"]
    row = {"model": name, "precision": precision, "batch": batch,
           "eager_images_per_s": 1 / statistics.median(eager)}
    for form in ("compile", "frozen"):
        ratios = [e / c for e, c in zip(eager, seconds[form], strict=True)]
        compile_s = max(first[form] - eager_call, 0.0)
        gain = statistics.median(eager) * (1 - 1 / statistics.median(ratios))  # seconds saved per image
        row[form] = {"ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "images_per_s": 1 / statistics.median(seconds[form]), "compile_s": compile_s,
                     "pays_off_after_images": compile_s / gain if gain > 0 else None}
    return row


def _line(row: dict) -> str:
    parts = [f"{row['model']:9s} {row['precision']} batch {row['batch']:3d}: "
             f"eager {row['eager_images_per_s']:7.1f} img/s"]
    for form in ("compile", "frozen"):
        r = row[form]
        pays = "never" if r["pays_off_after_images"] is None else f"{r['pays_off_after_images']:,.0f} images"
        parts.append(f"{form} x{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}), compiled in "
                     f"{r['compile_s']:.1f} s, pays off after {pays}")
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())

"""vitlab vs timm by CPU time on one thread: an A/B check that stays meaningful on a shared machine.

`vitlab bench` measures wall-clock throughput, the figure users see, but on a machine that other processes share
a multi-threaded step stalls at every OpenMP barrier whose other thread is descheduled, and the stalls swamp the
difference being measured. One thread timed with `time.thread_time` counts only the cycles this thread ran, so
the ratio survives other load (memory-bandwidth contention remains). Same models, input, optimizer and
interleaving as `vitlab.bench`.

    python benchmarks/cpu_time_ab.py --model ViT-S/16 --batch-size 32 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vitlab.bench import BenchSettings, build_models, make_step, tune_malloc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="ViT-S/16")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mode", choices=["infer", "train", "both"], default="both")
    p.add_argument("--no-malloc-tuning", action="store_true")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    torch.set_num_threads(1)  # thread_time is this thread's time: all compute must run on it
    tuned = not args.no_malloc_tuning and tune_malloc()
    settings = BenchSettings(model=args.model, batch_size=args.batch_size, image_size=args.image_size,
                             compare="timm")
    torch.manual_seed(0)
    models = build_models(settings)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, settings.num_classes, (args.batch_size,))
    report: dict[str, object] = {"settings": vars(args), "malloc_tuned": tuned, "torch": torch.__version__}
    for mode in ("infer", "train") if args.mode == "both" else (args.mode,):
        steps = {impl: make_step(m, mode, x, y) for impl, _, m in models}
        seconds: dict[str, list[float]] = {impl: [] for impl in steps}
        for step in steps.values():  # warm-up
            step()
        for r in range(args.repeats):
            for impl in list(steps) if r % 2 == 0 else list(steps)[::-1]:
                t0 = time.thread_time()
                steps[impl]()
                seconds[impl].append(time.thread_time() - t0)
        pairs = [t / v for v, t in zip(seconds["vitlab"], seconds["timm"], strict=True)]
        report[mode] = {"cpu_seconds": seconds, "ratio_median": statistics.median(pairs), "ratio_min": min(pairs),
                        "ratio_of_minima": min(seconds["timm"]) / min(seconds["vitlab"])}
        print(f"{mode}: CPU s/step vitlab min {min(seconds['vitlab']):.3f}, timm min {min(seconds['timm']):.3f}; "
              f"vitlab/timm speed ratio median {statistics.median(pairs):.3f}, min {min(pairs):.3f}, "
              f"of minima {min(seconds['timm']) / min(seconds['vitlab']):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

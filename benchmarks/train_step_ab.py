"""A real `vitlab train` run in fresh processes, the arms alternated: glibc's default allocator with the foreach AdamW
step (the training step before the allocator tuning and the fused optimizer), glibc tuned with foreach, glibc tuned
with the fused step (what `vitlab train` does now), and tcmalloc or jemalloc preloaded where the system has them
(BENCHMARKS.md "The allocator and the training step"). Every arm is a new process, so each starts with an empty
heap; each repeat runs every arm once, the order alternating, and the ratios are medians of per-repeat ratios.

    python benchmarks/train_step_ab.py --model ViT-S/16 --precision bf16 --repeats 3
    python benchmarks/train_step_ab.py --model ViT-S/16 --precision fp32 --repeats 3 --arms before now tcmalloc

The speed of an arm is the median over the logged steps (after `--skip`) of the run's model images/s
(metrics.jsonl `images_per_s`: compute time, data waits excluded), on the embedded digits resized to the image size
with the loading in the training process (`--workers 0`; resizing 8x8 digits costs microseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LIBRARIES = {"tcmalloc": ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                          "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"),
             "jemalloc": ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",)}
# arm: (environment added, fused AdamW)
ARMS = {"before": ({"VITLAB_MALLOC_TUNING": "0"}, False), "tuned": ({}, False), "now": ({}, True),
        "tcmalloc": ({"LD_PRELOAD": "tcmalloc"}, True), "jemalloc": ({"LD_PRELOAD": "jemalloc"}, True)}
CHILD = """
import sys
import vitlab.train.optim as optim
if sys.argv[1] == "foreach":
    optim.fused_adamw_fits = lambda params: False
from vitlab.cli import main
sys.exit(main(sys.argv[2:]))
"""


def library(name: str) -> str | None:
    return next((p for p in LIBRARIES[name] if os.path.exists(p)), None)


def run_arm(arm: str, flags: list[str], work: Path, skip: int) -> float:
    extra, fused = ARMS[arm]
    env = {**os.environ, **extra}
    if "LD_PRELOAD" in extra:
        env["LD_PRELOAD"] = library(extra["LD_PRELOAD"]) or ""
    out = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=work)) / "run"
    subprocess.run([sys.executable, "-c", CHILD, "fused" if fused else "foreach", "-q", "train", "--out", str(out),
                    *flags], env=env, check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["images_per_s"] for r in rows if r.get("split") == "train" and r["step"] > skip]
    return statistics.median(speeds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-S/16")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="first steps left out of the median (warm-up)")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS of the runs (default: torch's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--json", help="also write the per-repeat speeds here")
    args = p.parse_args()
    arms = [a for a in args.arms if "LD_PRELOAD" not in ARMS[a][0] or library(ARMS[a][0]["LD_PRELOAD"])]
    for a in set(args.arms) - set(arms):
        print(f"{a}: not installed ({', '.join(LIBRARIES[a])}), left out", file=sys.stderr)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    flags = ["--model", args.model, "--precision", args.precision, "--batch-size", str(args.batch_size),
             "--image-size", str(args.image_size), "--steps", str(args.steps), "--data", "digits", "--workers", "0",
             "--log-every", "1", "--eval-every", str(10 * args.steps), "--warmup", "1"]
    speeds: dict[str, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                speeds[arm].append(run_arm(arm, flags, Path(tmp), args.skip))
                print(f"repeat {r + 1}/{args.repeats} {arm}: {speeds[arm][-1]:.2f} img/s", flush=True)
    base = arms[0]
    print(f"\n{args.model}, {args.precision}, batch {args.batch_size}, {args.image_size} px, {args.steps} steps, "
          f"fresh processes alternated; ratios against '{base}' (median of per-repeat ratios, min-max)")
    for arm in arms:
        pairs = [a / b for a, b in zip(speeds[arm], speeds[base], strict=True)]
        print(f"{arm:9s} {statistics.median(speeds[arm]):8.2f} img/s  x{statistics.median(pairs):.3f} "
              f"({min(pairs):.3f}-{max(pairs):.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "images_per_s": speeds}, indent=2))


if __name__ == "__main__":
    main()

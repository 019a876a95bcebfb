"""Two small training runs one after the other on all cores, against the same two runs side by side on one core
each: what `vitlab experiment --jobs` is for (reproduction/parallel.py). Both arms train the experiments' M models
(ViT-M, BiT-M of reproduction/families.py) on the same data with the same settings; only the scheduling differs.

    .venv/bin/python benchmarks/parallel_runs.py [--steps 200] [--data strokes:64:256] [--out /tmp/parallel_runs]

Prints each arm's wall time and the ratio. Run it on an otherwise idle machine: a busy one slows the arms unevenly.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from reproduction.families import model_settings
from reproduction.parallel import cpu_count
from reproduction.recipes import PRETRAIN_SMALL, source_preprocessing
from reproduction.runner import train_spec
from reproduction.spec import RunSpec


def command(family: str, data: str, steps: int, out: Path) -> list[str]:
    """This script again, training one run as the experiments do (their RunSpec through runner.train_spec)."""
    return [sys.executable, __file__, "--one", family, "--data", data, "--steps", str(steps), "--out", str(out)]


def train_one(family: str, data: str, steps: int, out: Path) -> None:
    settings = {**model_settings(family, "M"), "data": data, "image_size": 32, "batch_size": 64, "steps": steps,
                "lr": 1e-3, "seed": 0, "eval_every": 0, "log_every": steps, "keep_last": 1, **PRETRAIN_SMALL,
                **source_preprocessing(data)}
    train_spec(RunSpec(f"parallel-bench-{family}", "pretrain-i1k", settings), out, None)


def arm(runs: list[list[str]], threads: int, together: bool) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    if together:
        procs = [subprocess.Popen(r, env=env, stdout=subprocess.DEVNULL) for r in runs]
        codes = [p.wait() for p in procs]
    else:
        codes = [subprocess.run(r, env=env, stdout=subprocess.DEVNULL).returncode for r in runs]
    if any(codes):
        raise SystemExit(f"a training run failed (exit codes {codes})")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--data", default="strokes:64:256")
    parser.add_argument("--out", type=Path, default=Path("/tmp/parallel_runs"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a worker: train this family into --out
    args = parser.parse_args()
    if args.one:
        return train_one(args.one, args.data, args.steps, args.out)
    cores = cpu_count()
    results = {}
    for name, threads, together in (("one after the other, all cores each", cores, False),
                                    ("side by side, one core each", 1, True)):
        tag = "side" if together else "seq"
        for family in ("ViT", "BiT"):
            shutil.rmtree(args.out / f"{tag}-{family}", ignore_errors=True)
        runs = [command(f, args.data, args.steps, args.out / f"{tag}-{f}") for f in ("ViT", "BiT")]
        results[name] = arm(runs, threads, together)
        print(f"{name}: {results[name]:.1f} s for ViT-M + BiT-M, {args.steps} steps of 64 each", flush=True)
    sequential, parallel = results.values()
    print(f"side by side is {sequential / parallel:.2f}x as fast ({cores} cores)")


if __name__ == "__main__":
    main()

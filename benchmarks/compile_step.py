"""One training step of the experiments' M models (ViT-M, BiT-M of reproduction/families.py at 32 px, batch 64, 64
classes) on one thread, eager against `torch.compile` (inductor): whether compiling would shorten the experiments'
runs, whose time is this step (reproduction/estimate.py measures the same step inside the trainer).

    .venv/bin/python benchmarks/compile_step.py [--steps 15] [--families ViT BiT]

Prints milliseconds per step (forward, backward, AdamW update) of each arm and the ratio. Both arms start from the
same weights and take the same batch; the compiled arm's first steps (compilation) are not timed.
"""

from __future__ import annotations

import argparse
import time

import torch

from reproduction.families import MODELS
from vitlab.models import ViTConfig, build_model, model_config


def model_m(family: str) -> torch.nn.Module:
    """The family's M model as the experiments pre-train it (ViTs with their `pre_logits` layer)."""
    name, args = MODELS[(family, "M")]
    config = model_config(name, num_classes=64, image_size=32, **args)
    if isinstance(config, ViTConfig):
        config = config.replace(representation_size=config.width)
    return build_model(config).train()


def ms_per_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int = 3) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):  # the compiled arm compiles here
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return 1000 * (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--families", nargs="+", default=["ViT", "BiT"], choices=["ViT", "BiT", "hybrid"])
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each of `vitlab experiment --jobs 2`'s runs
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 64, (64,))
    for family in args.families:
        torch.manual_seed(0)
        eager = ms_per_step(model_m(family), x, y, args.steps)
        torch.manual_seed(0)
        compiled = ms_per_step(torch.compile(model_m(family)), x, y, args.steps)
        print(f"{family}-M, batch 64, 1 thread: eager {eager:.0f} ms/step, torch.compile {compiled:.0f} ms/step: "
              f"{eager / compiled:.2f}x", flush=True)


if __name__ == "__main__":
    main()

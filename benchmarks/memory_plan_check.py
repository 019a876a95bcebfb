"""The memory plan (vitlab.models.memory) against a measured training step on the CPU: one process, AdamW, float32;
the peak RSS during three steps above the RSS after building the model and optimizer state (the kernel's high-water
mark, reset through /proc/self/clear_refs), against the plan's gradients + optimizer state + activations.

    .venv/bin/python benchmarks/memory_plan_check.py --model ViT-S/16 --image-size 64 --batch-size 32
"""

from __future__ import annotations

import argparse

import torch

import vitlab
from vitlab.models import memory_plan


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-S/16")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = vitlab.create_model(args.model, image_size=args.image_size, num_classes=1000).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, 1000, (args.batch_size,))
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    measured = status("VmHWM") - before
    plan = memory_plan(model.config, optimizer="adam")
    planned = plan.gradients + plan.optimizer + args.batch_size * plan.activations_per_image
    print(f"{args.model} at {args.image_size} px, batch {args.batch_size}: measured {measured / 2**20:.0f} MiB above "
          f"the built model, plan {planned / 2**20:.0f} MiB (gradients {plan.gradients / 2**20:.0f}, Adam "
          f"{plan.optimizer / 2**20:.0f}, activations {args.batch_size * plan.activations_per_image / 2**20:.0f}); "
          f"measured/plan {measured / planned:.2f}")


if __name__ == "__main__":
    main()

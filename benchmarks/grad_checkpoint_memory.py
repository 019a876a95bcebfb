"""Activation memory kept for the backward pass, with and without `set_grad_checkpointing()`: the bytes of the
distinct tensor storages autograd saves during one training forward, counted through saved-tensor hooks (a
deterministic count, the same on any device; no allocator statistics needed).

    .venv/bin/python benchmarks/grad_checkpoint_memory.py --model ViT-B/16 --batch-size 8
"""

from __future__ import annotations

import argparse

import torch

import vitlab


def saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd holds for the backward after one forward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).float().square().mean()
    loss.backward()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # parameters are not activations
    return sum(n for ptr, n in storages.items() if ptr not in weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B/16")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = vitlab.create_model(args.model, image_size=args.image_size, num_classes=10).train()
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    plain = saved_bytes(model, x)
    model.set_grad_checkpointing()
    ckpt = saved_bytes(model, x)
    print(f"{args.model} batch {args.batch_size} at {args.image_size}: activations saved for backward "
          f"{plain / 2**20:.0f} MiB without, {ckpt / 2**20:.0f} MiB with gradient checkpointing "
          f"({plain / ckpt:.1f}x less)")


if __name__ == "__main__":
    main()

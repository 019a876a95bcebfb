"""Processes and devices. torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, or a
rendezvous for several nodes) selects distributed mode; parallelism wraps the model from outside (the model
itself knows nothing of DDP or FSDP), as torchtitan does."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..device import pick_device


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device
    owns_group: bool  # we initialised the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device_name: str = "auto") -> Dist:
    """One process per device. Gloo on CPU, NCCL on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = pick_device(device_name, local_rank)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        owns = True
    return Dist(rank, world, local_rank, local_world, device, owns)


def teardown(d: Dist, finished: bool = True) -> None:
    """Leave the process group this process created. After a run that finished, first wait for every rank: a
    rank that destroys its group and exits while a peer is still in its last collective closes the peer's gloo
    connection under it, which can abort the peer at exit ("terminate called without an active exception", seen
    under load in CI after a finished FSDP run). After a failure, no barrier: the other ranks may never arrive
    (torchrun stops them)."""
    if d.owns_group and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, d: Dist, compile: bool, fsdp: bool) -> nn.Module:
    """Compile in place (state-dict keys unchanged), then shard (FSDP2: each block, then the root) or
    replicate (DDP). Returns the module to call for training."""
    model.to(d.device)
    if compile:
        model.compile()
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
        return model
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    return model


def grad_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps but the last."""
    if sync:
        return nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        return _ResyncOnExit(model)
    return nullcontext()


class _ResyncOnExit(AbstractContextManager):
    def __init__(self, model: nn.Module):
        self.model = model

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)


def all_gather_objects(obj: object) -> list[object]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()

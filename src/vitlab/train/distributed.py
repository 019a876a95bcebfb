"""Processes and devices. torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, or a
rendezvous for several nodes) selects distributed mode; parallelism wraps the model from outside (the model
itself knows nothing of DDP or FSDP), as torchtitan does."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import ParamSpec, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from vitlab.runtime.device import pick_device

P = ParamSpec("P")
R = TypeVar("R")


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


TIMEOUT_ENV = "VITLAB_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0  # longer than any step or checkpoint of the paper's models; gloo's own default is 30 min


class PeerLost(RuntimeError):
    """Another process of the job stopped answering (killed, crashed, stopped or cut off): this one cannot go on."""


def collective_timeout() -> float:
    """Seconds a collective (a gradient all-reduce, a barrier) waits for the other processes before the job fails:
    $VITLAB_DIST_TIMEOUT, default 300. A peer that died or was stopped then ends the job in one line instead of
    after gloo's 30 minutes; a phase where one process works alone longer (a few-shot evaluation of a large set
    on rank 0) needs it raised."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 1 <= seconds <= 86_400):
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds from 1 to 86400; set it to the longest "
                         "a process may wait for the others, e.g. 300")
    return seconds


def peer_failure(err: BaseException) -> str | None:
    """What a collective's error says about the other processes, or None if it is not about them: gloo's
    'Connection closed by peer' / 'Connection reset' (a peer died) and 'Timed out' (a peer stopped answering)."""
    text = str(err)
    if not (isinstance(err, getattr(dist, "DistError", ())) or "gloo" in text or "c10d" in text):
        return None  # another part's error (a loader's own timeout, say)
    if "Timed out" in text or "timed out" in text or "Timeout" in text:
        return f"another process did not answer within {collective_timeout():g} s ({TIMEOUT_ENV})"
    if any(s in text for s in ("closed by peer", "Connection reset", "Broken pipe", "Connection refused")):
        return "another process of the job is gone (killed or crashed)"
    return None


def peers_in_one_line(run: Callable[P, R]) -> Callable[P, R]:
    """`run` with the error of a collective whose peer died or stopped answering turned into `PeerLost`: one line
    (vitlab train prints it and exits 1), never gloo's traceback; the job's checkpoints stay valid."""

    @functools.wraps(run)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return run(*args, **kwargs)
        except RuntimeError as err:
            reason = peer_failure(err) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
            if reason is None or isinstance(err, PeerLost):
                raise
            rank = os.environ.get("RANK", "0")
            raise PeerLost(f"process {rank}: {reason}; the job stops here: start every process again with --resume "
                           "to continue from the last checkpoint") from None

    return guarded


def setup(device_name: str = "auto") -> Dist:
    """One process per device. Gloo on CPU, NCCL on CUDA; collectives time out after `collective_timeout()`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = pick_device(device_name, local_rank)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None,
                                timeout=timedelta(seconds=collective_timeout()))
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

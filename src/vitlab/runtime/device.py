"""Devices and the collective every evaluation needs: which device to run on and a sum over the processes of a job
(a no-op in one process). What a device computes in is runtime.precision's."""

from __future__ import annotations

import platform

import torch
import torch.distributed as dist

from vitlab.errors import setting


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`--device` (auto, cpu, cuda, cuda:N) as a torch.device; ValueError naming the choices otherwise.
    auto is CUDA when available; a bare "cuda" means this process's local rank's GPU (torchrun)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{setting('device')} must be auto, cpu, cuda or cuda:N, not {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{setting('device')} must be auto, cpu, cuda or cuda:N, not {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{setting('device', value='cuda')} but no CUDA device is available; use "
                             f"{setting('device', value='cpu')}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"no {device}: torch sees {torch.cuda.device_count()} CUDA device(s); use cuda:0")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In place over all processes; a no-op in a single process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo), for results that must say where they were measured: float32
    training is repeatable on one machine but not across processors (their kernels round differently)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

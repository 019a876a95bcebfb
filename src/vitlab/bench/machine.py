"""The machine side of a benchmark: what to record for reproduction, and the allocator setting."""

from __future__ import annotations

import ctypes
import datetime
import os
import platform
from typing import Any

import torch

from vitlab.bench.result import BenchSettings
from vitlab.runtime.device import cpu_name


def environment(settings: BenchSettings) -> dict[str, Any]:
    """What a reader needs to reproduce the numbers: versions, machine, threads, precision, date."""
    env: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_name(),
        "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "precision": "bf16 autocast" if settings.device.startswith("cuda") else "fp32",
    }
    if settings.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(settings.device))
    if settings.compare == "timm":
        import timm

        env["timm"] = timm.__version__
    return env


def tune_malloc() -> bool:
    """Process-wide, irreversible: glibc maps every allocation above 32 MB afresh with mmap and returns freed heap
    to the OS, so the large activations of every layer are page-faulted in again on every step (a cost that
    varies from run to run; BENCHMARKS.md "Protocol"). Serving all allocations from a heap that is never
    trimmed removes that cost and its noise for every implementation alike. False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))

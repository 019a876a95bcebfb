"""The machine side of a benchmark: what to record for reproduction."""

from __future__ import annotations

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

"""How a model runs: the device, the precision it computes in (and int8 quantization), and the one inference
set-up every verb uses."""

from vitlab.runtime.device import cpu_name, pick_device
from vitlab.runtime.precision import autocast_for, resolve_precision

__all__ = ["autocast_for", "cpu_name", "pick_device", "resolve_precision"]

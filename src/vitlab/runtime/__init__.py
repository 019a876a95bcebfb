"""How a model runs: the device, the precision it computes in (and int8 quantization), and the one inference
set-up every verb uses (`open_session`)."""

from vitlab.runtime.device import cpu_name, pick_device
from vitlab.runtime.precision import autocast_for, resolve_precision
from vitlab.runtime.session import InferenceSession, open_session

__all__ = ["InferenceSession", "autocast_for", "cpu_name", "open_session", "pick_device", "resolve_precision"]

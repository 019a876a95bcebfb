"""How a model runs: the device, the precision it computes in (and int8 quantization), the attention form and the
allocator tuning a run chooses, and the one inference set-up every verb uses (`open_session`)."""

from vitlab.lazy import lazy_names
from vitlab.runtime.allocator import allocator_name, tune_for_compute
from vitlab.runtime.attention import training_attention
from vitlab.runtime.device import cpu_name, pick_device
from vitlab.runtime.precision import (
    NATIVE_BF16_FLAGS,
    autocast_for,
    config_shape,
    cpu_flags,
    native_bf16,
    prepare_for_inference,
    resolve_precision,
)
from vitlab.runtime.session import InferenceSession, compile_for_inference, frozen_call, open_session

_LAZY = {"quantize_int8": "quantize"}  # read on first use: only int8 inference needs torch's quantization


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = ["NATIVE_BF16_FLAGS", "InferenceSession", "allocator_name", "autocast_for", "compile_for_inference",
           "config_shape", "cpu_flags", "cpu_name", "frozen_call", "native_bf16", "open_session", "pick_device",
           "prepare_for_inference", "quantize_int8", "resolve_precision", "training_attention", "tune_for_compute"]

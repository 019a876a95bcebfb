"""Dynamic int8 inference for the Linear layers (`--precision int8`): weights stored as int8 with one scale per
output channel, activations quantized per batch on the fly, products in int8 with int32 accumulation, CPU only.

Which library (measured, BENCHMARKS.md "int8"): torch's FBGEMM/oneDNN dynamic linear kernels
(`torch.ao.quantization.quantize_dynamic`) are fast on every x86 CPU with AVX2 and need nothing beyond torch.
torchao's `Int8DynamicActivationInt8WeightConfig`, the maintained successor, has no fast eager CPU kernel: one
ViT-B/16 batch took 20x float32's time on the AMD EPYC we measured on, so it is not used. `torch.ao.quantization`
warns that it is deprecated; the warning is vitlab's to handle, not the user's, so it is silenced here (and an
import failure, on a torch that removed it, becomes one line). ONNX Runtime's dynamic quantization is what
`vitlab export --precision int8` uses (`vitlab.deploy`).

The classifier head stays float32: it costs nothing next to the encoder and its rounding would move the top-1
choice between near-tied classes. Convolutions (patch embedding, the hybrids' and BiT's ResNets) stay float32:
dynamic quantization covers Linear layers only, so BiT gains nothing from int8.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

# The messages torch emits on the way (its module deprecation, quantized tensor creation): vitlab's concern.
_DEPRECATION_MESSAGES = (r"torch\.ao\.quantization is deprecated", r"torch\.quantize_per_tensor",
                         r".*quantized tensor creation", r".*is deprecated and will be removed")


def quantize_int8(model: nn.Module) -> nn.Module:
    """`model`'s encoder Linear layers replaced, in place, by dynamic int8 ones (returned for chaining); the head
    (`model.head`) keeps float32. ValueError when the model is not on the CPU (the kernels are CPU-only)."""
    params = list(model.parameters())
    if params and params[0].device.type != "cpu":
        raise ValueError(f"int8 inference runs on the CPU only, and the model is on {params[0].device}; use "
                         "--device cpu, or --precision bf16 on a GPU")
    quantize_dynamic, qconfig = _torch_dynamic_quantization()
    head = getattr(model, "head", None)
    targets = {name for name, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head}
    if not targets:
        return model  # nothing to quantize (BiT: its head is the only Linear): the float32 model unchanged
    model.eval()
    with warnings.catch_warnings():
        for message in _DEPRECATION_MESSAGES:
            warnings.filterwarnings("ignore", message=message)
        quantize_dynamic(model, {name: qconfig for name in targets}, dtype=torch.qint8, inplace=True)
    return model


def is_int8(model: nn.Module) -> bool:
    """Whether `quantize_int8` replaced any of the model's layers."""
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())


def _torch_dynamic_quantization():
    """(quantize_dynamic, per-channel dynamic qconfig), imported with its deprecation warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        except ImportError as err:
            raise ValueError(f"--precision int8 needs torch's dynamic quantization, which this torch "
                             f"{torch.__version__} lacks ({err}); use --precision fp32") from None
    return quantize_dynamic, per_channel_dynamic_qconfig

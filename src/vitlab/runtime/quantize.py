"""Dynamic int8 inference for the Linear layers (`--precision int8`): weights stored as int8 with one scale per
output channel, activations quantized per batch on the fly, products in int8 with int32 accumulation, CPU only.

Which bits go where: on x86 without VNNI (AVX2, AVX512F) the u8 x s8 products are summed in pairs in saturating
int16, so 8-bit activations times 8-bit weights can overflow and move the logits far. torch's dynamic Linear
avoids it by giving activations 7 bits (`reduce_range`); vitlab gives the 7 bits to the weights instead
(symmetric per output channel, -64..63) and keeps 8 for the activations: 255 x 64 x 2 < 32767, so no product pair
saturates on any x86 CPU, and the error halves because activations are quantized per tensor (one scale for the
whole batch) while weights have a scale per channel; the speed is the same (the error and agreement figures:
BENCHMARKS.md "int8 and compile on a quiet machine"). ONNX files get the same split (`vitlab.deploy.onnx_check`).

Which library (BENCHMARKS.md "int8 and compile on a quiet machine" and "int8, ONNX and compile"): torch's
FBGEMM/oneDNN dynamic linear kernels (`torch.ao.quantization.quantize_dynamic`) are fast on every x86 CPU with
AVX2 and need nothing beyond torch; the weights are packed for oneDNN's (`PACKING_ENGINE`, the faster of the two
at the batch sizes eval and predict run). torchao's `Int8DynamicActivationInt8WeightConfig`, the maintained
successor, has no fast eager CPU kernel (far slower than float32), so it is not used. `torch.ao.quantization`
warns that it is deprecated; the warning is vitlab's to handle, not the user's, so it is silenced here (and an
import failure, on a torch that removed it, becomes one line). ONNX Runtime's dynamic quantization is what
`vitlab export --precision int8` uses (`vitlab.deploy`).

The classifier head stays float32: it costs nothing next to the encoder and its rounding would move the top-1
choice between near-tied classes. Convolutions (patch embedding, the hybrids' and BiT's ResNets) stay float32:
dynamic quantization covers Linear layers only, so BiT gains nothing from int8.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
from torch import nn

from vitlab.errors import setting

with warnings.catch_warnings():  # torch.ao.nn.quantized warns that it is deprecated: vitlab's concern
    warnings.simplefilter("ignore")
    try:
        from torch.ao.nn.quantized.dynamic import Linear as _DynamicLinear
    except ImportError:  # a torch without it: quantize_int8 says so in one line (_torch_dynamic_quantization)

        class _DynamicLinear(nn.Module):  # never instantiated: is_int8 is then False for every model
            pass

# Whose kernels compute the int8 products: oneDNN's, which beat FBGEMM's (torch's default "x86" engine) at batch 16
# and more, the batches eval (256) and predict (32) run; FBGEMM leads only at batch 1. oneDNN packs where torch has
# it. The figures: BENCHMARKS.md "int8 and compile on a quiet machine".
PACKING_ENGINE = "onednn"

# The messages torch emits on the way (its module deprecation, quantized tensor creation): vitlab's concern.
_DEPRECATION_MESSAGES = (r"torch\.ao\.quantization is deprecated", r"torch\.quantize_per_tensor",
                         r".*quantized tensor creation", r".*is deprecated and will be removed")


def quantize_int8(model: nn.Module) -> nn.Module:
    """`model`'s encoder Linear layers replaced, in place, by dynamic int8 ones (7-bit weights per output channel,
    8-bit activations per batch; returned for chaining); the head (`model.head`) keeps float32. ValueError when the
    model is not on the CPU (the kernels are CPU-only)."""
    params = list(model.parameters())
    if params and params[0].device.type != "cpu":
        raise ValueError(f"int8 inference runs on the CPU only, and the model is on {params[0].device}; use "
                         f"{setting('device', value='cpu')}, or {setting('precision', value='bf16')} on a GPU")
    quantize_dynamic, qconfig = _torch_dynamic_quantization()
    head = getattr(model, "head", None)
    targets = {name for name, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head}
    if not targets:
        return model  # nothing to quantize (BiT: its head is the only Linear): the float32 model unchanged
    model.eval()
    with warnings.catch_warnings(), _packing_engine(PACKING_ENGINE):
        for message in _DEPRECATION_MESSAGES:
            warnings.filterwarnings("ignore", message=message)
        quantize_dynamic(model, {name: qconfig for name in targets}, dtype=torch.qint8, inplace=True)
    for m in model.modules():
        if type(m) is _DynamicLinear:
            m.__class__ = Int8DynamicLinear  # the same packed weights; only forward differs
    return model


@contextmanager
def _packing_engine(name: str):
    """torch's quantized engine set to `name` while weights are packed, then restored: the packed weights keep the
    engine's kernels whatever the global setting is when they run, so nothing outside vitlab changes."""
    previous = torch.backends.quantized.engine
    if name not in torch.backends.quantized.supported_engines:  # e.g. ARM builds: the default engine packs
        yield
        return
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def is_int8(model: nn.Module) -> bool:
    """Whether `quantize_int8` replaced any of the model's layers."""
    return any(isinstance(m, _DynamicLinear) for m in model.modules())


class Int8DynamicLinear(_DynamicLinear):
    """torch's dynamic int8 Linear, computing with 8-bit activations (`reduce_range=False`): its weights come
    7-bit from `_torch_dynamic_quantization`'s qconfig, which is what makes full-range activations safe."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False)
        return y.to(x.dtype)

    def _get_name(self) -> str:
        return "Int8DynamicLinear"


def _torch_dynamic_quantization():
    """(quantize_dynamic, the qconfig: 7-bit symmetric weights per output channel, 8-bit dynamic activations),
    imported with torch's deprecation warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torch.ao.quantization import PerChannelMinMaxObserver, PlaceholderObserver, QConfig, quantize_dynamic
        except ImportError as err:
            raise ValueError(f"{setting('precision', value='int8')} needs torch's dynamic quantization, "
                             "which this torch "
                             f"{torch.__version__} lacks ({err}); use {setting('precision', value='fp32')}") from None
    qconfig = QConfig(
        activation=PlaceholderObserver.with_args(dtype=torch.quint8, quant_min=0, quant_max=255, is_dynamic=True),
        weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                                  quant_min=-64, quant_max=63),
    )
    return quantize_dynamic, qconfig

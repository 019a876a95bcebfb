"""How each implementation computes under `vitlab bench --precision`: the precision resolved as every verb resolves
it (vitlab.runtime.precision), then each library in its own fastest form of it, which is what a user of each gets.

- fp32: both as they are.
- bf16, inference: vitlab as `vitlab eval --precision bf16` runs (`prepare_for_inference`: a ViT's weights cast to
  bf16, hybrids and BiT under autocast); timm under bf16 autocast with float32 weights (timm's own
  `--amp --amp-dtype bfloat16`). Training, both: bf16 autocast, float32 master weights and AdamW state.
- int8 (inference only): both with their encoder's Linear layers in dynamic int8 (`vitlab.runtime.quantize`), heads
float32.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitlab.bench.result import BenchSettings
from vitlab.models.registry import model_config
from vitlab.runtime.precision import Precision, config_shape, resolve_precision
from vitlab.runtime.session import open_session


def resolve(settings: BenchSettings) -> Precision:
    """The precision both implementations compute in; int8 with training refused in one line."""
    if settings.precision == "int8" and "train" in settings.modes:
        raise ValueError("--precision int8 measures inference only (there is no int8 training): add --mode infer")
    config = model_config(settings.model, image_size=settings.image_size)
    use = "train" if "train" in settings.modes else "infer"
    return resolve_precision(settings.precision, torch.device(settings.device), use=use, **config_shape(config))


def describe(precision: Precision, compare: str | None) -> str:
    """Each implementation's form, in words, for the table's header and the JSON."""
    other = f"; {compare}: bf16 autocast, float32 weights" if compare else ""
    return {
        "fp32": "float32 weights and compute",
        "bf16": f"inference: vitlab as eval --precision bf16 (ViT: bf16 weights){other}; training: bf16 autocast, "
                "float32 master weights",
        "int8": "dynamic int8 Linear layers, heads float32" + (f" (vitlab and {compare} alike)" if compare else ""),
    }[precision.name]


def inference_model(impl: str, model: nn.Module, precision: Precision) -> nn.Module:
    """The model `impl` runs inference with: the inference session's copy for vitlab (as `eval` and `predict` run
    it) and for timm where the precision converts (int8); the original stays float32 for the training mode that
    may follow."""
    if precision.name == "int8" or impl == "vitlab":
        device = next(model.parameters()).device
        return open_session(copy.deepcopy(model), device=device, precision=precision).model
    return model


"""The precision a model computes in: one setting (`--precision auto|fp32|bf16|int8`, `vitlab.load(precision=)`)
resolved once per run by a measured rule, then applied in the fastest form for the use.

The rule for `auto` (the measurements behind it: BENCHMARKS.md "bf16 on a CPU that computes it natively"):

- CUDA: bf16 (tensor cores compute it natively; training and evaluation run under bf16 autocast there).
- CPU without a native bf16 instruction (no `amx_bf16` and no `avx512_bf16` flag, e.g. AMD Zen 2/3): float32;
  bf16 is emulated there and always slower.
- CPU with one: bf16 when the model lies in a region where bf16 was measured to gain in the use (`BF16_GAINS`:
  inference and training have their own, since a training step adds the backward's attention and the float32
  optimizer step), float32 elsewhere. A region bounds the width (the inner dimension of the matmuls, what AMX tiles
  and AVX512-BF16 dot products need to amortise the casts) and, for a ViT, the tokens per image and the head dim:
  with few tokens the attention's matmuls are as narrow as the head dim, so a ViT of head dim 32 on small images
  trains slower in bf16 at widths where one of head dim 64 gains, while at 197 tokens any width from 64 gains.
  Models outside every region either lost or are unmeasured and stay float32, so `auto` is never slower than
  float32 on a measured model.
  `benchmarks/precision_threshold.py`, run on such a machine, measures sweeps of widths, token counts and head
  dims, every catalogue size and experiment model, and names the measured models on which the rule is wrong.

Exactness paths (`convert`, `info`, the parity tests, `--precision fp32`) compute in float32 always.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import MethodType

import torch
from torch import nn

from vitlab.constants import BF16_GAINS, SHAPE_WORDS
from vitlab.errors import setting

PRECISIONS = ("auto", "fp32", "bf16", "int8")
USES = ("train", "infer")
USE_WORDS = {"train": "training", "infer": "inference"}
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class Precision:
    """The resolved choice (fp32, bf16 or int8; never auto) and why, as the banner and config.json show it."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


FP32 = Precision("fp32", "float32 (exact)")


def cpu_flags(cpuinfo_text: str | None = None) -> frozenset[str]:
    """The processor's feature flags (the `flags` line of /proc/cpuinfo, or of `cpuinfo_text` for tests); empty
    where the file is absent (macOS, Windows): no flag is then assumed."""
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo_text = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / ARM
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str] | set[str]) -> bool:
    """Whether the CPU computes bf16 matmuls in hardware (AMX or AVX512-BF16); elsewhere torch emulates them."""
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def model_shape(model: nn.Module) -> dict[str, int | None]:
    """The bounds `auto` compares with `BF16_GAINS` (`config_shape` of the model's config); width None for a model
    without a vitlab config."""
    return config_shape(getattr(model, "config", None))


def config_shape(config: object) -> dict[str, int | None]:
    """A config's width, tokens per image and head dim, as `resolve_precision` takes them."""
    return {"width": config_width(config), "tokens": config_tokens(config), "head_dim": config_head_dim(config)}


def config_width(config: object) -> int | None:
    """A ViT's (and hybrid's) D; a BiT's first-stage output channels (4 · 64·wf, its narrowest residual stream)."""
    if hasattr(config, "width"):
        return int(config.width)
    if hasattr(config, "root_width"):
        return 4 * int(config.root_width)
    return None


def config_tokens(config: object) -> int | None:
    """A ViT's (and hybrid's) tokens per image at its native size, prefix included; None for a BiT (no tokens)."""
    if not hasattr(config, "grid_size"):
        return None
    gh, gw = config.grid_size()
    return gh * gw + int(config.num_prefix_tokens)


def config_head_dim(config: object) -> int | None:
    """A ViT's (and hybrid's) width per attention head; None for a BiT (no attention)."""
    return int(config.head_dim) if hasattr(config, "head_dim") else None


def check_precision(requested: str, use: str) -> None:
    """ValueError (one line, naming the choices) for an unknown precision, or int8 asked of training."""
    if use not in USES:
        raise ValueError(f"use must be one of {', '.join(USES)}, not {use!r}")
    if requested not in PRECISIONS:
        raise ValueError(f"{setting('precision')} must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if requested == "int8" and use != "infer":
        raise ValueError(f"{setting('precision', value='int8')} is for the inference verbs only (eval, predict, bench, "
                         "export); use auto, fp32 or bf16 here")


def resolve_precision(requested: str, device: torch.device, *, use: str, width: int | None = None,
                      tokens: int | None = None, head_dim: int | None = None,
                      flags: frozenset[str] | set[str] | None = None) -> Precision:
    """`requested` (auto, fp32, bf16, int8) as the precision to compute in on `device`, with the reason.
    `width`, `tokens` and `head_dim` are the model's (`config_shape`; tokens and head dim None: a model without
    attention, bound by its width alone); `flags` the CPU's (`cpu_flags()` when None; tests inject them)."""
    check_precision(requested, use)
    device = torch.device(device)
    if requested == "int8":
        if device.type != "cpu":
            raise ValueError(f"{setting('precision', value='int8')} runs on the CPU only (dynamic int8 "
                             f"Linear layers), not {device}")
        return Precision("int8", "requested: dynamic int8 Linear layers")
    if requested == "fp32":
        return Precision("fp32", "requested: float32 (exact)")
    if requested == "bf16":
        return Precision("bf16", "requested")
    if device.type == "cuda":
        return Precision("bf16", "auto: CUDA computes bf16 natively")
    if device.type != "cpu":
        return Precision("fp32", f"auto: float32 on {device.type}")
    flags = cpu_flags() if flags is None else flags
    found = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if not found:
        return Precision("fp32", "auto: this CPU has no native bf16 (no amx_bf16/avx512_bf16 flag)")
    if width is None:
        return Precision("fp32", f"auto: CPU has {found[0]} but the model's width is unknown")
    shape = {"width": width, "head_dim": head_dim, "tokens": tokens}
    words = USE_WORDS[use]
    for region in BF16_GAINS[use]:
        bounds = {key: least for key, least in region.items() if shape[key] is not None}
        if all(shape[key] >= least for key, least in bounds.items()):
            met = " and ".join(f"{SHAPE_WORDS[key].format(shape[key])} >= {least}" for key, least in bounds.items())
            return Precision("bf16", f"auto: CPU has {found[0]} and {met} (bf16 gains in {words})")
    known = [SHAPE_WORDS[key].format(value) for key, value in shape.items() if value is not None]
    described = known[0] if len(known) == 1 else f"{', '.join(known[:-1])} and {known[-1]}"
    return Precision("fp32", f"auto: CPU has {found[0]} but {described} {'is' if len(known) == 1 else 'are'} too "
                             f"small to gain from bf16 in {words}")


def device_kind(name: str) -> torch.device:
    """The kind of device a --device value means (auto: CUDA when available), without claiming it as
    `device.pick_device` does; an unknown name is left to that check (here: cpu)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device("cuda" if str(name).startswith("cuda") else "cpu")


def training_precision(config: object, device: torch.device | str) -> Precision:
    """What `--precision auto` trains a model of this config in on this device (a --device value or a device): the
    one place a run's auto precision is decided, for the command line's resolution and a TrainConfig given
    directly alike."""
    kind = device if isinstance(device, torch.device) else device_kind(device)
    return resolve_precision("auto", kind, use="train", **config_shape(config))


def autocast_for(device: torch.device | str, precision: Precision | str) -> AbstractContextManager:
    """bf16 autocast on CPU or CUDA when the precision is bf16 (float32 master weights stay float32: this is how
    training computes in bf16); nothing otherwise."""
    name = precision.name if isinstance(precision, Precision) else precision
    device = torch.device(device)
    if name == "bf16" and device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _has_weight_standardisation(model: nn.Module) -> bool:
    """The hybrid's and BiT's convolutions standardise their weights before use: computed from bf16 weights
    that statistic loses precision, so those models keep float32 weights (autocast rounds the standardised kernels
    to bf16 for the convolutions)."""
    config = getattr(model, "config", None)
    return config is not None and (getattr(config, "resnet", None) is not None or hasattr(config, "root_width"))


def _forward_paths(model: nn.Module) -> list[str]:
    """The model's public forward methods: `forward` and every `forward_*` of its class."""
    return [n for n in dir(type(model)) if (n == "forward" or n.startswith("forward_"))
            and callable(getattr(type(model), n))]


def _in_bf16(path: str) -> Callable:
    """The class's method `path` computed in bf16: floating tensor arguments cast to the dtype the weights are
    stored in, the call under bf16 autocast, floating outputs returned in float32."""

    def method(model: nn.Module, *args, **kwargs):
        weight = next(model.parameters())
        args = tuple(_to_dtype(a, weight.dtype) for a in args)
        kwargs = {k: _to_dtype(v, weight.dtype) for k, v in kwargs.items()}
        with autocast_for(weight.device, "bf16"):
            out = getattr(type(model), path)(model, *args, **kwargs)
        return _to_float32(out)

    method.__name__ = method.__qualname__ = path
    return method


def _to_dtype(value, dtype: torch.dtype):
    return value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value


def _to_float32(out):
    """Every floating tensor of an output (nested in tuples, lists and dicts) in float32: callers (softmax, metrics,
    JSON, analysis) see float32 whatever the model computed in."""
    if torch.is_tensor(out):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, dict):
        return {k: _to_float32(v) for k, v in out.items()}
    if isinstance(out, tuple | list):
        return type(out)(_to_float32(o) for o in out)
    return out


def prepare_for_inference(model: nn.Module, precision: Precision | str) -> nn.Module:
    """The model in the fastest form of `precision` for inference, computing in it on every public forward path
    (`forward`, `forward_features`, `forward_head`, `forward_intermediates`, `forward_inspect`; `_forward_paths`).

    - fp32: unchanged.
    - bf16: each forward path takes float32 (or bf16) input and returns its floating outputs in float32, and
      computes its matmuls and convolutions in bf16 under bf16 autocast of its own (no caller's autocast
      needed). A ViT's weights are cast to bf16 (faster than autocast alone, BENCHMARKS.md "bf16 on a CPU that
      computes it natively"); the hybrids and BiT keep float32 weights, so that their weight standardisation is
      computed in float32 (`_has_weight_standardisation`), and compute in bf16 under the autocast.
    - int8: `vitlab.runtime.quantize.quantize_int8` (the encoder's Linear layers, whichever path calls them).

    The methods are wrapped on the model itself (bound to it, so a deep copy stays prepared); the model is
    returned for chaining."""
    name = precision.name if isinstance(precision, Precision) else precision
    if name == "int8":
        from vitlab.runtime.quantize import quantize_int8  # optional dependencies live there; import only when asked

        return quantize_int8(model)
    if name != "bf16" or getattr(model, "_vitlab_bf16", False):
        return model
    if not _has_weight_standardisation(model):
        model = model.to(torch.bfloat16)
    for path in _forward_paths(model):
        setattr(model, path, MethodType(_in_bf16(path), model))
    model._vitlab_bf16 = True
    return model


def computed_precision(model: nn.Module, chosen: Precision) -> Precision:
    """What a model `prepare_for_inference` prepared computes in: `chosen`, except int8 for a model with no Linear
    layer to quantize (BiT: its head, kept float32, is its only one), which computes in float32 and says why."""
    if chosen.name != "int8":
        return chosen
    from vitlab.runtime.quantize import is_int8

    if is_int8(model):
        return chosen
    return Precision("fp32", "int8 requested, but the model has no Linear layer to quantize besides its head, "
                             "which stays float32")

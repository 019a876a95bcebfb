"""The precision a model computes in: one setting (`--precision auto|fp32|bf16|int8`, `vitlab.load(precision=)`)
resolved once per run by a measured rule, then applied in the fastest form for the use.

The rule for `auto` (the measurements behind it: BENCHMARKS.md "bf16 on a CPU that computes it natively"):

- CUDA: bf16 (tensor cores compute it natively; training and evaluation run under bf16 autocast there).
- CPU without a native bf16 instruction (no `amx_bf16` and no `avx512_bf16` flag, e.g. AMD Zen 2/3): float32;
  bf16 is emulated there and always slower.
- CPU with one: bf16 when the model's width (the inner dimension of its matmuls, what AMX tiles and AVX512-BF16
  dot products need to amortise the casts) is at least `MIN_BF16_WIDTH`, float32 below. It is the smallest
  measured width that gains; narrower widths either lost or are unmeasured and stay float32, so `auto` is never
  slower than float32 on a measured model. `benchmarks/precision_threshold.py`, run on such a machine, measures
  every catalogue size and experiment model and prints the threshold the measurements support. The rule keys on
  width, not token count, because token count did not separate the measured points; every catalogue model at its
  native resolution has at least as many tokens as the fast ones.

Exactness paths (`convert`, `info`, the parity tests, `--precision fp32`) compute in float32 always.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

PRECISIONS = ("auto", "fp32", "bf16", "int8")
USES = ("train", "infer")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
MIN_BF16_WIDTH = 384  # the smallest width measured to gain under bf16 on a CPU that computes it natively


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


def model_width(model: nn.Module) -> int | None:
    """The width `auto` compares with `MIN_BF16_WIDTH` (`config_width` of the model's config); None for a model
    without a vitlab config."""
    return config_width(getattr(model, "config", None))


def config_width(config: object) -> int | None:
    """A ViT's (and hybrid's) D; a BiT's first-stage output channels (4 · 64·wf, its narrowest residual stream)."""
    if hasattr(config, "width"):
        return int(config.width)
    if hasattr(config, "root_width"):
        return 4 * int(config.root_width)
    return None


def check_precision(requested: str, use: str) -> None:
    """ValueError (one line, naming the choices) for an unknown precision, or int8 asked of training."""
    if use not in USES:
        raise ValueError(f"use must be one of {', '.join(USES)}, not {use!r}")
    if requested not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if requested == "int8" and use != "infer":
        raise ValueError("--precision int8 is for the inference verbs only (eval, predict, bench, export); "
                         "use auto, fp32 or bf16 here")


def resolve_precision(requested: str, device: torch.device, *, use: str, width: int | None = None,
                      flags: frozenset[str] | set[str] | None = None) -> Precision:
    """`requested` (auto, fp32, bf16, int8) as the precision to compute in on `device`, with the reason.
    `width` is the model's (`model_width`); `flags` the CPU's (`cpu_flags()` when None; tests inject them)."""
    check_precision(requested, use)
    device = torch.device(device)
    if requested == "int8":
        if device.type != "cpu":
            raise ValueError(f"--precision int8 runs on the CPU only (dynamic int8 Linear layers), not {device}")
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
    if width < MIN_BF16_WIDTH:
        return Precision("fp32", f"auto: CPU has {found[0]} but width {width} < {MIN_BF16_WIDTH} "
                                 "(too small to gain from bf16)")
    return Precision("bf16", f"auto: CPU has {found[0]} and width {width} >= {MIN_BF16_WIDTH}")


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
    return resolve_precision("auto", kind, use="train", width=config_width(config))


def autocast_for(device: torch.device | str, precision: Precision | str) -> AbstractContextManager:
    """bf16 autocast on CPU or CUDA when the precision is bf16 (float32 master weights stay float32: this is how
    training computes in bf16); nothing otherwise."""
    name = precision.name if isinstance(precision, Precision) else precision
    device = torch.device(device)
    if name == "bf16" and device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _has_weight_standardisation(model: nn.Module) -> bool:
    """The hybrid's and BiT's convolutions standardise their weights on each call: computed from bf16 weights
    that statistic loses precision, so those models keep float32 weights and compute under autocast."""
    config = getattr(model, "config", None)
    return config is not None and (getattr(config, "resnet", None) is not None or hasattr(config, "root_width"))


def _inputs_to_bf16(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.to(torch.bfloat16) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def _outputs_to_fp32(module: nn.Module, args: tuple, out):
    if torch.is_tensor(out) and out.is_floating_point():
        return out.float()  # callers (softmax, metrics, JSON) see float32 logits whatever the weights are
    return out


def prepare_for_inference(model: nn.Module, precision: Precision | str) -> nn.Module:
    """The model in the fastest form of `precision` for inference (call `autocast_for` around it as well):
    fp32 unchanged; bf16 weights cast to bfloat16 for a ViT (faster than autocast alone, BENCHMARKS.md "bf16 on
    a CPU that computes it natively"), inputs cast to bf16 and logits back to float32 by hooks on `model(x)`;
    hybrids and BiT keep float32 weights (weight standardisation) and rely on autocast; int8
    `vitlab.runtime.quantize.quantize_int8`."""
    name = precision.name if isinstance(precision, Precision) else precision
    if name == "int8":
        from vitlab.runtime.quantize import quantize_int8  # optional dependencies live there; import only when asked

        return quantize_int8(model)
    if name != "bf16" or _has_weight_standardisation(model) or getattr(model, "_vitlab_bf16", False):
        return model
    model = model.to(torch.bfloat16)
    model.register_forward_pre_hook(_inputs_to_bf16)
    model.register_forward_hook(_outputs_to_fp32)
    model._vitlab_bf16 = True
    return model

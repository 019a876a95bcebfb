"""The form training's attention computes in (`--attention auto|flash|matmul`, `vitlab.models.attention`), resolved
once per run by a measured rule, as the precision is.

The rule for `auto`: "matmul" (explicit bf16 matmuls, whose backward runs at the CPU's matmul speed) where a region
of `MATMUL_ATTENTION_GAINS` holds: training in bf16 on a CPU with the region's flag,
with at least its tokens per image, head dim and batch; "flash" (torch's fused kernel) everywhere else: on a GPU,
in float32, on a CPU without the flag, and on shapes smaller than any measured. The measurements behind it:
BENCHMARKS.md "Training attention", `benchmarks/attention_forms.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitlab.constants import MATMUL_ATTENTION_GAINS, SETTING_CHOICES, SHAPE_WORDS
from vitlab.errors import setting
from vitlab.runtime.precision import config_head_dim, config_tokens, cpu_flags, device_kind

ATTENTION_CHOICES = SETTING_CHOICES["attention"]
_WORDS = {**SHAPE_WORDS, "batch": "batch {}"}


@dataclass(frozen=True)
class AttentionChoice:
    """The resolved form (flash or matmul; never auto) and why, as the banner and config.json show it."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


def check_attention(requested: str) -> None:
    """ValueError (one line, naming the choices) for an unknown attention form."""
    if requested not in ATTENTION_CHOICES:
        raise ValueError(f"{setting('attention')} must be one of {', '.join(ATTENTION_CHOICES)}, not {requested!r}")


def training_attention(requested: str, device: torch.device | str, *, precision: str, tokens: int | None,
                       head_dim: int | None, batch: int,
                       flags: frozenset[str] | set[str] | None = None) -> AttentionChoice:
    """`requested` (auto, flash, matmul) as the form training computes attention in, with the reason: `device` a
    device or a --device value, `precision` the resolved one (fp32 or bf16), `tokens` and `head_dim` the model's
    (None: a model without attention), `batch` the per-process batch; `flags` the CPU's (`cpu_flags()` when None;
    tests inject them)."""
    check_attention(requested)
    if requested != "auto":
        return AttentionChoice(requested, "requested")
    kind = device if isinstance(device, torch.device) else device_kind(str(device))
    if tokens is None or head_dim is None:
        return AttentionChoice("flash", "auto: the model has no attention")
    if kind.type != "cpu":
        return AttentionChoice("flash", f"auto: the fused kernel on {kind.type}")
    if precision != "bf16":
        return AttentionChoice("flash", f"auto: the matmul form gains in bf16 only, this run computes {precision}")
    if not MATMUL_ATTENTION_GAINS:
        return AttentionChoice("flash", "auto: the matmul form is used only when asked for (--attention matmul)")
    flags = cpu_flags() if flags is None else flags
    shape = {"tokens": tokens, "head_dim": head_dim, "batch": batch}
    for region in MATMUL_ATTENTION_GAINS:
        bounds = {key: least for key, least in region.items() if key != "cpu_flag"}
        if region["cpu_flag"] in flags and all(shape[key] >= least for key, least in bounds.items()):
            met = " and ".join(f"{_WORDS[key].format(shape[key])} >= {least}" for key, least in bounds.items())
            return AttentionChoice("matmul", f"auto: CPU has {region['cpu_flag']} and {met} (the matmul form's "
                                             "backward gains in bf16 training)")
    present = [region for region in MATMUL_ATTENTION_GAINS if region["cpu_flag"] in flags]
    if not present:
        wanted = "/".join(sorted({str(region["cpu_flag"]) for region in MATMUL_ATTENTION_GAINS}))
        return AttentionChoice("flash", f"auto: the matmul form gains only on a CPU with {wanted}")
    needed = " and ".join(_WORDS[key].format(f">= {least}") for key, least in present[0].items() if key != "cpu_flag")
    have = ", ".join(_WORDS[key].format(value) for key, value in shape.items())
    return AttentionChoice("flash", f"auto: CPU has {present[0]['cpu_flag']} but {have} is short of the matmul "
                                    f"form's gain ({needed})")

def config_attention(requested: str, config: object, device: torch.device | str, precision: str,
                     batch: int) -> AttentionChoice:
    """`training_attention` for a model of this config: the one place a run's attention form is decided."""
    return training_attention(requested, device, precision=precision, tokens=config_tokens(config),
                              head_dim=config_head_dim(config), batch=batch)

"""Which parameters a run trains: all of them (the paper's fine-tuning), the head alone on a frozen backbone
(`--freeze backbone`, a linear probe), or LoRA adapters and the head (`--lora RANK`, vitlab.train.lora).

Frozen parameters have `requires_grad` off before the optimizer is built: no gradients, no optimizer state, no EMA
copy, and they leave the run bit for bit as they came in. Whatever trains, the saved weights are a plain vitlab
model (LoRA's adapters merged), so `vitlab.load`, `vitlab eval` and the exporters read every run alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitlab.train.lora import LORA_TARGETS, LoraAdapters

FREEZE_CHOICES = ("backbone",)  # backbone: everything but the classifier (head, and pre_logits when there is one)
_HEAD = ("head", "pre_logits")


def tuning_problems(cfg: Any) -> list[str]:
    """The fine-tuning settings against each other (vitlab.train.config.validate reports them)."""
    problems = []
    if cfg.freeze is not None and cfg.freeze not in FREEZE_CHOICES:
        problems.append(f"unknown --freeze {cfg.freeze!r}; use {', '.join(FREEZE_CHOICES)}")
    if cfg.lora_rank and cfg.freeze:
        problems.append("--lora already freezes the backbone (only the adapters and the head train): leave --freeze "
                        "out")
    if (cfg.lora_alpha is not None or cfg.lora_targets != ("qkv",)) and not cfg.lora_rank:
        problems.append("--lora-alpha and --lora-targets shape LoRA adapters: add --lora RANK")
    unknown = [t for t in cfg.lora_targets if t not in LORA_TARGETS]
    if unknown or not cfg.lora_targets or len(set(cfg.lora_targets)) != len(cfg.lora_targets):
        problems.append(f"--lora-targets {','.join(cfg.lora_targets) or '(none)'}: name each once, from "
                        f"{', '.join(LORA_TARGETS)}")
    if cfg.ema_warmup and not cfg.ema:
        problems.append("--ema-warmup warms up the EMA's decay: add --ema-decay D (or --ema D; e.g. 0.9998)")
    if cfg.objective != "classify" and (cfg.freeze or cfg.lora_rank or cfg.layer_decay is not None):
        problems.append("--freeze, --lora and --layer-decay fine-tune a classifier: use them with --objective "
                        "classify")
    if cfg.lora_rank and cfg.fsdp:
        problems.append("--lora trains a few adapters; run it with DDP, not --fsdp")
    return problems


def frozen_backbone_settings(values: dict[str, Any], sources: dict[str, str]) -> dict[str, tuple[Any, str]]:
    """With --freeze backbone, the frozen features are fixed: no dropout or stochastic depth unless the user set
    them (a flag or a --config file). field -> (value, source), for the resolution step to apply."""
    if values.get("freeze") != "backbone":
        return {}
    chosen = {}
    for key in ("dropout", "drop_path_rate"):
        if sources[key] != "flag" and not sources[key].startswith("config ") and values[key] != 0.0:
            chosen[key] = (0.0, "--freeze backbone: a frozen backbone's features are fixed")
    return chosen


class Tuning:
    """What trains in one run's model, and the two ways its state leaves the run: the saved weights (plain) and
    the checkpoint's extra state for resuming (LoRA's adapters and W0)."""

    def __init__(self, model: nn.Module, cfg: Any):
        self.freeze, self.lora = cfg.freeze, None
        if cfg.lora_rank:
            alpha = cfg.lora_alpha if cfg.lora_alpha is not None else float(cfg.lora_rank)
            self.lora = LoraAdapters(model, cfg.lora_rank, alpha, tuple(cfg.lora_targets))
        elif cfg.freeze == "backbone":
            for name, p in model.named_parameters():
                p.requires_grad_(name.split(".")[0] in _HEAD)
        self.trained = [name for name, p in model.named_parameters() if p.requires_grad]
        self.counts = (sum(p.numel() for p in model.parameters() if p.requires_grad),
                       sum(p.numel() for p in model.parameters()))

    def weights(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's state dict as plain vitlab weights."""
        return self.lora.merged_weights(state) if self.lora is not None else state

    def resume_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        return self.lora.resume_state(state) if self.lora is not None else None

    def restore(self, model: nn.Module, state: dict[str, Any], where: Any) -> None:
        """A checkpoint's tuning state back into the model; a checkpoint without one (the run's final weights)
        continues from its merged weights with fresh adapters."""
        saved = state.get("tuning")
        if self.lora is None or saved is None:
            return
        try:
            self.lora.restore(model, saved)
        except (ValueError, RuntimeError, AttributeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ValueError(f"checkpoint {where}: {first}; move it aside to resume from the previous one") from None

    def describe(self) -> str:
        """The banner's line: how many parameters train, and which."""
        trained, total = self.counts
        share = f"{_count(trained)} of {_count(total)} parameters train"
        if self.lora is not None:
            return f"train   {share}: {self.lora.describe()}"
        if self.freeze == "backbone":
            return (f"train   {share}: the classifier only ({', '.join(self.trained)}; --freeze backbone, a linear "
                    "probe); the backbone gets no gradients and no optimizer state")
        return f"train   {share} (all)"


def _count(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n:,}"

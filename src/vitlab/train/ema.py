"""EMA (Polyak) weights: what validation, best.safetensors and model.safetensors hold when a run asks for them.

The update is timm's `ModelEmaV3`: ema = decay·ema + (1 − decay)·w after every optimiser step, as one
`torch._foreach_lerp_` over the trained tensors. Its decay, read from timm 1.0's `ModelEmaV3.get_decay`:

- without warm-up (`--ema-decay D`): D at every step, the EMA starting from the weights the run starts from
  (`ModelEmaV3.update(model)` without a step, which is what vitlab's `--ema` always did);
- with warm-up (`--ema-decay D --ema-warmup`): update k (1-based) uses min(D, 1 − k^(−2/3)), which is 0 at the
  first (it copies the weights): timm's `use_warmup=True` (warmup_gamma 1, warmup_power 2/3, min_decay 0,
  update_after_step 0), where s = k − 1 and the decay is 0 for s = 0, else 1 − (1 + s)^(−2/3), with the step
  timm's train.py passes (`model_ema.update(model, step=num_updates)`). Early updates average the few weights
  there are rather than the start: the warm-up reaches 0.99 after 1,000 updates and 0.999 after 31.6k, so a short
  fine-tune is averaged over a share of its own steps.

Only tensors that train are averaged (a frozen backbone's, LoRA's base weights are their own average); vitlab
models keep no floating-point buffers, so the parameters are the whole state (timm also averages buffers).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

WARMUP_POWER = 2 / 3  # timm ModelEmaV3's warmup_power default (warmup_gamma 1)


def ema_decay(decay: float, step: int | None, warmup: bool) -> float:
    """The decay of update `step` (1-based; None: no step known, the constant decay), as ModelEmaV3.get_decay."""
    if not warmup or step is None:
        return decay
    s = max(0, step - 1)
    if s <= 0:
        return 0.0
    return max(min(1.0 - (1.0 + s) ** -WARMUP_POWER, decay), 0.0)


def _trained(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class Ema:
    """EMA tensors parallel to the model's trained parameters (local shards under FSDP), swapped in for
    evaluation and saving. `warmup`: timm's decay warm-up (module docstring)."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = False):
        self.decay, self.warmup = decay, warmup
        self.params = [p.detach().clone() for p in _trained(model)]

    def decay_at(self, step: int | None) -> float:
        return ema_decay(self.decay, step, self.warmup)

    @torch.no_grad()
    def update(self, model: nn.Module, step: int | None = None) -> None:
        """After optimiser update `step` (1-based, the run's step count after it)."""
        torch._foreach_lerp_(self.params, [p.detach() for p in _trained(model)], 1.0 - self.decay_at(step))

    @torch.no_grad()
    def capture(self, model: nn.Module) -> None:
        """Set the EMA to the model's current weights (used when restoring a checkpoint)."""
        for e, p in zip(self.params, _trained(model), strict=True):
            e.copy_(p.detach())

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """The model holds the EMA weights inside the block and its own weights again after it."""
        params = _trained(model)
        backup = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, e in zip(params, self.params, strict=True):
                p.copy_(e)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(params, backup, strict=True):
                    p.copy_(b)

    def describe(self) -> str:
        """The banner's line: what the EMA is and which weights it decides."""
        how = (f"decay min({self.decay:g}, 1 − k^−2/3) at update k (timm ModelEmaV3 warm-up)" if self.warmup
               else f"decay {self.decay:g} from the start (timm ModelEmaV3 without warm-up)")
        return (f"ema     of the {sum(p.numel() for p in self.params):,} trained parameters, {how}: validation, "
                "best.safetensors and model.safetensors hold the EMA weights")

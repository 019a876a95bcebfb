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

import copy
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from vitlab.constants import FREEZE_CHOICES
from vitlab.errors import setting
from vitlab.train.settings import spelled

WARMUP_POWER = 2 / 3  # timm ModelEmaV3's warmup_power default (warmup_gamma 1)


def ema_decay(decay: float, step: int | None, warmup: bool) -> float:
    """The decay of update `step` (1-based; None: no step known, the constant decay), as ModelEmaV3.get_decay."""
    if not warmup or step is None:
        return decay
    s = max(0, step - 1)
    if s <= 0:
        return 0.0
    return max(min(1.0 - (1.0 + s) ** -WARMUP_POWER, decay), 0.0)


def ema_warning(decay: float, warmup: bool, steps: int) -> str | None:
    """One line when the EMA would still be mostly the initial weights at the run's end, else None. The rule: without
    warm-up the average starts from the initial weights, which keep a share decay^steps of it, and its horizon is
    about 1/(1 − decay) steps; a run shorter than that horizon keeps more than e^−1 (37%) of its start. With warm-up
    the first update copies the weights (decay 0), so the start leaves the average at once."""
    horizon = 1.0 / (1.0 - decay) if decay < 1 else math.inf
    if warmup or steps >= horizon:
        return None
    return (f"{setting('ema', 'ema_decay', decay)} averages over about {horizon:,.0f} steps "
            f"(1/(1 − decay)), more than this run's "
            f"{steps:,}: the saved EMA weights are {100 * decay ** steps:.0f}% the initial ones ({decay:g}^{steps}); "
            f"add {setting('ema_warmup', value=True)}, lower the decay below {1 - 1 / steps:.3g}, or train longer")


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


# --------------------------------------------------------------------------------------------------------------
# LoRA fine-tuning through Hugging Face's `peft` (`--lora RANK`; `pip install 'vitlab[lora]'`).
#
# peft's `get_peft_model` puts a `lora.Linear` in place of each targeted `nn.Linear` of the blocks: the layer's
# weight W0 stays frozen and the output gains (α / r)·B·A·x, with A (r × in, Kaiming-uniform) and B (out × r, zero)
# trained, so the fine-tune starts from the initial model's outputs. The new zero-initialised head trains in full
# (as peft's image-classification guide trains the classifier with `modules_to_save`); nothing else does.
#
# Saved weights (model.safetensors, best.safetensors, a checkpoint's model.safetensors) are peft's
# `merge_and_unload()` of a copy of the model: plain weights W0 + (α / r)·B·A under the ViT's own names, which
# `vitlab.load`, every exporter and `vitlab eval` read as an ordinary vitlab model. A checkpoint also keeps the
# adapters and the frozen W0 of the targeted layers (in state.pt, `tuning`), because the merged sum cannot be split
# back bit for bit: a resumed run continues from exactly the tensors it stopped with.

# --lora-targets name -> the Linear layer of every block it adapts
LORA_TARGETS = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ValueError(f"{setting('lora_rank', 'lora')} needs the peft package: pip install 'vitlab[lora]'") from None
    return peft


def target_pattern(targets: tuple[str, ...]) -> str:
    """peft's `target_modules` as one regular expression (peft matches it against the whole module name): the
    blocks' layers only, never the patch embedding's `proj` convolution or the head."""
    return r"blocks\.\d+\.(" + "|".join(re.escape(LORA_TARGETS[t]) for t in targets) + ")"


def _is_lora_key(key: str) -> bool:
    """A state-dict entry that exists only in the wrapped model: an adapter or a targeted layer's frozen W0."""
    return ".lora_" in key or ".base_layer." in key


class LoraAdapters:
    """LoRA adapters injected into `model` in place (it stays the vitlab ViT the loop trains and evaluates)."""

    def __init__(self, model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...]):
        peft = _peft()
        if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
            name = model.config.name or "this model"
            raise ValueError(f"{setting('lora_rank', 'lora')} adapts a ViT's blocks, and {name} has none (a CNN); "
                             f"fine-tune it in full or with {setting('freeze', value='backbone')}")
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_pattern(targets), lora_dropout=0.0,
                                 bias="none")
        self.rank, self.alpha, self.targets, self.version = rank, alpha, targets, peft.__version__
        self.peft_model = peft.get_peft_model(model, config)  # injects into `model`; the rest is frozen
        for module in (model.pre_logits, model.head):
            if module is not None:
                module.requires_grad_(True)

    def merged_weights(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`state` (the wrapped model's, e.g. its EMA weights) merged by peft into plain vitlab weights."""
        wrapped = copy.deepcopy(self.peft_model).to("cpu")
        wrapped.get_base_model().load_state_dict(state)
        with torch.no_grad():
            merged = wrapped.merge_and_unload()
        return {k: v.detach() for k, v in merged.state_dict().items()}

    def resume_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps besides the merged weights: the adapters and the targeted layers' W0."""
        return {k: v for k, v in state.items() if _is_lora_key(k)}

    def restore(self, model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
        """Put a checkpoint's adapters and W0 back (the model was rebuilt from its merged weights)."""
        expected = {k for k in model.state_dict() if _is_lora_key(k)}
        if set(saved) != expected:
            missing, extra = sorted(expected - set(saved)), sorted(set(saved) - expected)
            raise ValueError(f"its LoRA adapters do not fit {setting('lora_rank', 'lora', self.rank)} on "
                             f"{','.join(self.targets)} "
                             f"(missing {missing[:2]}, unexpected {extra[:2]})")
        model.load_state_dict(saved, strict=False)

    def describe(self) -> str:
        return (f"LoRA rank {self.rank}, α {self.alpha:g} (scale {self.alpha / self.rank:g}) on "
                f"{', '.join(self.targets)} of every block via peft {self.version}, and the head; the adapters are "
                "merged into the saved weights")


# --------------------------------------------------------------------------------------------------------------
# Which parameters a run trains: all of them (the paper's fine-tuning), the head alone on a frozen backbone
# (`--freeze backbone`, a linear probe), or LoRA adapters and the head (`--lora RANK`, vitlab.train.finetune).
#
# Frozen parameters have `requires_grad` off before the optimizer is built: no gradients, no optimizer state, no EMA
# copy, and they leave the run bit for bit as they came in. Whatever trains, the saved weights are a plain vitlab
# model (LoRA's adapters merged), so `vitlab.load`, `vitlab eval` and the exporters read every run alike.

_HEAD = ("head", "pre_logits")


def tuning_problems(cfg: Any) -> list[str]:
    """The fine-tuning settings against each other (vitlab.train.config.validate reports them), named as the caller
    spells them (vitlab.train.settings.spelled)."""
    freeze, lora, targets = spelled("freeze"), spelled("lora_rank"), spelled("lora_targets")
    problems = []
    if cfg.freeze is not None and cfg.freeze not in FREEZE_CHOICES:
        problems.append(f"unknown {freeze} {cfg.freeze!r}; use {', '.join(FREEZE_CHOICES)}")
    if cfg.lora_rank and cfg.freeze:
        problems.append(f"{lora} already freezes the backbone (only the adapters and the head train): leave {freeze} "
                        "out")
    if (cfg.lora_alpha is not None or cfg.lora_targets != ("qkv",)) and not cfg.lora_rank:
        problems.append(f"{spelled('lora_alpha')} and {targets} shape LoRA adapters: add "
                        f"{spelled('lora_rank', 'RANK')}")
    unknown = [t for t in cfg.lora_targets if t not in LORA_TARGETS]
    if unknown or not cfg.lora_targets or len(set(cfg.lora_targets)) != len(cfg.lora_targets):
        problems.append(f"{targets} {','.join(cfg.lora_targets) or '(none)'}: name each once, from "
                        f"{', '.join(LORA_TARGETS)}")
    if cfg.ema_warmup and not cfg.ema:
        problems.append(f"{setting('ema_warmup')} warms up the EMA's decay: add {setting('ema', 'ema-decay', 'D')} "
                        "(e.g. 0.9998)")
    if cfg.objective != "classify" and (cfg.freeze or cfg.lora_rank or cfg.layer_decay is not None):
        problems.append(f"{freeze}, {lora} and {setting('layer_decay')} fine-tune a classifier: use them with "
                        f"{setting('objective', value='classify')}")
    if cfg.lora_rank and cfg.fsdp:
        problems.append(f"{lora} trains a few adapters; run it with DDP, not {setting('fsdp')}")
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

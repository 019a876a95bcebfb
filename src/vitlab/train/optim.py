"""Optimisers and the learning-rate schedule (paper Appendix B.1, Tables 3-4); EMA weights are
vitlab.train.finetune's (re-exported here).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from vitlab.errors import setting
from vitlab.models.config import BiTConfig
from vitlab.models.timm_compat import MATCH_PREVIOUS
from vitlab.train.config import TrainConfig
from vitlab.train.finetune import Ema  # noqa: F401  (re-exported: importable beside the optimisers)

# --------------------------------------------------------------------------------------------------------------
# Layer-wise learning-rate decay (`--layer-decay`), grouped as timm's `param_groups_layer_decay` groups a ViT
# (after BEiT; MAE and DINOv2 fine-tune with it): the layers near the input, which learnt general features, move least.
#
# The layers are the model's own `group_matcher` (vitlab.models.timm_compat, the one definition of a ViT's layer
# groups), numbered as timm numbers them. For a ViT of depth L (with a hybrid's ResNet stem) that is L + 2 layers:
#
#     0        the embeddings: patch embedding (and a hybrid's ResNet stem), class and register tokens, position
#              embedding
#     i + 1    everything in block i (its relative position table included); the final norm goes with the last
#              block (timm's MATCH_PREV_GROUP)
#     L + 1    what follows: fc_norm, pre_logits and the head (absent without a head: the last block is then the
#              top layer, as in timm)
#
# and a parameter of layer l trains at lr · decay^(top − l): the head at the base lr, the last block (and the final
# norm) at lr · decay, the embeddings at lr · decay^(L + 1). BEiT's and MAE's own code differ from timm only in the
# final norm, which they train at the head's lr; vitlab follows timm, the reference its test compares with. BiT has
# timm's ResNetV2 group_matcher (for timm's optimizer factory) but is refused here: its BiT-HyperRule trains every
# layer at one lr.
#
# The weight-decay split stays vitlab's (kernels only: vitlab.train.optim.param_groups); each of its groups is cut
# by layer, so every optimizer group has one lr and one weight decay.


def layer_ids(model: nn.Module) -> dict[str, int]:
    """The layer of every parameter, by name, from `model.group_matcher()`: each name gets the ordinal of the first
    pattern that matches it (the group's position, then the pattern's captured numbers, then its suffix; no match
    sorts last), and the distinct ordinals in order are layers 0, 1, …; a suffix of MATCH_PREVIOUS joins the layer
    before it. This is timm's reading of a group_matcher, so the layers are the ones timm's optimizer factory uses."""
    matcher = getattr(model, "group_matcher", None)
    config = getattr(model, "config", None)
    name = getattr(config, "name", None) or type(model).__name__
    if matcher is None:
        raise ValueError(f"{setting('layer_decay')} groups a ViT's blocks, and {name} has none (a CNN); leave it "
                         "unset")
    if isinstance(config, BiTConfig):
        raise ValueError(f"{setting('layer_decay')} groups a ViT's blocks, and {name} is a BiT ResNet, which the "
                         "BiT-HyperRule "
                         "fine-tunes at one lr in every layer; leave it unset")
    rules = []
    for ordinal, spec in enumerate(matcher(coarse=False).values()):
        for pattern, suffix in [(spec, None)] if isinstance(spec, str) else spec:
            rules.append((re.compile(pattern), ordinal, tuple(suffix or ())))

    def order(name: str) -> tuple[float, ...]:
        for pattern, ordinal, suffix in rules:
            if m := pattern.match(name):
                return (ordinal, *(float(g) for g in m.groups() if g is not None), *suffix)
        return (math.inf,)

    orders = {name: order(name) for name, _ in model.named_parameters()}
    layers: dict[tuple[float, ...], int] = {}
    layer = -1
    for key in sorted(set(orders.values())):
        if layer < 0 or key[-1] != MATCH_PREVIOUS:
            layer += 1
        layers[key] = layer
    return {name: layers[key] for name, key in orders.items()}


def layer_scales(model: nn.Module, decay: float) -> dict[str, float]:
    """The lr factor of every trained parameter, by name: decay^(top layer − layer id)."""
    ids = layer_ids(model)
    top = max(ids.values())
    return {name: decay ** (top - ids[name]) for name, p in model.named_parameters() if p.requires_grad}


def layer_decay_groups(model: nn.Module, groups: list[dict[str, Any]], lr: float, decay: float) -> list[dict[str, Any]]:
    """`groups` (the weight-decay groups) cut by layer: one group per (layer, weight decay) with its own "lr"
    (lr · scale, which LambdaLR then schedules) and, as timm's groups, its "lr_scale". Ordered from the head
    down, so that the first group (what the training log reports as lr) trains at the base lr."""
    ids = layer_ids(model)
    top = max(ids.values())
    names = {id(p): name for name, p in model.named_parameters()}
    cut: dict[tuple[int, int], dict[str, Any]] = {}
    for g, group in enumerate(groups):
        for p in group["params"]:
            layer = ids[names[id(p)]]
            scale = decay ** (top - layer)
            entry = cut.setdefault((layer, g), {**{k: v for k, v in group.items() if k != "params"},
                                                "params": [], "lr": lr * scale, "lr_scale": scale})
            entry["params"].append(p)
    return [cut[key] for key in sorted(cut, key=lambda k: (-k[0], k[1]))]


def describe(model: nn.Module, decay: float) -> str:
    """The banner's line."""
    top = max(layer_ids(model).values())
    return (f"lr      layer decay {decay:g} over {top + 1} layers (the model's group_matcher: embeddings, blocks, "
            f"head): top layer × 1, the next × {decay:.3g}, embeddings × {decay ** top:.3g} "
            "(timm param_groups_layer_decay)")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on kernels only (Linear and Conv weights), as big_vision's default `wd_mults`: biases,
    LayerNorm scales, position embeddings and the class token are not pulled towards zero."""
    kernels = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)}
    decay = [p for p in model.parameters() if p.requires_grad and id(p) in kernels]
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in kernels]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """`adam`: Adam with decoupled weight decay (AdamW: p -= lr·wd·p, like optax's adamw); `sgd`: momentum."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.layer_decay is not None:  # per-block learning rates (vitlab.train.optim)
        groups = layer_decay_groups(model, groups, cfg.lr, cfg.layer_decay)
    if cfg.optimizer == "adam":
        fused = fused_adamw_fits([p for g in groups for p in g["params"]])
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, fused=fused or None,
                                 foreach=not fused)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


def fused_adamw_fits(params: list[torch.Tensor]) -> bool:
    """AdamW's fused kernel (one kernel over all parameters, the step `vitlab bench` times) where torch has it: every
    parameter floating point on a CPU or CUDA device. Its result equals the per-tensor (foreach) step's within float
    rounding; elsewhere the foreach step."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def describe_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """The banner's line: the optimizer and how its step computes (a resumed run keeps its checkpoint's form)."""
    group = optimizer.param_groups[0]
    form = "fused kernel" if group.get("fused") else "foreach kernels" if group.get("foreach") else "per tensor"
    return f"optim   {type(optimizer).__name__}, {form}"


class Schedule:
    """The learning rate as a factor on the base LR, at the 0-based update index `step`: update k of a run uses
    the factor at k − 1, as the official loops do (vit_jax feeds `lr_fn(0)` to its first update, optax schedules
    and big_transfer's `get_lr` start at 0), so with warm-up the first update has LR 0.

    - warm-up: min(1, step/warmup), multiplying every decay below (vit_jax `create_learning_rate_schedule`);
    - "linear": end + (1 − end)·(1 − progress), progress over the steps after warm-up; `end` is `linear_end`
      relative to the base LR (vit_jax default 1e-5 absolute);
    - "cosine": 0.5·(1 + cos(π·progress)), reaching 0 (linear_end does not apply, as in vit_jax);
    - "step": ×0.1 after each boundary round(f·total), f in `drops` (BiT-HyperRule, big_transfer
      `bit_hyperrule.get_lr`: boundaries 30%, 60%, 90% of the steps; 40/60/80% for its smallest schedule).

    A callable object (not a lambda) so that LambdaLR's state dict holds its settings; a checkpoint written before
    `end`/`drops` existed restores only the fields it has, the others keep the (old-behaviour) defaults."""

    def __init__(self, warmup: int, total: int, decay: str, end: float = 0.0,
                 drops: tuple[float, ...] = (0.3, 0.6, 0.9)):
        self.warmup, self.total, self.decay = warmup, total, decay
        self.end, self.drops = end, tuple(drops)

    def __call__(self, step: int) -> float:
        warm = min(1.0, step / self.warmup) if self.warmup else 1.0
        if self.decay == "step":
            return warm * 0.1 ** sum(round(f * self.total) < step for f in self.drops)
        progress = min(max((step - self.warmup) / max(self.total - self.warmup, 1), 0.0), 1.0)
        if self.decay == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * progress))
        return warm * (self.end + (1.0 - self.end) * (1.0 - progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    end = cfg.linear_end / cfg.lr if cfg.lr else 0.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule(cfg.warmup, cfg.steps, cfg.decay, end, cfg.lr_drops))


def replan_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, steps: int) -> int | None:
    """After a checkpoint's scheduler state was restored: plan the schedule for `steps` in all (a resumed run
    given a larger --steps). LambdaLR's state dict holds the Schedule's fields, the old total among them, so the
    restored schedule would end where the old run ended and every added step would train at lr 0. The warm-up
    and the step count stay; the next step takes the lr the `steps`-step schedule gives it. Returns the old
    total, or None if it was already `steps`."""
    schedules = [s for s in scheduler.lr_lambdas if isinstance(s, Schedule)]
    old = schedules[0].total if schedules else steps
    if old == steps:
        return None
    for schedule in schedules:
        schedule.total = steps
    step = scheduler.last_epoch
    lrs = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports for the next step
    return old

"""Optimisers, the learning-rate schedule and the losses (paper Appendix B.1, Tables 3-4); EMA weights are
vitlab.train.ema's (re-exported here)."""

from __future__ import annotations

import math

import torch
from torch import nn

from vitlab.eval.classify import per_image_loss
from vitlab.train.config import TrainConfig
from vitlab.train.ema import Ema  # noqa: F401  (re-exported: it lived here)
from vitlab.train.layer_decay import layer_decay_groups


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
    if cfg.layer_decay is not None:  # per-block learning rates (vitlab.train.layer_decay)
        groups = layer_decay_groups(model, groups, cfg.lr, cfg.layer_decay)
    if cfg.optimizer == "adam":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, foreach=True)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


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


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, kind: str, smoothing: float) -> torch.Tensor:
    """The training loss: the validation's `per_image_loss` averaged over the batch (float32 under autocast)."""
    return per_image_loss(logits, labels, kind, smoothing).mean()

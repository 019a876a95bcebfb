"""Learning-rate schedules and training recipes against the official code and the paper.

References are transcriptions written here from the official sources (never vitlab's own functions):
- vit_jax `hyper.py` / `utils.py` `create_learning_rate_schedule` and the train loop that feeds `lr_fn(0)` to its
  first update (google-research/vision_transformer, `vit_jax/train.py`: `lr_prefetch_iter(lr_fn, 0, total_steps)`
  zipped with `range(1, total_steps + 1)`; the optax version passes `lr_fn` to `optax.sgd`, whose count starts at 0);
- big_transfer's `bit_hyperrule.get_lr(step, dataset_size, base_lr)`, called with step = 0, 1, ….
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vitlab.train import resolve_config
from vitlab.train.optim import Schedule, build_optimizer, build_scheduler


def vit_jax_lr(step: int, total: int, base: float, decay: str, warmup: int, linear_end: float = 1e-5) -> float:
    """vit_jax `create_learning_rate_schedule(total_steps, base, decay_type, warmup_steps, linear_end)(step)`."""
    progress = float(np.clip((step - warmup) / float(total - warmup), 0.0, 1.0))
    lr = linear_end + (base - linear_end) * (1.0 - progress) if decay == "linear" else \
        base * 0.5 * (1.0 + np.cos(np.pi * progress))
    return lr * min(1.0, step / warmup) if warmup else lr


def bit_get_lr(step: int, dataset_size: int, base_lr: float = 0.003) -> float | None:
    """big_transfer `bit_hyperrule.get_lr`: warm-up, then /10 after each support; None at the end."""
    supports = [100, 200, 300, 400, 500] if dataset_size < 20_000 else (
        [500, 3000, 6000, 9000, 10_000] if dataset_size < 500_000 else [500, 6000, 12_000, 18_000, 20_000])
    if step < supports[0]:
        return base_lr * step / supports[0]
    if step >= supports[-1]:
        return None
    return base_lr / 10 ** sum(s < step for s in supports[1:])


def lrs_used(cfg, updates: int) -> list[float]:
    """The LR each optimiser update of the training loop applies (read before the step, as the loop logs it)."""
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    used = []
    for _ in range(updates):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_schedule_is_the_official_vit_jax_schedule_and_step_numbering(decay):
    # Update k (1-based) of the official loop applies lr_fn(k - 1): the first update has LR 0 under warm-up.
    total, warmup, base = 60, 10, 1e-3
    cfg = resolve_config("pretrain", lr=base, steps=total, warmup=warmup, decay=decay, linear_end=1e-5)
    expected = [vit_jax_lr(k - 1, total, base, decay, warmup) for k in range(1, total + 1)]
    np.testing.assert_allclose(lrs_used(cfg, total), expected, rtol=1e-9, atol=1e-15)
    assert lrs_used(cfg, 2) == [0.0, pytest.approx(base / warmup)]


def test_linear_decay_reaches_linear_end():
    s = Schedule(warmup=0, total=100, decay="linear", end=1e-5 / 1e-3)
    assert s(100) * 1e-3 == pytest.approx(1e-5) and s(0) == 1.0
    assert s(50) * 1e-3 == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)


@pytest.mark.parametrize("dataset_size, steps, warmup, drops", [
    (50_000, 10_000, 500, (0.3, 0.6, 0.9)),  # CIFAR-sized: supports 500, 3000, 6000, 9000, 10000
    (1_281_167, 20_000, 500, (0.3, 0.6, 0.9)),  # ImageNet-sized
    (5_000, 500, 100, (0.4, 0.6, 0.8)),  # < 20k images: supports 100, 200, 300, 400, 500
])
def test_step_decay_is_bit_hyperrule(dataset_size, steps, warmup, drops):
    s = Schedule(warmup, steps, "step", drops=drops)
    expected = np.array([bit_get_lr(t, dataset_size) for t in range(steps)])
    np.testing.assert_allclose([0.003 * s(t) for t in range(steps)], expected, rtol=1e-12, atol=0)
    assert bit_get_lr(steps, dataset_size) is None  # both end after `steps` updates


def test_step_decay_through_the_optimizer():
    cfg = resolve_config("finetune", optimizer="sgd", lr=0.003, steps=500, warmup=100, decay="step",
                         lr_drops=(0.4, 0.6, 0.8))
    np.testing.assert_allclose(lrs_used(cfg, 500), [bit_get_lr(t, 5_000) for t in range(500)], rtol=1e-12)


def test_resume_restores_the_schedule_including_old_checkpoints():
    cfg = resolve_config("pretrain", lr=1e-3, steps=40, warmup=5, linear_end=1e-5)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    for _ in range(17):
        opt.step()
        sched.step()
    state = sched.state_dict()
    fresh_opt = build_optimizer(model, cfg)
    fresh = build_scheduler(fresh_opt, cfg)
    fresh_opt.load_state_dict(opt.state_dict())
    fresh.load_state_dict(state)
    assert fresh.get_last_lr() == sched.get_last_lr()
    assert sched.get_last_lr()[0] == pytest.approx(vit_jax_lr(17, 40, 1e-3, "linear", 5))
    # A checkpoint from before `end` and `drops` existed holds only warmup/total/decay: it still loads, and the
    # schedule keeps its other settings from the config (linear decay to 0 for those runs).
    old = {**state, "lr_lambdas": [{"warmup": 5, "total": 40, "decay": "linear"} for _ in state["lr_lambdas"]]}
    legacy = build_scheduler(build_optimizer(model, cfg.replace(linear_end=0.0)), cfg.replace(linear_end=0.0))
    legacy.load_state_dict(old)
    assert legacy.last_epoch == 17 and legacy.lr_lambdas[0](20) == pytest.approx(1.0 - 15 / 35)
    legacy.optimizer.step()
    legacy.step()
    assert math.isclose(legacy.get_last_lr()[0], 1e-3 * (1.0 - 13 / 35))

"""`vitlab train`'s AdamW takes torch's fused kernel where torch has one, and it trains the same weights as the
per-tensor (foreach) step within float rounding."""

import copy

import torch

from vitlab.train.config import TrainConfig
from vitlab.train.optim import build_optimizer, describe_optimizer, fused_adamw_fits, param_groups


def _steps(model, optimizer, steps: int = 20) -> None:
    """`steps` AdamW steps on gradients drawn from a fixed stream, the same for every optimizer: a training loop
    would feed each optimizer's rounding back through the model, and Adam scales the backward's rounding noise on
    near-zero gradients up to lr-sized updates, so only the optimizer's own arithmetic is compared."""
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g) * 10 ** torch.randint(-4, 1, (), generator=g).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_train_builds_the_fused_adamw_on_the_cpu(random_tiny_vit):
    optimizer = build_optimizer(random_tiny_vit(0).train(), TrainConfig(lr=1e-3, weight_decay=0.1))
    assert all(g["fused"] for g in optimizer.param_groups)
    assert not any(g["foreach"] for g in optimizer.param_groups)
    assert describe_optimizer(optimizer) == "optim   AdamW, fused kernel"


def test_fused_and_foreach_adamw_agree_after_20_steps(random_tiny_vit):
    cfg = TrainConfig(lr=3e-3, weight_decay=0.1)
    fused_model = random_tiny_vit(0).train()
    foreach_model = copy.deepcopy(fused_model)
    fused = build_optimizer(fused_model, cfg)
    foreach = torch.optim.AdamW(param_groups(foreach_model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas),
                                eps=1e-8, foreach=True)
    start = {n: p.detach().clone() for n, p in fused_model.named_parameters()}
    _steps(fused_model, fused)
    _steps(foreach_model, foreach)
    theirs = dict(foreach_model.named_parameters())
    for name, p in fused_model.named_parameters():
        assert not torch.equal(p, start[name]), name  # every tensor moved: the comparison is not of untouched weights
        torch.testing.assert_close(p, theirs[name], rtol=1e-6, atol=1e-6, msg=name)


def test_fused_only_where_torch_has_the_kernel():
    assert fused_adamw_fits([torch.zeros(2, requires_grad=True)])
    assert not fused_adamw_fits([torch.zeros(2, device="meta")])
    assert not fused_adamw_fits([])

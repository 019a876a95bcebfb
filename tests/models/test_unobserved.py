"""The class-token-only last block in training (`vitlab.models.unobserved`): the same loss and gradients as
`model(x)`, and taken only while nothing can observe the last block or the final norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitlab
from vitlab.models.unobserved import skips_unread_tokens, unread_tokens_skipped

ARCH = dict(image_size=16, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2, num_classes=5)


def random_vit(**kw) -> torch.nn.Module:
    """Random weights everywhere (a zero head would make every gradient below it zero)."""
    model = vitlab.create_model("ViT-Ti/16", **{**ARCH, **kw})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.train()


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, skip: bool) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # stochastic depth: the same per-sample draws in both forms
    if skip:
        with unread_tokens_skipped(model) as skipped:
            assert skipped
            loss = F.cross_entropy(model(x), y)
    else:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kw", [{}, {"drop_path_rate": 0.3}, {"reg_tokens": 2},
                                {"representation_size": 16}])
def test_gradients_equal_the_every_token_forward(kw: dict) -> None:
    model = random_vit(**kw)
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    full_loss, full = loss_and_grads(model, x, y, skip=False)
    fast_loss, fast = loss_and_grads(model, x, y, skip=True)
    assert fast_loss == pytest.approx(full_loss, rel=1e-6)
    assert set(fast) == set(full)
    for name, g in full.items():
        assert g.abs().max() > 0, name  # every parameter reaches the loss in both forms
        torch.testing.assert_close(fast[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_the_last_block_computes_the_class_token_alone_only_within(monkeypatch) -> None:
    model = random_vit()
    cls, calls, seen = type(model), [], []
    original = cls.forward_unobserved
    monkeypatch.setattr(cls, "forward_unobserved", lambda self, x: (calls.append(1), original(self, x))[1])
    x = torch.randn(2, 3, 16, 16)
    with unread_tokens_skipped(model):
        model(x)
    model(x)  # outside: the class's forward, every token
    assert calls == [1] and "forward" not in vars(model)
    handle = model.blocks[-1].mlp.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    with unread_tokens_skipped(model) as skipped:
        model(x)
    handle.remove()
    assert not skipped and calls == [1] and seen == [(2, 17, 32)]


HOOKS = {
    "forward hook on the last block": lambda m: m.blocks[-1].register_forward_hook(lambda *a: None),
    "pre-hook on the last block's attention": lambda m: m.blocks[-1].attn.register_forward_pre_hook(lambda *a: None),
    "forward hook on norm2's": lambda m: m.blocks[-1].norm2.register_forward_hook(lambda *a: None),
    "full backward hook on the MLP": lambda m: m.blocks[-1].mlp.register_full_backward_hook(lambda *a: None),
    "backward pre-hook on fc2": lambda m: m.blocks[-1].mlp.fc2.register_full_backward_pre_hook(lambda *a: None),
    "forward hook on the final norm": lambda m: m.norm.register_forward_hook(lambda *a: None),
    "global forward hook": lambda m: torch.nn.modules.module.register_module_forward_hook(lambda *a: None),
    "global forward pre-hook": lambda m: torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None),
    "global backward hook": lambda m: torch.nn.modules.module.register_module_full_backward_hook(lambda *a: None),
}


@pytest.mark.parametrize("where", list(HOOKS))
def test_any_observer_keeps_every_token(where: str) -> None:
    model = random_vit()
    assert skips_unread_tokens(model)
    handle = HOOKS[where](model)
    try:
        assert not skips_unread_tokens(model)
    finally:
        handle.remove()
    assert skips_unread_tokens(model)


def test_hooks_elsewhere_change_nothing() -> None:
    """A hook on an earlier block, the patch embedding or the head sees the same tensors in both forms."""
    model = random_vit()
    handles = [model.blocks[0].register_forward_hook(lambda *a: None),
               model.patch_embed.register_forward_hook(lambda *a: None),
               model.head.register_forward_hook(lambda *a: None),
               model.register_forward_hook(lambda *a: None)]
    assert skips_unread_tokens(model)
    for h in handles:
        h.remove()


@pytest.mark.parametrize("kw", [{"class_token": False, "global_pool": "avg"}, {"global_pool": ""}])
def test_models_that_read_every_token_keep_it(kw: dict) -> None:
    assert not skips_unread_tokens(random_vit(**kw))


def test_a_replaced_forward_and_other_models_are_left_alone() -> None:
    model = random_vit()
    model.forward = lambda x: x  # someone's own forward on the instance: theirs runs
    assert not skips_unread_tokens(model)
    bit = vitlab.create_model("BiT-R50x1", num_classes=3)
    with unread_tokens_skipped(bit) as skipped:
        assert not skipped and "forward" not in vars(bit)

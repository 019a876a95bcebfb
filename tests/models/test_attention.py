"""The two attention forms: "matmul" is softmax(q·kᵀ/√hd + bias)·v to float32 precision (forward and gradients,
against a float64 closed form), agrees with "flash" within bf16's rounding under autocast (forward and every
gradient, on the function and on a ViT's training step), and inference computes "flash" whatever the setting."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from vitlab.models import ViTConfig, build_model
from vitlab.models.attention import attend, set_attention_form


def _inputs(n=2, h=3, tq=7, t=7, hd=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, h, tq, hd, generator=g)
    k, v = torch.randn(n, h, t, hd, generator=g), torch.randn(n, h, t, hd, generator=g)
    return [x.to(dtype).requires_grad_() for x in (q, k, v)]


def _closed_form(q, k, v, bias=None):
    logits = q.double() @ k.double().transpose(-2, -1) / q.shape[-1] ** 0.5
    if bias is not None:
        logits = logits + bias.double()
    return torch.softmax(logits, dim=-1) @ v.double()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("tq, with_bias", [(7, False), (1, False), (7, True)])
def test_matmul_form_is_the_closed_form_in_float32(tq, with_bias):
    """Forward and the gradients of q, k, v within 1e-5 of a float64 closed form (one query: the class token of the
    last block; a bias: relative position logits)."""
    q, k, v = _inputs(tq=tq)
    bias = torch.randn(2, 3, tq, 7, generator=torch.Generator().manual_seed(1)) if with_bias else None
    grad = torch.randn(2, 3, tq, 16, generator=torch.Generator().manual_seed(2))
    got = attend(q, k, v, bias, form="matmul")
    got.backward(grad)
    grads = [x.grad.clone() for x in (q, k, v)]
    ref_inputs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    reference = _closed_form(*ref_inputs, bias)
    reference.backward(grad.double())
    assert _rel(got, reference) < 1e-5
    for mine, ref in zip(grads, [x.grad for x in ref_inputs], strict=True):
        assert _rel(mine, ref) < 1e-5


def test_the_forms_agree_within_bf16_rounding_forward_and_gradients():
    """At a ViT-S/16-like shape in bf16, as training computes it: matmul's output and its q, k, v gradients within
    bf16's rounding of flash's (both within 2 % of a float64 reference, and of each other)."""
    q, k, v = _inputs(n=2, h=6, tq=197, t=197, hd=64, dtype=torch.bfloat16)
    grad = torch.randn(2, 6, 197, 64, generator=torch.Generator().manual_seed(3))
    results = {}
    for form in ("flash", "matmul"):
        out = attend(q, k, v, form=form)
        out.backward(grad.bfloat16())
        results[form] = [out.detach()] + [x.grad.clone() for x in (q, k, v)]
        q.grad = k.grad = v.grad = None
    ref_inputs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    reference = _closed_form(*ref_inputs)
    reference.backward(grad.double())
    references = [reference.detach()] + [x.grad for x in ref_inputs]
    for flash, matmul, ref in zip(results["flash"], results["matmul"], references, strict=True):
        assert matmul.dtype == torch.bfloat16
        assert _rel(flash, ref) < 2e-2 and _rel(matmul, ref) < 2e-2 and _rel(matmul, flash) < 2e-2


def test_without_gradients_the_matmul_setting_computes_flash():
    q, k, v = (x.detach() for x in _inputs())
    with torch.no_grad():
        assert torch.equal(attend(q, k, v, form="matmul"), F.scaled_dot_product_attention(q, k, v))


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="^attention form must be one of flash, matmul, not 'fast'$"):
        set_attention_form(torch.nn.Linear(2, 2), "fast")
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="^attention form must be one of flash, matmul, not 'fast'$"):
        attend(q, k, v, form="fast")


def _vit(**kw) -> torch.nn.Module:
    """Every parameter drawn at random: a zero-initialised head would leave every other gradient zero."""
    model = build_model(ViTConfig(image_size=32, patch_size=8, width=64, depth=2, mlp_dim=128, num_heads=2,
                                  num_classes=5, **kw))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


@pytest.mark.parametrize("kw", [{}, {"pos_embed": "relative"}], ids=["learned", "relative"])
def test_a_vit_trains_the_same_in_either_form(kw):
    """A ViT's training step (forward, loss, backward) under bf16 autocast: loss and every parameter's gradient
    within bf16's rounding in both forms; in float32 within 1e-5. Every attention module takes the setting."""
    flash = _vit(**kw).train()
    matmul = set_attention_form(copy.deepcopy(flash), "matmul")
    assert {m.attention_form for m in matmul.modules() if hasattr(m, "attention_form")} == {"matmul"}
    assert len([m for m in matmul.modules() if hasattr(m, "attention_form")]) == 2
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 3])
    for dtype, tolerance in ((torch.bfloat16, 3e-2), (None, 1e-5)):
        losses, grads = [], []
        for model in (flash, matmul):
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            losses.append(loss.item())
            grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        assert losses[1] == pytest.approx(losses[0], rel=tolerance)
        for name, g in grads[0].items():
            assert _rel(grads[1][name], g) < tolerance, name

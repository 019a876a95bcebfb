"""The weight-standardised convolutions of the hybrid stem and of BiT (models/stdconv.py): an inference forward
reuses each standardised kernel, eager and torch.fx-traced, while the weights are unchanged; every change of a
weight (an optimizer step, load_state_dict, a cast) is seen, a forward under autograd recomputes with the
gradients of a model that never cached, and graph capture (TorchScript tracing) computes the kernels from the
weights. Standardisations are counted at the torch call (`torch.var_mean` for the hybrid's formula,
`F.batch_norm` over the kernel for BiT's), which is what a forward pays for."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vitlab.models import BiTConfig, ResNetConfig, ViTConfig, bit, build_model, resnet

STD_CONVS = (resnet.StdConv2dSame, bit.StdConv2d)

CASES = {  # (config, input size): an R26-style stem cut to two stages at half width, a two-stage BiT
    "hybrid": (ViTConfig(image_size=32, patch_size=1, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=3,
                         resnet=ResNetConfig(layers=(1, 1), width_factor=0.5)), 32),
    "bit": (BiTConfig(layers=(1, 1), num_classes=3, image_size=32), 32),
}


def build(case: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model in eval mode with random weights (off the zero heads and GroupNorm scales), and an input."""
    config, size = CASES[case]
    torch.manual_seed(seed)
    model = build_model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model, torch.randn(2, 3, size, size)


def fresh(model: torch.nn.Module) -> torch.nn.Module:
    """A new model holding a copy of `model`'s weights and nothing cached."""
    other = build_model(model.config).to(next(model.parameters()).dtype).train(model.training)
    other.load_state_dict(model.state_dict())
    return other


class CountStandardisations(TorchFunctionMode):
    """Counts the calls that compute a standardisation: var_mean (the hybrid's) and batch_norm (BiT's; the
    models' own normalisations are GroupNorm and LayerNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func in (torch.var_mean, F.batch_norm, torch.batch_norm)
        return func(*args, **(kwargs or {}))


def standardisations(forward, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    with CountStandardisations() as count:
        out = forward(x)
    return count.calls, out


def convs(model: torch.nn.Module) -> int:
    return sum(isinstance(m, STD_CONVS) for m in model.modules())


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("case", CASES)
def test_inference_standardises_each_kernel_once(case, precision):
    """Two inference forwards standardise each kernel once, in float32 also under bf16 autocast, with the logits
    of a model that never cached."""
    model, x = build(case)
    autocast = torch.autocast("cpu", torch.bfloat16, enabled=precision != "fp32")
    with torch.no_grad(), autocast:
        first = standardisations(model, x)
        second = standardisations(model, x)
        expected = fresh(model).eval()(x)
    assert (first[0], second[0]) == (convs(model), 0)
    assert torch.equal(first[1], expected) and torch.equal(second[1], expected)
    assert all(m._standardized[1].dtype == torch.float32 for m in model.modules()
               if isinstance(m, STD_CONVS))


@pytest.mark.parametrize("case", CASES)
def test_every_weight_change_is_seen(case):
    """After an optimizer step, load_state_dict or a cast, the next inference forward standardises the new
    weights once (the logits of a fresh model), and the one after reuses them."""
    model, x = build(case)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()

    def load() -> None:
        model.load_state_dict(build(case, seed=3)[0].state_dict())

    changes = {"optimizer step": step, "load_state_dict": load, "double": model.double}
    with torch.no_grad():
        model(x)
    for name, change in changes.items():
        change()
        x = x.to(next(model.parameters()).dtype)
        with torch.no_grad():
            counts = [standardisations(model, x)[0] for _ in range(2)]
            assert torch.equal(model(x), fresh(model).eval()(x)), name
        assert counts == [convs(model), 0], name


@pytest.mark.parametrize("case", CASES)
def test_forwards_under_autograd_recompute_with_fresh_gradients(case):
    """With autograd on (eval or training mode) every forward standardises afresh and the weights' gradients equal
    those of a model that never cached; inference afterwards reuses kernels again."""
    model, x = build(case)
    with torch.no_grad():
        model(x)
    for mode in (False, True):
        model.train(mode)
        reference = fresh(model)
        counts = [standardisations(lambda x: model(x).square().mean().backward(), x)[0] for _ in range(2)]
        reference(x).square().mean().backward()
        reference(x).square().mean().backward()
        assert counts == [convs(model)] * 2
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert p.grad is not None and torch.equal(p.grad, q.grad), name
        model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        assert [standardisations(model, x)[0] for _ in range(2)] == [convs(model), 0]


@pytest.mark.parametrize("case", CASES)
def test_fx_traced_model_reuses_the_kernels_and_sees_updates(case):
    """A torch.fx-traced model standardises each kernel once over two inference forwards, as the eager model,
    and sees an in-place update of a weight."""
    model, x = build(case)
    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        counts = [standardisations(traced, x)[0] for _ in range(2)]
        assert torch.equal(traced(x), model(x))
        next(m for m in model.modules() if isinstance(m, STD_CONVS)).weight.mul_(-0.5)
        assert torch.equal(traced(x), fresh(model).eval()(x))
    assert counts == [convs(model), 0]


@pytest.mark.parametrize("case", CASES)
def test_torchscript_trace_computes_the_kernels_from_the_weights(case):
    """A TorchScript trace (the graph ONNX export reads) holds no standardised kernel as a constant: traced after
    inference forwards, it follows a later in-place update of the weights."""
    model, x = build(case)
    with torch.no_grad():
        before = model(x)
        traced = torch.jit.trace(model, x, check_trace=False)
        for m in model.modules():
            if isinstance(m, STD_CONVS):
                m.weight.add_(torch.randn_like(m.weight))
        expected = fresh(model).eval()(x)
        assert not torch.allclose(expected, before, rtol=1e-3)  # the change reaches the logits
        torch.testing.assert_close(traced(x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_inference_tensors_copies_and_casts_hold_no_kernels(case):
    """A model made under inference_mode (weights without a version counter) computes afresh, with a fresh
    model's logits; a deep copy, a pickle and a cast carry no standardised kernels."""
    with torch.inference_mode():
        model, x = build(case)
        assert torch.equal(model(x), fresh(model).eval()(x))
    model, x = build(case)
    with torch.no_grad():
        model(x)
    assert all(m._standardized is not None for m in model.modules() if isinstance(m, STD_CONVS))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    pickled = torch.load(buffer, weights_only=False)
    for other in (copy.deepcopy(model), pickled, model.double()):
        assert all(m._standardized is None for m in other.modules() if isinstance(m, STD_CONVS))


@pytest.mark.parametrize("case", CASES)
def test_compiled_model_computes_the_kernels_from_the_weights(case):
    """A torch.compile graph (Dynamo's capture) standardises from the weights: compiled after inference forwards
    filled the cache, it follows a later in-place update of the weights."""
    model, x = build(case)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        model(x)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        for m in model.modules():
            if isinstance(m, STD_CONVS):
                m.weight.add_(torch.randn_like(m.weight))
        torch.testing.assert_close(compiled(x), fresh(model).eval()(x), rtol=1e-5, atol=1e-6)

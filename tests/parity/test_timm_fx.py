"""vitlab models under torch.fx symbolic tracing, as timm's test_models.py checks timm's (test_model_forward_fx,
test_model_backward_fx): every family made by a timm name, and vitlab's own ViT options, traces with torch.fx and
through torchvision's create_feature_extractor with timm's tracer settings; the traced model's outputs and
gradients equal the eager model's, at the native input size and at another one, and the traced model refuses a
bad input with the eager message."""

from __future__ import annotations

import warnings

import pytest
import torch
from timm.models._features_fx import create_feature_extractor as timm_feature_extractor
from timm.models._features_fx import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

import vitlab

warnings.filterwarnings("ignore", category=UserWarning)

# (name, keywords, another input size the traced model must take): small versions of each family
CASES = [
    ("vit_tiny_patch16_224", {"depth": 2, "img_size": 32}, 48),  # class token
    ("deit_tiny_patch16_224", {"depth": 2, "img_size": 32}, 48),
    ("vit_base_patch16_reg4_gap_256", {"depth": 2, "img_size": 32, "embed_dim": 32, "num_heads": 2}, 48),  # registers
    ("vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 28}, 42),  # + layer scale
    ("vit_tiny_r_s16_p8_224", {"depth": 1, "img_size": 64}, 96),  # hybrid: SAME padding of the ResNet stem
    ("resnetv2_50x1_bit", {"layers": (1, 1, 1, 1)}, 48),  # BiT
    ("ViT-Ti/16-gap", {"depth": 2, "image_size": 32}, 48),
    ("ViT-Ti/16", {"depth": 2, "image_size": 32, "pos_embed": "2d"}, 48),
    ("ViT-Ti/16", {"depth": 2, "image_size": 32, "pos_embed": "relative"}, 48),
    ("ViT-Ti/16", {"depth": 2, "image_size": 32, "dynamic_img_pad": True}, 40),  # padded to 48
]
IDS = [f"{n}-{k.get('pos_embed', '')}{'pad' if 'dynamic_img_pad' in k else ''}".rstrip("-") for n, k, _ in CASES]


def tracer_kwargs() -> dict:
    """timm's leaf modules and functions, as timm's tests and feature extraction pass them."""
    return {"leaf_modules": list(get_notrace_modules()), "autowrap_functions": list(get_notrace_functions())}


def build(name: str, kwargs: dict) -> torch.nn.Module:
    """The model, taking any input size as timm's does with dynamic_img_size=True (a ResNet always does)."""
    torch.manual_seed(0)
    dynamic = {} if name.startswith("resnetv2") else {"dynamic_img_size": True}
    model = vitlab.create_model(name, num_classes=5, **kwargs, **dynamic)
    with torch.no_grad():  # off the initial values (zero heads, zero GroupNorm scales)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def inputs(model: torch.nn.Module, other: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(2, 3, *model.config.image_size), torch.randn(2, 3, other, other)]


def fx_model(model: torch.nn.Module) -> torch.fx.GraphModule:
    """timm's test helper, rebuilt: torchvision's extractor returning the nodes that feed the graph's output."""
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs())
    graph = NodePathTracer(**tracer_kwargs()).trace(model)
    nodes = list(reversed(graph.nodes))
    names = [n.name for n in nodes]
    train_return = [train_nodes[-names.index(n.name)] for n in nodes[0].all_input_nodes]
    return create_feature_extractor(model, train_return_nodes=train_return, eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=tracer_kwargs())


@pytest.mark.parametrize("name, kwargs, other", CASES, ids=IDS)
def test_fx_trace_outputs_equal_eager_at_any_input_size(name, kwargs, other):
    model = build(name, kwargs).eval()
    with torch.no_grad():  # as timm's test traces: inference, where vitlab caches resampled tables
        traced = torch.fx.symbolic_trace(model)
        assert not symbolic_state(model)  # the trace cached no stand-in tensor in the model
        fx = fx_model(model)
        for x in inputs(model, other):
            eager = model(x)
            assert torch.equal(traced(x), eager)
            assert torch.equal(next(iter(fx(x).values())), eager)


def symbolic_state(model: torch.nn.Module) -> list[str]:
    """Attributes of the model's modules that hold a torch.fx Proxy, also inside tuples, lists and dicts."""
    def holds(value: object) -> bool:
        if isinstance(value, torch.fx.Proxy):
            return True
        items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple | list) else ()
        return any(holds(v) for v in items) or (isinstance(value, dict) and any(holds(k) for k in value))

    return [f"{name}.{attr}" for name, m in model.named_modules() for attr, v in vars(m).items() if holds(v)]


@pytest.mark.parametrize("name, kwargs, other", CASES, ids=IDS)
def test_fx_backward_gives_the_eager_gradients(name, kwargs, other):
    model = build(name, kwargs).train()
    x = inputs(model, other)[1]
    model(x).square().mean().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    fx = fx_model(model)
    out = torch.cat(tuple(fx(x).values()))
    out.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert out.shape == (2, 5)
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    for n, g in eager.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7, msg=n)


# (name, keywords, {graph node: the module whose eager output it is})
RETURN_NODES = [
    ("vit_tiny_patch16_224", {"depth": 2, "img_size": 32}, {"blocks.0.add_1": "blocks.0", "norm": "norm"}),
    ("vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 28}, {"blocks.1.add_1": "blocks.1", "head": "head"}),
    ("vit_tiny_r_s16_p8_224", {"depth": 1, "img_size": 64}, {"patch_embed.proj": "patch_embed.proj"}),
    ("resnetv2_50x1_bit", {"layers": (1, 1, 1, 1)}, {"stages.1.0.add_": "stages.1.0", "norm": "norm"}),
]


@pytest.mark.parametrize("name, kwargs, nodes", RETURN_NODES, ids=[n for n, _, _ in RETURN_NODES])
def test_feature_extractor_on_return_nodes_equals_eager_activations(name, kwargs, nodes):
    model = build(name, kwargs).eval()
    x = inputs(model, 32)[0]
    seen = {}

    def keep(node: str):  # a copy: later layers may work in place on a module's output
        return lambda module, args, out: seen.__setitem__(node, (out[0] if isinstance(out, tuple) else out).clone())

    hooks = [model.get_submodule(path).register_forward_hook(keep(node)) for node, path in nodes.items()]
    with torch.no_grad():
        model(x)
        for hook in hooks:
            hook.remove()
        for extractor in (create_feature_extractor(model, list(nodes), tracer_kwargs=tracer_kwargs()),
                          timm_feature_extractor(model, list(nodes))):
            out = extractor(x)
            assert list(out) == list(nodes)
            for node in nodes:
                assert torch.equal(out[node], seen[node]), node


BAD_INPUTS = {
    "uint8": (lambda x: x.to(torch.uint8), TypeError, "model input must be floating point, got torch.uint8; "),
    "3-D": (lambda x: x[0], ValueError, "model input must be 4-D (N, 3, H, W), got shape (3, 32, 32); add the "
                                        "batch dimension with x[None]"),
    "channels-last": (lambda x: x.permute(0, 2, 3, 1), ValueError, "model input must have 3 channels in dimension "
                      "1, got shape (2, 32, 32, 3); it looks channels-last (N, H, W, C): use x.permute(0, 3, 1, 2)"),
    "float64": (lambda x: x.double(), TypeError, "model input is torch.float64 but the model's weights are "
                "torch.float32; convert the input with x.to(torch.float32)"),
    "odd size": (lambda x: x[..., :30, :], ValueError, "input size (30, 32) is not divisible by the effective "
                 "patch size 16; resize or crop to a multiple of 16"),
    "another size, fixed": (lambda x: x[..., :16, :], ValueError, "model input is 16×32 pixels but this model "
                            "takes 32×32; resize and crop with vitlab.transforms(model)"),
}


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_traced_model_refuses_a_bad_input_with_the_eager_message(bad):
    change, error, message = BAD_INPUTS[bad]
    model = build("vit_tiny_patch16_224", {"depth": 1, "img_size": 32}).eval()
    model.dynamic_img_size = bad != "another size, fixed"
    traced = torch.fx.symbolic_trace(model)
    x = change(torch.randn(2, 3, 32, 32))
    for forward in (model, traced):
        with pytest.raises(error) as info:
            forward(x)
        assert str(info.value).startswith(message)


def test_traced_bit_refuses_a_bad_input_with_the_eager_message():
    model = build("resnetv2_50x1_bit", {"layers": (1, 1, 1, 1)}).eval()
    traced = torch.fx.symbolic_trace(model)
    for forward in (model, traced):
        with pytest.raises(ValueError, match=r"^model input must have 3 channels in dimension 1, got shape "
                                             r"\(2, 4, 32, 32\); drop the alpha channel with x\[:, :3\]$"):
            forward(torch.randn(2, 4, 32, 32))

"""The model methods timm users call, against timm's own on the same weights: forward_intermediates (ViT and BiT),
BiT's prune_intermediate_layers and unpooled head, features_only with feature_info, get_classifier /
reset_classifier, and set_grad_checkpointing (same gradients, and the blocks really are recomputed)."""

import copy

import pytest
import torch
from torch import nn

import vitlab
from vitlab.models.timm_keys import bit_timm_key
from vitlab.weights.timm import timm_model_args, timm_model_name, to_timm_state_dict
from vitlab.weights.timm_bit import to_timm_bit_state_dict

pytest.importorskip("timm")
import timm  # noqa: E402
import timm.data  # noqa: E402


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere (fresh heads, biases and norm offsets are zero and would hide a mistake)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if p.ndim == 1 else 0.2 * noise)
    return model.eval()


def vit_pair(name: str = "ViT-Ti/16", **kwargs):
    model = randomize(vitlab.create_model(name, image_size=(32, 48), num_classes=5, depth=3, **kwargs))
    ref = timm.create_model(timm_model_name(model.config), pretrained=False, **timm_model_args(model.config))
    ref.eval().load_state_dict(to_timm_state_dict(model))
    return model, ref


X = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))  # non-square: a 2×3 patch grid (native)


def assert_same(a, b, tol=1e-5):
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            assert_same(u, v, tol)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k], tol)
    else:
        assert a.shape == b.shape and (a - b).abs().max() <= tol * b.abs().max()


CALLS = [
    dict(), dict(indices=2), dict(indices=[0, -1]), dict(norm=True), dict(output_fmt="NLC"),
    dict(intermediates_only=True), dict(indices=[1], stop_early=True), dict(return_prefix_tokens=True),
    dict(output_dict=True, return_prefix_tokens=True), dict(output_dict=True, intermediates_only=True),
]  # fmt: skip


@pytest.mark.parametrize("variant", ["ViT-Ti/16", "ViT-Ti/16-gap"])
def test_vit_forward_intermediates_equals_timms(variant):
    model, ref = vit_pair(variant)
    with torch.no_grad():
        for kwargs in CALLS:
            ours = model.forward_intermediates(X, **kwargs)
            theirs = ref.forward_intermediates(X, **kwargs)
            assert_same(ours, theirs)
        final, maps = model.forward_intermediates(X)
        assert len(maps) == 3 and maps[0].shape == (2, 192, 2, 3)
        assert torch.allclose(final, model.forward_features(X), atol=1e-6)


def test_bit_forward_intermediates_equals_timms():
    model = randomize(vitlab.create_model("BiT-R50x1", num_classes=5, ws_eps=1e-8))  # timm's eps
    ref = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=5).eval()
    ref.load_state_dict(to_timm_bit_state_dict(model))
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for kwargs in (dict(), dict(indices=[0, 2]), dict(norm=True, intermediates_only=True),
                       dict(indices=2, stop_early=True)):
            assert_same(model.forward_intermediates(x, **kwargs), ref.forward_intermediates(x, **kwargs), 1e-4)


@pytest.fixture(scope="module")
def bit_pair():
    """vitlab's BiT-R50x1 with random weights and timm's resnetv2_50x1_bit holding the same ones (timm's eps)."""
    model = randomize(vitlab.create_model("BiT-R50x1", num_classes=5, ws_eps=1e-8))
    ref = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=5).eval()
    ref.load_state_dict(to_timm_bit_state_dict(model))
    return model, ref


PRUNES = [
    dict(indices=[1, 2]),  # stages 3 and 4 go, with the final norm and the head
    dict(indices=[0]),  # the root conv alone: the max-pool goes too
    dict(indices=[0, 4], prune_head=False),  # nothing goes
    dict(indices=[0, 4], prune_head=False, prune_norm=True),  # the final norm alone goes: the head pools the raw map
    dict(indices=1),  # the last feature: every stage stays, the head goes and nothing pools
    dict(indices=[3], prune_head=False, prune_norm=True),  # cutting a stage takes the head even when not asked
]  # fmt: skip


@pytest.mark.parametrize("prune", PRUNES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_bit_prune_intermediate_layers_equals_timms(bit_pair, prune):
    """timm's ResNetV2.prune_intermediate_layers on both models, then everything the pruned models give: the
    indices returned, forward (logits, or the unpooled map), forward_intermediates (indices still count the
    unpruned model's five features, as timm's), the widths, class count and pooling, and the same tensors left."""
    model, ref = (copy.deepcopy(m) for m in bit_pair)
    assert model.prune_intermediate_layers(**prune) == ref.prune_intermediate_layers(**prune)
    assert sorted(bit_timm_key(k) for k in model.state_dict()) == sorted(ref.state_dict())
    assert (model.num_features, model.head_hidden_size, model.num_classes) == (
        ref.num_features, ref.head_hidden_size, ref.num_classes)
    assert model.global_pool == ref.head.global_pool.pool_type
    x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert_same(model(x), ref(x), 1e-4)
        for kwargs in (dict(), dict(indices=2), dict(indices=prune["indices"], stop_early=True), dict(norm=True),
                       dict(indices=[0, -1], intermediates_only=True)):
            assert_same(model.forward_intermediates(x, **kwargs), ref.forward_intermediates(x, **kwargs), 1e-4)


def test_bit_unpooled_head_acts_at_each_position_as_timms(bit_pair, tmp_path):
    """Without pooling (a pruned head, or global_pool ""), a new head classifies every position as timm's 1×1
    convolution does; "avg" pools again. vitlab.save refuses a pruned BiT in one line: no config describes it."""
    model, ref = (copy.deepcopy(m) for m in bit_pair)
    model.prune_intermediate_layers([2]), ref.prune_intermediate_layers([2])
    with pytest.raises(ValueError, match="^vitlab.save: the model no longer pools"):
        vitlab.save(model, tmp_path / "pruned.safetensors")
    model.reset_classifier(3), ref.reset_classifier(3)
    with torch.no_grad():
        model.head.weight.normal_(generator=torch.Generator().manual_seed(5)), model.head.bias.fill_(0.5)
        ref.head.fc.weight.copy_(model.head.weight[:, :, None, None]), ref.head.fc.bias.copy_(model.head.bias)
        x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(6))
        assert model.global_pool == "" and model(x).shape == (2, 3, 8, 6)
        assert_same(model(x), ref(x), 1e-4)
        model.reset_classifier(3, "avg")
        assert model.global_pool == "avg" and model(x).shape == (2, 3)
        unpooled = vitlab.create_model("resnetv2_50x1_bit", num_classes=0, global_pool="").eval()
        assert torch.equal(unpooled(x), unpooled.forward_features(x))


def test_intermediate_errors_are_value_errors():
    model = vitlab.create_model("ViT-Ti/16", image_size=32, depth=2)
    for kwargs, needle in ((dict(indices=3), "last-n indices=3 is out of range: use 1 to 2"),
                           (dict(indices=[2]), "feature indices [2] out of range"),
                           (dict(output_fmt="NHWC"), "output_fmt='NHWC'")):  # fmt: skip
        with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            model.forward_intermediates(X, **kwargs)


def test_forward_inspect_keeps_vitlabs_dict():
    model = vitlab.create_model("ViT-Ti/16", image_size=32, depth=2)
    out = model.forward_inspect(X[:, :, :, :32])
    assert len(out["tokens"]) == 2 and out["attention"][0].shape == (2, 3, 5, 5) and out["grid"] == (2, 2)


# --- features_only ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, timm_name, kwargs", [
    ("ViT-Ti/16", "vit_tiny_patch16_224", {}),
    ("ViT-Ti/16", "vit_tiny_patch16_224", dict(out_indices=(0, 2))),
    ("R+ViT-Ti/16", "vit_tiny_r_s16_p8_224", {}),
    ("BiT-R50x1", "resnetv2_50x1_bit", {}),
    ("BiT-R50x1", "resnetv2_50x1_bit", dict(out_indices=(1, 2))),
])  # fmt: skip
def test_features_only_shapes_match_feature_info_and_timm(name, timm_name, kwargs):
    dynamic = {} if "BiT" in name else {"dynamic_img_size": True}  # the 64×96 input below
    net = vitlab.create_model(name, features_only=True, image_size=64, **kwargs, **dynamic).eval()
    with torch.device("meta"):
        ref = timm.create_model(timm_name, pretrained=False, features_only=True, img_size=64, **kwargs) \
            if "BiT" not in name else timm.create_model(timm_name, pretrained=False, features_only=True, **kwargs)
    assert list(net.feature_info) == ref.feature_info.get_dicts(keys=("num_chs", "reduction", "module"))
    assert net.feature_info.channels() == ref.feature_info.channels()
    with torch.no_grad():
        maps = net(torch.randn(2, 3, 64, 96))
    assert [m.shape for m in maps] == [(2, f["num_chs"], 64 // f["reduction"], 96 // f["reduction"])
                                       for f in net.feature_info]  # fmt: skip
    assert all(p.grad is None for p in net.parameters())
    loss = sum(m.square().mean() for m in net.train()(torch.randn(2, 3, 64, 64)))
    loss.backward()  # nothing left that the features do not use: DDP needs no find_unused_parameters
    assert all(p.grad is not None for p in net.parameters())
    net.set_grad_checkpointing()  # forwarded to the backbone, as timm's feature wrappers do
    assert net.model.grad_checkpointing
    assert timm.data.resolve_data_config(model=net)["input_size"] == (3, 64, 64)


# --- classifier ------------------------------------------------------------------------------------------------
def test_get_and_reset_classifier():
    model = vitlab.create_model("ViT-Ti/16", image_size=32, depth=1, representation_size=16)
    assert model.get_classifier() is model.head
    model.reset_classifier(7, "token")
    assert model.get_classifier().out_features == 7 and model.num_classes == 7 and model.pre_logits is None
    assert not model.head.weight.any()  # the paper's zero-initialised head
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    with pytest.raises(ValueError, match="vitlab pools with 'token' or 'avg'"):
        model.reset_classifier(7, "max")  # timm's other pools (tests/parity/test_timm_dropin.py: "avg" as timm)
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), nn.Identity) and model(torch.randn(1, 3, 32, 32)).shape == (1, 192)
    bit = vitlab.create_model("BiT-R50x1", num_classes=3)
    bit.reset_classifier(4, global_pool="avg")
    assert bit.get_classifier().out_features == 4 and bit.pretrained_cfg["num_classes"] == 4
    with pytest.raises(ValueError, match="pools with 'avg'"):
        bit.reset_classifier(4, global_pool="token")


# --- gradient checkpointing -------------------------------------------------------------------------------------
def grads(model: nn.Module, x: torch.Tensor, checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of one training step (dropout and stochastic depth on, same seed) and how often the first
    block/unit ran forward."""
    model.set_grad_checkpointing(checkpointing)
    model.zero_grad()
    first = model.blocks[0] if hasattr(model, "blocks") else model.stages[0][0]
    calls = []
    handle = first.register_forward_pre_hook(lambda *_: calls.append(1))  # pre: the recompute may stop early
    torch.manual_seed(0)
    model.train()(x).square().sum().backward()
    handle.remove()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, len(calls)


@pytest.mark.parametrize("name, kwargs", [
    ("ViT-Ti/16", dict(image_size=32, depth=3, dropout=0.1, drop_path_rate=0.3)),
    ("R+ViT-Ti/16", dict(image_size=64, depth=2, drop_path_rate=0.3)),
    ("BiT-R50x1", dict(image_size=32)),
])  # fmt: skip
def test_grad_checkpointing_gives_the_same_gradients(name, kwargs):
    model = randomize(vitlab.create_model(name, num_classes=4, **kwargs))
    x = torch.randn(4, 3, *model.config.image_size, generator=torch.Generator().manual_seed(3))
    plain, once = grads(model, x, False)
    ckpt, twice = grads(model, x, True)
    assert (once, twice) == (1, 2)  # recomputed in the backward: checkpointing is really on
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for k in plain:
        assert torch.equal(plain[k], ckpt[k]), k


@pytest.mark.parametrize("kwargs", [dict(), dict(pos_embed="2d"), dict(pos_embed="relative"), dict(classifier="gap")])
def test_timm_optimizer_factory_decays_what_vitlab_decays(kwargs):
    """timm's create_optimizer_v2 reads no_weight_decay(): its decayed tensors are vitlab's (kernels only)."""
    from timm.optim import create_optimizer_v2

    from vitlab.train.optim import param_groups

    model = vitlab.create_model("R+ViT-Ti/16", image_size=32, depth=2, **kwargs)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    theirs = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    ours = {id(p) for g in param_groups(model, 0.05) if g["weight_decay"] > 0 for p in g["params"]}
    assert theirs == ours and len(ours) > 0

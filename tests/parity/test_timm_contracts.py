"""timm's generic model contracts (the ones its tests/test_models.py and its optimizer factory rely on) on every
ViT, DeiT, register and hybrid name vitlab builds, each against timm's model of the same name: head sizes,
`pretrained_cfg["fixed_input_size"]`, `features_only=True, feature_cls="getter"`, layer-wise learning-rate decay
groups (`group_matcher`, `no_weight_decay`; BiT's groups too) and `prune_intermediate_layers`. Small sizes (depth
1-3, a 56 or 64 pixel input, width 64 where the width is not what is checked) keep every name fast; none of these
contracts depends on them."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
from timm.models import group_parameters
from timm.optim import create_optimizer_v2

import vitlab
from vitlab.api import model_config_for
from vitlab.models.timm_keys import bit_timm_key, timm_key

warnings.filterwarnings("ignore", category=UserWarning)

NAMES = vitlab.list_models(["vit_*", "deit_*"])
# timm names whose models normalise after pooling (fc_norm): the ones where pruning the head removes a LayerNorm
FC_NORM_NAMES = [n for n in NAMES if model_config_for(n, {}).fc_norm]


NARROW = {"embed_dim": 64, "num_heads": 2, "mlp_ratio": 2.0}


def small(name: str) -> dict:
    return {"img_size": 56 if "patch14" in name else 64}


def pair(name: str, depth: int = 2, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """vitlab's and timm's model of `name`, both at depth `depth`, a small input size and `kwargs`."""
    kwargs = {"depth": depth, **small(name), **kwargs}
    return vitlab.create_model(name, **kwargs), timm.create_model(name, pretrained=False, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_head_sizes_are_timms(name):
    model, ref = pair(name, depth=1)  # the name's own width
    assert model.num_classes == ref.num_classes  # DINOv2: 0, a backbone; the rest: 1000 or their tag's count
    assert model.head_hidden_size == ref.head_hidden_size
    size = small(name)["img_size"]
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        assert model.forward_head(model.forward_features(x), pre_logits=True).shape[-1] == model.head_hidden_size
        model.reset_classifier(0)  # timm's test: the pooled output is head_hidden_size wide
        assert model(x).shape == (1, ref.head_hidden_size)


@pytest.mark.parametrize("name", NAMES)
def test_fixed_input_size_is_timms(name):
    model = vitlab.create_model(name, depth=1, **small(name), **NARROW)
    assert model.pretrained_cfg["fixed_input_size"] is timm.models.get_pretrained_cfg(name).fixed_input_size is True
    assert model.default_cfg["fixed_input_size"] is True


@pytest.mark.parametrize("name", NAMES)
def test_features_only_getter_is_timms(name):
    kwargs = {"depth": 3, **small(name), **NARROW}
    model = vitlab.create_model(name, features_only=True, feature_cls="getter", **kwargs).eval()
    ref = timm.create_model(name, pretrained=False, features_only=True, feature_cls="getter", **kwargs).eval()
    assert model.feature_info.channels() == ref.feature_info.channels()
    assert model.feature_info.reduction() == ref.feature_info.reduction()
    x = torch.randn(1, 3, kwargs["img_size"], kwargs["img_size"])
    with torch.no_grad():
        assert [tuple(f.shape) for f in model(x)] == [tuple(f.shape) for f in ref(x)]


@pytest.mark.parametrize("name", NAMES)
def test_feature_cls_errors_name_the_model_asked_for(name):
    with pytest.raises(ValueError, match=r"^feature_cls='hook': .*feature_cls='getter'"):
        vitlab.create_model(name, features_only=True, feature_cls="hook", depth=1)
    with pytest.raises(ValueError, match="feature_cls applies only with features_only=True"):
        vitlab.create_model(name, feature_cls="getter", depth=1)
    with pytest.raises(ValueError) as refused:
        vitlab.create_model(name, features_only=True, foo=1)
    assert str(refused.value).startswith(f"{name} takes no keyword 'foo'")


def lr_groups(model: torch.nn.Module, rename=lambda k: k) -> dict[str, tuple[float, float]]:
    """timm's AdamW with layer decay 0.75 on `model`: each parameter's (timm name) -> (lr scale, weight decay)."""
    names = {id(p): rename(k) for k, p in model.named_parameters()}
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    return {names[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


@pytest.mark.parametrize("name", NAMES)
def test_layer_decay_groups_are_timms_parameter_by_parameter(name):
    model, ref = pair(name, depth=3, num_classes=5, **NARROW)
    assert ref.no_weight_decay() <= model.no_weight_decay()
    for coarse in (False, True):
        assert model.group_matcher(coarse=coarse) is not None
    ours = lr_groups(model, lambda k: timm_key(k, model.config))
    theirs = lr_groups(ref)
    assert ours.keys() == theirs.keys()
    assert {k: v for k, v in ours.items() if v != theirs[k]} == {}
    assert len({scale for scale, _ in theirs.values()}) == 5  # embeddings, 3 blocks, the head: decay applies


def test_bit_layer_decay_groups_are_timms_resnetv2_groups():
    """timm's optimizer factory on vitlab's BiT (timm's names for its tensors) gives every parameter the lr scale and
    weight decay it gives timm's ResNetV2: the root conv, one layer per unit (the final norm with the last), the
    head; and both groupings of the matcher, by unit and by stage (coarse), hold the same tensors as timm's."""
    model = vitlab.create_model("resnetv2_50x1_bit", num_classes=5)
    ref = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=5)
    ours, theirs = lr_groups(model, bit_timm_key), lr_groups(ref)
    assert ours.keys() == theirs.keys()
    assert {k: v for k, v in ours.items() if v != theirs[k]} == {}
    assert len({scale for scale, _ in theirs.values()}) == 1 + 16 + 1  # root, R50's 16 units, head
    for coarse in (False, True):
        groups = group_parameters(model, model.group_matcher(coarse=coarse))
        assert {k: sorted(map(bit_timm_key, v)) for k, v in groups.items()} == {
            k: sorted(v) for k, v in group_parameters(ref, ref.group_matcher(coarse=coarse)).items()}


@pytest.mark.parametrize("name", FC_NORM_NAMES)
def test_pruning_the_head_removes_fc_norm_as_timm_does(name):
    model, ref = pair(name, depth=3, **NARROW)
    assert model.prune_intermediate_layers(1, prune_norm=True, prune_head=True) == ref.prune_intermediate_layers(
        1, prune_norm=True, prune_head=True)
    assert sorted(timm_key(k, model.config) for k in model.state_dict()) == sorted(ref.state_dict())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())


# class token; registers + fc_norm; registers + class token + layer scale
PRUNE_NAMES = ["vit_tiny_patch16_224", "vit_little_patch16_reg4_gap_256", "vit_small_patch14_reg4_dinov2"]


@pytest.mark.parametrize("prune_norm", [False, True])
@pytest.mark.parametrize("name", PRUNE_NAMES)
def test_a_pruned_head_returns_timms_unpooled_tokens(name, prune_norm):
    """After prune_intermediate_layers(prune_head=True) timm's ViT no longer pools (global_pool ''): forward and
    forward_head (pre_logits or not) return the (N, T, D) tokens; a new head from reset_classifier(n) acts on each.
    vitlab's model with timm's weights returns the same tensors."""
    model, ref = pair(name, depth=3, **NARROW)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # off zero heads and unit norms
    model.load_state_dict(ref.state_dict())
    model.eval(), ref.eval()
    assert model.prune_intermediate_layers(1, prune_norm=prune_norm) == ref.prune_intermediate_layers(
        1, prune_norm=prune_norm)
    assert (model.global_pool, model.num_classes) == (ref.global_pool, ref.num_classes) == ("", 0)
    x = torch.randn(2, 3, *model.config.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(x)
        assert expected.ndim == 3
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        tokens = model.forward_features(x)
        for pre_logits in (False, True):
            assert torch.equal(model.forward_head(tokens, pre_logits=pre_logits), tokens)
        model.reset_classifier(3)
        ref.reset_classifier(3)
        ref.head.load_state_dict(model.head.state_dict())
        assert model.global_pool == ref.global_pool == ""
        assert model(x).shape == ref(x).shape == (*expected.shape[:2], 3)
        model.reset_classifier(3, "avg")  # pooling again
        assert model.global_pool == "avg" and model(x).shape == (2, 3)


# The pretrained_cfg keys timm's test_model_default_cfgs and its input-size helper read, with timm's values. The
# module names (first_conv, classifier) are vitlab's own and must name its modules.
DEFAULT_CFG_KEYS = ("pool_size", "input_size", "num_classes", "fixed_input_size", "min_input_size")


BIG_BITS = [n for n in vitlab.list_models("resnetv2_*") if n != "resnetv2_50x1_bit"]  # 0.2-0.9 B parameters


@pytest.mark.parametrize("name", [*NAMES, "resnetv2_50x1_bit", *(pytest.param(n, marks=pytest.mark.slow)
                                                                  for n in BIG_BITS)])
def test_default_cfg_keys_timms_test_reads_are_timms(name):
    kwargs = {} if name.startswith("resnetv2_") else {"depth": 1}
    ours, theirs = vitlab.create_model(name, **kwargs), timm.create_model(name, **kwargs)
    cfg, ref = ours.pretrained_cfg, theirs.pretrained_cfg
    for key in DEFAULT_CFG_KEYS:
        assert (key in cfg) == (key in ref), key
        value = tuple(cfg[key]) if isinstance(cfg.get(key), list) else cfg.get(key)
        expected = tuple(ref[key]) if isinstance(ref.get(key), list) else ref.get(key)
        assert value == expected, key
    modules = dict(ours.named_modules())
    assert cfg["first_conv"] in modules and cfg["classifier"] in modules

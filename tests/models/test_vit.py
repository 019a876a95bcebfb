"""The model family: parameter counts against the official models_test.py, forward paths, position embeddings,
configs."""

import math

import numpy as np
import pytest
import torch

import vitlab
from vitlab.models import ViTConfig, config_from_dict, model_config

# Official models_test.py counts, 1000 classes, 224×224.
PAPER_PARAMS = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-S/32": 22_878_952,
    "ViT-B/8": 86_576_872,
    "ViT-B/16": 86_567_656,
    "ViT-B/32": 88_224_232,
    "ViT-L/16": 304_326_632,
    "ViT-L/32": 306_535_400,
    "ViT-H/14": 632_045_800,
    "ViT-B/16-gap": 86_566_120,
    "R+ViT-Ti/16": 6_337_704,
    "R26+ViT-S/32": 36_431_912,
    "R26+ViT-B/32": 101_383_976,
    "R50+ViT-B/16": 98_659_112,
    "R50+ViT-L/32": 328_994_856,
}


def tiny(**kw) -> ViTConfig:
    base = dict(image_size=32, patch_size=8, width=48, depth=3, mlp_dim=96, num_heads=4, num_classes=7)
    return ViTConfig(**{**base, **kw})


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere (zero heads and zero class tokens would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", list(PAPER_PARAMS))
def test_parameter_counts_equal_paper_table(name):
    with torch.device("meta"):  # counts only: no memory, no init
        model = vitlab.create_model(name, num_classes=1000, image_size=224)
    assert sum(p.numel() for p in model.parameters()) == PAPER_PARAMS[name]


def test_list_models_covers_table_and_baselines():
    names = vitlab.list_models()
    assert set(PAPER_PARAMS) <= set(names)
    assert {"BiT-R50x1", "BiT-R101x1", "BiT-R152x2"} <= set(names)
    for name in names:
        model_config(name)  # every listed name decodes


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown model 'ViT-X/16'.*vitlab.list_models\(\)"):
        vitlab.create_model("ViT-X/16")


@pytest.mark.parametrize(
    "kw",
    [{}, {"classifier": "gap"}, {"pos_embed": "2d"}, {"pos_embed": "relative"}, {"pos_embed": "none"},
     {"representation_size": 24}, {"gelu": "tanh"}, {"classifier": "gap", "pos_embed": "relative"}],
)
def test_forward_equals_features_then_head(kw):
    # forward() computes only the class token in the last block; it must agree with the full path.
    model = randomize(vitlab.models.build_model(tiny(**kw)))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        full = model.forward_head(model.forward_features(x))
        assert rel_err(model(x), full) < 1e-6


@pytest.mark.parametrize("kw", [{}, {"pos_embed": "relative"}, {"classifier": "gap", "pos_embed": "2d"}])
def test_explicit_attention_path_equals_fused(kw):
    model = randomize(vitlab.models.build_model(tiny(**kw)))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        explicit = model.forward_inspect(x, attention=True)
        fused = model.forward_inspect(x, attention=False)
    assert "attention" not in fused
    for a, b in zip(explicit["tokens"], fused["tokens"], strict=True):
        assert rel_err(a, b) < 1e-5
    t = 1 + 16 if model.config.classifier == "token" else 16
    for w in explicit["attention"]:
        assert w.shape == (2, 4, t, t)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, t))


def test_relative_logits_match_hand_computed_offsets():
    model = randomize(vitlab.models.build_model(tiny(pos_embed="relative", image_size=16)))
    rel = model.blocks[0].attn.rel
    q = torch.randn(1, 4, 5, 12)  # T = 1 + 2*2 = 5 tokens
    bias = rel(q, 5, 0)
    for i in range(5):
        for j in range(5):
            expect = (q[0, :, i] * rel.embed[:, i - j + 4]).sum(-1)  # offset i - j
            torch.testing.assert_close(bias[0, :, i, j], expect)


def test_2d_position_embedding_concatenates_x_and_y():
    model = randomize(vitlab.models.build_model(tiny(pos_embed="2d")))
    pos = model.position_embedding((4, 4))[0, 1:].reshape(4, 4, 48)
    for r in range(4):
        for c in range(4):
            torch.testing.assert_close(pos[r, c, :24], model.pos_embed_x[0, c])
            torch.testing.assert_close(pos[r, c, 24:], model.pos_embed_y[0, r])


def bilinear_corner_aligned(grid: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """Hand-written reference: output pixel i samples input position i*(h-1)/(new_h-1), corners aligned."""
    h, w, d = grid.shape
    out = np.zeros((new_h, new_w, d))
    for i in range(new_h):
        y = i * (h - 1) / (new_h - 1)
        y0 = min(int(math.floor(y)), h - 2)
        fy = y - y0
        for j in range(new_w):
            x = j * (w - 1) / (new_w - 1)
            x0 = min(int(math.floor(x)), w - 2)
            fx = x - x0
            out[i, j] = ((1 - fy) * (1 - fx) * grid[y0, x0] + (1 - fy) * fx * grid[y0, x0 + 1]
                         + fy * (1 - fx) * grid[y0 + 1, x0] + fy * fx * grid[y0 + 1, x0 + 1])
    return out


def test_resolution_change_224_to_384_matches_official_interpolation(tmp_path):
    # Native 224 (14×14 grid) loaded at 384 (24×24): the official code zooms the grid with
    # scipy.ndimage.zoom(order=1); both it and a hand-written corner-aligned bilinear must agree with ours.
    import scipy.ndimage

    cfg = tiny(image_size=224, patch_size=16, depth=1)
    model = randomize(vitlab.models.build_model(cfg))
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    big = vitlab.load(path, image_size=384)
    assert big.config.image_size == (384, 384) and big.pos_embed.shape == (1, 1 + 24 * 24, 48)
    old = model.pos_embed[0].detach().double().numpy()
    new = big.pos_embed[0].detach().double().numpy()
    np.testing.assert_array_equal(new[0], old[0])  # class-token entry kept
    grid = old[1:].reshape(14, 14, 48)
    hand = bilinear_corner_aligned(grid, 24, 24).reshape(-1, 48)
    official = scipy.ndimage.zoom(grid, (24 / 14, 24 / 14, 1), order=1).reshape(-1, 48)
    assert np.linalg.norm(new[1:] - hand) / np.linalg.norm(hand) < 1e-5
    assert np.linalg.norm(new[1:] - official) / np.linalg.norm(official) < 1e-5


def test_another_input_size_is_refused_unless_dynamic_as_in_timm():
    model = randomize(vitlab.models.build_model(tiny()))
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^model input is 24×56 pixels but this model takes 32×32; .*"
                                             r"dynamic_img_size = True.* any multiple of 8"):
            model(torch.randn(1, 3, 24, 56))
        native = model(torch.randn(1, 3, 32, 32))
        assert native.shape == (1, 7)
        model.dynamic_img_size = True
        assert model(torch.randn(1, 3, 24, 56)).shape == (1, 7)  # non-square, 3×7 grid
        with pytest.raises(ValueError, match=r"input size \(30, 32\) is not divisible by the effective patch size 8"):
            model(torch.randn(1, 3, 30, 32))


def test_dynamic_img_size_is_a_create_model_keyword_for_vits_only():
    model = vitlab.create_model("ViT-Ti/16", depth=1, num_classes=3, dynamic_img_size=True)
    assert model.dynamic_img_size is True
    assert vitlab.create_model("ViT-Ti/16", depth=1).dynamic_img_size is False
    with pytest.raises(ValueError, match="dynamic_img_size applies to Vision Transformers"):
        vitlab.create_model("BiT-R50x1", dynamic_img_size=True)


def test_resampled_position_embedding_is_cached_and_invalidated_on_update():
    model = randomize(vitlab.models.build_model(tiny()))
    with torch.no_grad():
        a = model.position_embedding((6, 6))
        assert model.position_embedding((6, 6)) is a  # cached at inference
        model.pos_embed.add_(1.0)  # an optimizer step or load_state_dict bumps the version
        b = model.position_embedding((6, 6))
    assert b is not a
    torch.testing.assert_close(b, a + 1.0)
    assert model.position_embedding((6, 6)).requires_grad  # training: never a stale cached tensor


def test_reset_classifier_drops_representation_and_zero_inits():
    model = randomize(vitlab.models.build_model(tiny(representation_size=24)))
    model.reset_classifier(3)
    assert model.pre_logits is None and model.config.representation_size is None
    assert model(torch.randn(1, 3, 32, 32)).abs().max() == 0


def test_gelu_kind_and_layernorm_eps_follow_config():
    model = vitlab.models.build_model(tiny(gelu="tanh", ln_eps=1e-12))
    assert model.blocks[0].mlp.act.approximate == "tanh"
    assert model.norm.eps == 1e-12 and model.blocks[0].norm1.eps == 1e-12


def test_config_dict_round_trip_and_unknown_fields():
    for name in ["ViT-B/16", "R50+ViT-B/16", "BiT-R50x1", "ViT-S/16-gap"]:
        cfg = model_config(name)
        assert config_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown config fields"):
        config_from_dict({**tiny().to_dict(), "new_field": 1})


def test_image_size_must_be_divisible_by_effective_patch():
    with pytest.raises(ValueError, match="not divisible by the effective patch size 32"):
        model_config("R50+ViT-L/32", image_size=200)


@pytest.mark.parametrize("name,changes,message", [
    ("ViT-Ti/16", {"image_size": 0}, "image_size must be positive, got 0x0"),
    ("ViT-Ti/16", {"num_classes": -5}, r"num_classes must be an integer >= 0 \(0: no classifier\), got -5"),
    ("ViT-Ti/16", {"depth": 0}, "depth must be a positive integer, got 0"),
    ("ViT-Ti/16", {"num_heads": 0}, "num_heads must be a positive integer, got 0"),
    ("ViT-Ti/16", {"mlp_dim": -1}, "mlp_dim must be a positive integer, got -1"),
    ("ViT-Ti/16", {"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
    ("ViT-Ti/16", {"std": (0.5, 0.0, 0.5)}, "std positive"),
    ("ViT-Ti/16", {"ln_eps": float("nan")}, "ln_eps must be a positive number"),
    ("ViT-Ti/16", {"representation_size": 0}, "representation_size must be a positive integer"),
    ("BiT-R50x1", {"image_size": -3}, "image_size must be positive"),
    ("BiT-R50x1", {"width_factor": 0}, "width_factor must be a positive integer"),
    ("BiT-R50x1", {"ws_eps": 0.0}, "gn_eps and ws_eps must be positive"),
])
def test_configs_outside_their_range_are_refused(name, changes, message):
    """Every architecture field is checked where the config is made, with the allowed range in the message:
    `create_model(image_size=0)` used to build a model."""
    with pytest.raises(ValueError, match=message):
        model_config(name, **changes)

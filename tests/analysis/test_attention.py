"""vitlab.analysis: the math on hand-made attention against independent hand computations, the explicit
attention path against the fused one, and the model-level functions on ViTs, GAP models, hybrids and
non-square inputs."""

import math

import pytest
import torch

import vitlab
from vitlab.analysis import (
    attention_distance_from_attention,
    attention_maps,
    attention_rollout,
    class_token_attention,
    embedding_filters,
    mean_attention_distance,
    position_embedding_similarity,
    principal_filters,
    rollout_from_attention,
    row_column_summary,
)
from vitlab.analysis.attention import discard_lowest
from vitlab.models import VisionTransformer, ViTConfig


def tiny(**kw) -> VisionTransformer:
    base = dict(image_size=32, patch_size=8, width=32, depth=2, mlp_dim=64, num_heads=2, num_classes=5)
    model = VisionTransformer(ViTConfig(**{**base, **kw}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random everywhere: zero class token and head would hide mistakes
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def random_attention(n: int, h: int, t: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, h, t, t, generator=g).mul(2).softmax(dim=-1)  # (N, H, T, T)


# --- mean attention distance on hand-made attention ---------------------------------------------------------
def brute_force_mean_distance(grid, patch_px, weights_for_query):
    """Plain loops: mean over queries of sum_k w(q, k) * patch_px * |pos(q) - pos(k)|."""
    gh, gw = grid
    cells = [(r, c) for r in range(gh) for c in range(gw)]
    total = 0.0
    for q in cells:
        w = weights_for_query(q, cells)
        total += sum(wk * patch_px * math.hypot(q[0] - k[0], q[1] - k[1]) for wk, k in zip(w, cells, strict=True))
    return total / len(cells)


def test_identity_attention_has_zero_distance():
    t = 1 + 3 * 4
    attn = torch.eye(t).expand(2, 3, t, t)
    assert attention_distance_from_attention(attn, (3, 4), 16, 1).abs().max() == 0


@pytest.mark.parametrize("grid,prefix", [((3, 5), 1), ((4, 4), 0), ((2, 7), 1)])
def test_uniform_attention_gives_mean_pairwise_distance(grid, prefix):
    g = grid[0] * grid[1]
    attn = torch.full((2, 3, prefix + g, prefix + g), 1.0 / (prefix + g))  # class token gets its share too
    expected = brute_force_mean_distance(grid, 8, lambda q, cells: [1.0 / len(cells)] * len(cells))
    got = attention_distance_from_attention(attn, grid, 8, prefix)
    assert torch.allclose(got, torch.full((3,), expected), rtol=1e-6), (got, expected)


def test_distance_of_attention_to_one_corner():
    # every query puts weight 0.5 on the class token and 0.5 on patch (0, 0): after dropping the class
    # token, each query looks at the corner only
    grid, g = (3, 4), 12
    attn = torch.zeros(1, 1, 1 + g, 1 + g)
    attn[..., 0], attn[..., 1] = 0.5, 0.5
    expected = brute_force_mean_distance(grid, 4, lambda q, cells: [1.0 if k == (0, 0) else 0.0 for k in cells])
    assert attention_distance_from_attention(attn, grid, 4, 1).item() == pytest.approx(expected, rel=1e-6)


# --- rollout on hand-made attention -----------------------------------------------------------------------------
def test_rollout_of_identity_layers_is_identity():
    t = 1 + 9
    eye = torch.eye(t).expand(2, 4, t, t)
    rolled = rollout_from_attention([eye, eye, eye])
    assert torch.equal(rolled, torch.eye(t).expand(2, t, t))  # class row: all on itself, nothing on patches


def test_rollout_passes_one_layer_class_attention_through_identity_layers():
    t = 1 + 3 * 3
    attn = random_attention(2, 3, t)
    eye = torch.eye(t).expand(2, 3, t, t)
    rolled = rollout_from_attention([eye, attn, eye])
    # (A + I) renormalised = (A + I) / 2 since A's rows sum to 1: the class token's input attention, halved
    expected = 0.5 * attn.mean(dim=1)[:, 0, 1:]
    assert torch.allclose(rolled[:, 0, 1:], expected, atol=1e-7)


def test_rollout_of_two_layers_is_the_product():
    t = 5
    a1, a2 = random_attention(1, 2, t, 1), random_attention(1, 2, t, 2)
    eye = torch.eye(t)
    r1, r2 = (a1.mean(1) + eye) / 2, (a2.mean(1) + eye) / 2
    assert torch.allclose(rollout_from_attention([a1, a2]), r2 @ r1, atol=1e-7)
    assert torch.allclose(rollout_from_attention([a1, a2]).sum(-1), torch.ones(1, t))


@pytest.mark.parametrize("fusion,reduce", [("max", torch.amax), ("min", torch.amin)])
def test_head_fusion(fusion, reduce):
    a = random_attention(1, 3, 4)
    fused = reduce(a, dim=1) + torch.eye(4)
    expected = fused / fused.sum(-1, keepdim=True)
    assert torch.allclose(rollout_from_attention([a], head_fusion=fusion), expected, atol=1e-7)
    with pytest.raises(ValueError, match="head_fusion"):
        rollout_from_attention([a], head_fusion="median")


def test_discard_ratio_keeps_class_token_column():
    t = 1 + 16
    fused = random_attention(2, 1, t)[:, 0]  # (N, T, T)
    out = discard_lowest(fused, 0.5, num_prefix=1)
    assert torch.equal(out[:, :, 0], fused[:, :, 0])
    assert int((out[:, :, 1:] == 0).sum()) == 2 * int(t * (t - 1) * 0.5)
    kept = out[:, :, 1:][out[:, :, 1:] > 0]
    assert kept.min() >= fused[:, :, 1:].flatten(1).median(dim=1).values.min()
    rolled = rollout_from_attention([fused[:, None]], discard_ratio=0.5)
    assert torch.allclose(rolled.sum(-1), torch.ones(2, t))


# --- embeddings ---------------------------------------------------------------------------------------------------
def row_col_pattern_expected(gh, gw):
    def tile(r, c):
        return [[((r == r2) + (c == c2)) / 2 for c2 in range(gw)] for r2 in range(gh)]

    return torch.tensor([[tile(r, c) for c in range(gw)] for r in range(gh)])


@pytest.mark.parametrize("kind", ["learned", "2d"])
def test_position_similarity_of_a_known_pattern(kind):
    # patch (r, c) gets one-hot(r) in one half and one-hot(c) in the other: cos = ([r = r'] + [c = c']) / 2
    model = tiny(image_size=(24, 32), pos_embed=kind)  # grid 3×4
    gh, gw, half = 3, 4, 16
    with torch.no_grad():
        if kind == "learned":
            model.pos_embed.zero_()
            for r in range(gh):
                for c in range(gw):
                    model.pos_embed[0, 1 + r * gw + c, r] = 1.0
                    model.pos_embed[0, 1 + r * gw + c, half + c] = 1.0
        else:  # X table is the first half, Y table the second
            model.pos_embed_x.copy_(torch.eye(half)[:gw][None])
            model.pos_embed_y.copy_(torch.eye(half)[:gh][None])
    sim = position_embedding_similarity(model)
    assert sim.shape == (3, 4, 3, 4)
    assert torch.allclose(sim, row_col_pattern_expected(gh, gw), atol=1e-6)
    assert row_column_summary(sim) == pytest.approx({"same_row": 0.5, "same_column": 0.5, "other": 0.0}, abs=1e-6)


def test_position_similarity_needs_absolute_embeddings():
    with pytest.raises(ValueError, match="relative"):
        position_embedding_similarity(tiny(pos_embed="relative"))


def test_principal_filters_recover_planted_components():
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(48, 48, generator=g))[0]  # orthonormal columns
    u1, u2 = basis[:, 0], basis[:, 1]
    a, b = torch.randn(200, 1, generator=g) * 3.0, torch.randn(200, 1, generator=g)
    a, b = a - a.mean(), b - b.mean()
    b = b - (a * b).sum() / (a * a).sum() * a  # uncorrelated in the sample: the PCs are exactly u1, u2
    weight = (basis[:, 5] + a * u1 + b * u2).reshape(200, 3, 4, 4)  # 200 filters, 3×4×4, mean + 2 directions
    filt = principal_filters(weight, k=28)
    assert filt.components.shape == (28, 3, 4, 4)
    comps = filt.components.reshape(28, -1).double()
    assert abs(float(comps[0] @ u1.double())) == pytest.approx(1.0, abs=1e-6)
    assert abs(float(comps[1] @ u2.double())) == pytest.approx(1.0, abs=1e-6)
    va, vb = float(a.square().sum()), float(b.square().sum())
    assert float(filt.explained_variance_ratio[0]) == pytest.approx(va / (va + vb), rel=1e-5)
    assert float(filt.explained_variance_ratio.sum()) == pytest.approx(1.0, abs=1e-5)


def test_embedding_filters_shapes_and_hybrid_refusal():
    filt = embedding_filters(tiny(patch_size=4, in_chans=3), k=28)
    assert filt.components.shape == (28, 3, 4, 4)
    assert embedding_filters(tiny(patch_size=4, in_chans=1)).components.shape == (16, 1, 4, 4)  # rank 16
    hybrid = vitlab.create_model("R+ViT-Ti/16", image_size=32, num_classes=10, depth=1)
    with pytest.raises(ValueError, match="not applicable to hybrid") as err:
        embedding_filters(hybrid)
    assert "\n" not in str(err.value)


# --- explicit attention path vs fused path -----------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"pos_embed": "relative"}, {"classifier": "gap"}, {"image_size": (48, 80)}])
def test_explicit_attention_matches_fused_path(kw):
    model = tiny(patch_size=8, **kw)
    x = torch.randn(2, 3, *model.config.image_size)
    with torch.no_grad():
        explicit = model.forward_inspect(x, attention=True)
        fused = model.forward_inspect(x, attention=False)
        for a, b in zip(explicit["tokens"], fused["tokens"], strict=True):
            assert (a - b).abs().max() <= 1e-5
        inputs = [explicit["embeddings"], *explicit["tokens"][:-1]]
        for block, z, w in zip(model.blocks, inputs, explicit["attention"], strict=True):
            assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-6)
            att = block.attn
            n, t, d = z.shape
            v = att.qkv(block.norm1(z)).reshape(n, t, 3, att.num_heads, att.head_dim)[:, :, 2].transpose(1, 2)
            by_hand = att.proj((w @ v).transpose(1, 2).reshape(n, t, d))  # attention @ V, heads merged
            fused_out = att(block.norm1(z))
            assert (by_hand - fused_out).abs().max() <= 1e-5


# --- model-level functions: any ViT, hybrid, any input size ------------------------------------------------------
def check_model_functions(model, x, grid):
    cfg = model.config
    layers, n, heads, t = cfg.depth, x.shape[0], cfg.num_heads, cfg.num_prefix_tokens + grid[0] * grid[1]
    attn = attention_maps(model, x)
    assert attn.shape == (layers, n, heads, t, t)
    dist = mean_attention_distance(model, x)
    assert dist.shape == (layers, heads)
    by_layer = [attention_distance_from_attention(a, grid, cfg.total_stride, cfg.num_prefix_tokens) for a in attn]
    assert torch.allclose(dist, torch.stack(by_layer))
    farthest = cfg.total_stride * math.hypot(grid[0] - 1, grid[1] - 1)
    assert 0 < float(dist.min()) and float(dist.max()) < farthest
    rollout = attention_rollout(model, x)
    assert rollout.shape == (n, *grid) and bool((rollout >= 0).all())
    assert class_token_attention(model, x).shape == (n, heads, *grid)


@pytest.mark.parametrize(
    "kw,size,grid",
    [
        ({}, (32, 32), (4, 4)),
        ({"image_size": (48, 80), "patch_size": 4}, (48, 80), (12, 20)),  # native non-square
        ({"patch_size": 16}, (48, 80), (3, 5)),  # square model, non-square input: resampled embeddings
        ({"classifier": "gap"}, (40, 24), (5, 3)),
    ],
)
def test_model_level_functions(kw, size, grid):
    model = tiny(**kw)
    model.dynamic_img_size = True  # the analysis at another size than the native one, as `analyze --image-size`
    x = torch.randn(2, 3, *size)
    check_model_functions(model, x, grid)
    assert position_embedding_similarity(model, grid).shape == (*grid, *grid)


@pytest.mark.parametrize("size,grid", [((64, 64), (2, 2)), ((64, 96), (2, 3))])
def test_hybrid(size, grid):
    model = vitlab.create_model("R+ViT-Ti/16", image_size=64, num_classes=10, depth=2, dynamic_img_size=True).eval()
    assert model.config.total_stride == 32  # stem stride 4 × patch 8: distances are in input pixels
    check_model_functions(model, torch.randn(1, 3, *size), grid)


def test_model_training_flag_is_restored():
    model = tiny().train()
    attention_maps(model, torch.randn(1, 3, 32, 32))
    assert model.training

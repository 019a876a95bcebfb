"""Official .npz reader/writer: parity through timm's independent npz loader, bit-exact round trips, architecture
inference and one clear error per kind of bad file. Small random models; every file is made in tmp_path."""

from __future__ import annotations

import dataclasses
import math
import zipfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vitlab.errors import WeightsError
from vitlab.models import ResNetConfig, VisionTransformer, ViTConfig, model_config
from vitlab.models.resnet import StdConv2dSame
from vitlab.weights.jax_npz import read_jax_npz, write_jax_npz

torch.set_num_threads(1)
POSEMBED = "Transformer/posembed_input/pos_embedding"


def tiny(**kw) -> ViTConfig:
    base = dict(image_size=32, patch_size=8, width=48, depth=2, mlp_dim=96, num_heads=4, num_classes=7, gelu="tanh")
    return ViTConfig(**{**base, **kw})


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere, at scales that keep activations O(1) (a zero head or a zero last GroupNorm
    would hide layout mistakes). Weight-standardised convs get std 1000: see test_hybrid_matches_timm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                r = torch.randn(p.shape, generator=g)
                if isinstance(module, StdConv2dSame):
                    p.copy_(r * 1000)
                elif isinstance(module, (nn.Linear, nn.Conv2d)) and name == "weight":
                    p.copy_(r / math.sqrt(p[0].numel()))  # fan-in scaling
                elif isinstance(module, (nn.LayerNorm, nn.GroupNorm)) and name == "weight":
                    p.copy_(1 + 0.2 * r)
                else:  # biases, class token, position embedding
                    p.copy_(0.2 * r)
    return model.eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def stem_shapes(layers: tuple[int, ...], gn_4d: bool) -> tuple[dict[str, tuple[int, ...]], int]:
    """BiT stem tensors (root, then bottleneck units, a projection on each stage's first unit), output width."""
    shapes: dict[str, tuple[int, ...]] = {"conv_root/kernel": (7, 7, 3, 64)}

    def gn(name: str, c: int) -> None:
        shapes.update({f"{name}/{leaf}": (1, 1, 1, c) if gn_4d else (c,) for leaf in ("scale", "bias")})

    gn("gn_root", 64)
    cin = 64
    for s, units in enumerate(layers, 1):
        mid = 64 * 2 ** (s - 1)
        for u in range(1, units + 1):
            p = f"block{s}/unit{u}/"
            for r, (k, ci, co) in enumerate([(1, cin, mid), (3, mid, mid), (1, mid, 4 * mid)], 1):
                shapes[f"{p}conv{r}/kernel"] = (k, k, ci, co)
                gn(f"{p}gn{r}", co)
            if u == 1:
                shapes[f"{p}conv_proj/kernel"] = (1, 1, cin, 4 * mid)
                gn(f"{p}gn_proj", 4 * mid)
            cin = 4 * mid
    return shapes, cin


def official_arrays(*, depth=2, width=48, heads=4, mlp=96, patch=8, grid=4, numbering="pre-linen", cls=True,
                    rep=None, classes=7, layers=None, gn_4d=False, seed=0) -> dict[str, np.ndarray]:
    """A checkpoint in the official layout, written from the documented key layout alone (not from the code
    under test)."""
    shapes, embed_in = stem_shapes(layers, gn_4d) if layers is not None else ({}, 3)
    shapes |= {"embedding/kernel": (patch, patch, embed_in, width), "embedding/bias": (width,),
               POSEMBED: (1, grid * grid + int(cls), width), "Transformer/encoder_norm/scale": (width,),
               "Transformer/encoder_norm/bias": (width,)}
    if cls:
        shapes["cls"] = (1, 1, width)
    ln0, mha, ln1, mlpb = {"pre-linen": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
                           "linen": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
                           }[numbering]
    hd = width // heads
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        shapes |= {f"{b}{ln}/{leaf}": (width,) for ln in (ln0, ln1) for leaf in ("scale", "bias")}
        for q in ("query", "key", "value"):
            shapes |= {f"{b}{mha}/{q}/kernel": (width, heads, hd), f"{b}{mha}/{q}/bias": (heads, hd)}
        shapes |= {f"{b}{mha}/out/kernel": (heads, hd, width), f"{b}{mha}/out/bias": (width,)}
        for d, (fan_in, fan_out) in enumerate([(width, mlp), (mlp, width)]):
            shapes |= {f"{b}{mlpb}/Dense_{d}/kernel": (fan_in, fan_out), f"{b}{mlpb}/Dense_{d}/bias": (fan_out,)}
    if rep:
        shapes |= {"pre_logits/kernel": (width, rep), "pre_logits/bias": (rep,)}
    if classes:
        shapes |= {"head/kernel": (rep or width, classes), "head/bias": (classes,)}
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)
    return path


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


# --- parity with timm's independent reader of official files -------------------------------------------------
def timm_vit(cfg: ViTConfig, **kw) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    return TimmViT(img_size=cfg.image_size, patch_size=cfg.patch_size, embed_dim=cfg.width, depth=cfg.depth,
                   num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.width,
                   act_layer=partial(nn.GELU, approximate="tanh"), **kw).eval()


def timm_load(model: nn.Module, path: Path) -> nn.Module:
    from timm.models.vision_transformer import _load_weights

    with torch.no_grad():
        _load_weights(model, str(path))
    return model


def test_token_model_with_pre_logits_matches_timm(tmp_path: Path) -> None:
    """Ti-width ViT with class token, representation layer and head. timm no longer has a representation layer,
    so timm gives the tokens and the head is applied from the file's arrays with numpy: also independent."""
    cfg = tiny(width=192, num_heads=3, mlp_dim=768, depth=3, representation_size=64, num_classes=10)
    model = randomize(VisionTransformer(cfg))
    write_jax_npz(model, tmp_path / "vit.npz")
    ref = timm_load(timm_vit(cfg, num_classes=0), tmp_path / "vit.npz")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        pooled = ref.forward_head(ref.forward_features(x), pre_logits=True).numpy()  # class token after LN
        ours = model(x)
    w = load_arrays(tmp_path / "vit.npz")
    rep = np.tanh(pooled @ w["pre_logits/kernel"] + w["pre_logits/bias"])
    expected = torch.from_numpy(rep @ w["head/kernel"] + w["head/bias"])
    assert rel_err(ours, expected) <= 1e-5


def test_gap_model_matches_timm(tmp_path: Path) -> None:
    cfg = tiny(classifier="gap", num_classes=10)
    model = randomize(VisionTransformer(cfg))
    write_jax_npz(model, tmp_path / "gap.npz")
    # Official GAP: encoder_norm, then the mean over all tokens; timm's fc_norm=False keeps that order.
    ref = timm_load(timm_vit(cfg, class_token=False, global_pool="avg", fc_norm=False, num_classes=10),
                    tmp_path / "gap.npz")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_err(model(x), ref(x)) <= 1e-5


@pytest.mark.parametrize("layers, patch, size", [((), 8, 64), ((2, 1), 1, 32)], ids=["root-only", "two-stages"])
def test_hybrid_matches_timm(tmp_path: Path, layers: tuple[int, ...], patch: int, size: int) -> None:
    """R+ViT-Ti-style (root only, 8×8 patches) and a two-stage R26/R50-style stem with 1×1 patches.

    timm's hybrids differ from the official numerics in two epsilons: GroupNorm eps 1e-5 (official 1e-6), set
    to 1e-6 below; and weight standardisation (w - mean) / sqrt(var + 1e-8) instead of the official
    (w - mean) / (std + 1e-5). Standardisation is scale-invariant, so `randomize` gives conv weights std 1000:
    the epsilons then shift results by ~1e-8 relative and the test measures the layouts, not the epsilons."""
    from timm.models.vision_transformer_hybrid import HybridEmbed, _resnetv2

    cfg = tiny(width=64, mlp_dim=128, num_classes=10, patch_size=patch, image_size=size,
               resnet=ResNetConfig(layers=layers))
    model = randomize(VisionTransformer(cfg))
    write_jax_npz(model, tmp_path / "hybrid.npz")
    embed = partial(HybridEmbed, backbone=_resnetv2(layers=layers))
    ref = timm_vit(cfg, num_classes=10, embed_layer=embed)
    for m in ref.modules():
        if isinstance(m, nn.GroupNorm):
            m.eps = 1e-6
    timm_load(ref, tmp_path / "hybrid.npz")
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert rel_err(model(x), ref(x)) <= 1e-5


# --- round trips ---------------------------------------------------------------------------------------------
FILES = {  # name: (official_arrays kwargs, the config they describe)
    "token-rep-prelinen": (dict(rep=24, classes=5), tiny(representation_size=24, num_classes=5)),
    "gap-linen": (dict(numbering="linen", cls=False, classes=0), tiny(classifier="gap", num_classes=0)),
    "hybrid-gn4d-prelinen": (dict(layers=(2, 1), patch=1, gn_4d=True),
                             tiny(patch_size=1, resnet=ResNetConfig(layers=(2, 1)))),
    "root-only-linen": (dict(layers=(), numbering="linen", grid=2, width=24, heads=2),
                        tiny(image_size=64, width=24, num_heads=2, resnet=ResNetConfig(layers=()))),
}


@pytest.mark.parametrize("name", list(FILES))
def test_official_file_read_write_is_bit_exact(tmp_path: Path, name: str) -> None:
    """npz -> read -> write with the file's numbering and GN layout: the same tensors, bit for bit."""
    spec, expected_config = FILES[name]
    original = official_arrays(**spec)
    ck = read_jax_npz(save(tmp_path / "in.npz", original))
    assert ck.config == expected_config and ck.source == "jax-npz"
    assert ck.meta["jax_numbering"] == spec.get("numbering", "pre-linen")
    assert ck.meta["gn_4d"] == spec.get("gn_4d", False)
    model = VisionTransformer(ck.config)
    assert ck.state_dict.keys() == model.state_dict().keys()
    model.load_state_dict(ck.state_dict)
    write_jax_npz(model, tmp_path / "out.npz", numbering=ck.meta["jax_numbering"], gn_4d=ck.meta["gn_4d"])
    written = load_arrays(tmp_path / "out.npz")
    assert written.keys() == original.keys()
    for k, v in original.items():
        assert written[k].dtype == v.dtype and written[k].shape == v.shape, k
        assert np.array_equal(written[k], v), k


ROUND_TRIP = {
    "token-rep": tiny(representation_size=24),
    "gap-no-head": tiny(classifier="gap", num_classes=0),
    "no-posembed": tiny(pos_embed="none", image_size=224),
    "one-channel": tiny(in_chans=1),
    "non-square-grid": tiny(image_size=(32, 64)),
    "hybrid": tiny(patch_size=1, resnet=ResNetConfig(layers=(1, 2))),
    "registry-hybrid": model_config("R+ViT-Ti/16", image_size=64, num_classes=5, gelu="tanh", depth=2).replace(name=""),
}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
@pytest.mark.parametrize("numbering, gn_4d", [("pre-linen", False), ("linen", True)])
def test_model_npz_model_is_exact(tmp_path: Path, name: str, numbering: str, gn_4d: bool) -> None:
    cfg = ROUND_TRIP[name]
    model = randomize(VisionTransformer(cfg))
    write_jax_npz(model, tmp_path / "m.npz", numbering=numbering, gn_4d=gn_4d)
    ck = read_jax_npz(tmp_path / "m.npz", image_size=cfg.image_size if name == "non-square-grid" else None)
    assert ck.config == cfg  # every field; the registry name is recomputed from the architecture
    assert ck.meta["jax_numbering"] == numbering and ck.meta["gn_4d"] == (gn_4d and cfg.resnet is not None)
    original = model.state_dict()
    assert ck.state_dict.keys() == original.keys()
    for k, v in original.items():
        assert ck.state_dict[k].dtype == v.dtype and torch.equal(ck.state_dict[k], v), k


def test_registry_names_are_recognised(tmp_path: Path) -> None:
    cfg = model_config("R+ViT-Ti/16", image_size=64, num_classes=5, gelu="tanh")
    write_jax_npz(VisionTransformer(cfg), tmp_path / "r.npz")
    assert read_jax_npz(tmp_path / "r.npz").config.name == "R+ViT-Ti/16"
    assert read_jax_npz(save(tmp_path / "t.npz", official_arrays(depth=1))).config.name == ""


def test_fields_the_format_cannot_hold(tmp_path: Path) -> None:
    """The file holds tensors, and vitlab/ arrays for numerics other than the official ones (gelu, ln_eps: read
    back as written, tests/parity/test_npz_numerics.py). Read back as the official values: mean/std 0.5, no
    dropout; image_size is 224 (or the caller's) without a position embedding; qkv_bias is always True (the
    writer refuses False); name is recomputed from the architecture."""
    cfg = tiny(gelu="exact", ln_eps=1e-5, dropout=0.1, attn_dropout=0.1, mean=(0.485, 0.456, 0.406),
               std=(0.229, 0.224, 0.225), name="mine")
    with pytest.warns(UserWarning, match=r"gelu='exact' \(official: 'tanh'\) and ln_eps=1e-05 \(official: 1e-6\)"):
        write_jax_npz(VisionTransformer(cfg), tmp_path / "m.npz")
    official = dataclasses.replace(cfg, dropout=0.0, attn_dropout=0.0, mean=(0.5,) * 3, std=(0.5,) * 3, name="")
    assert read_jax_npz(tmp_path / "m.npz").config == official


def test_official_numerics_export_without_a_warning(tmp_path: Path) -> None:
    """Only what differs from the official code is warned about: ln_eps 1e-6 is the official value."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_jax_npz(VisionTransformer(tiny(gelu="tanh", ln_eps=1e-6)), tmp_path / "m.npz")
    with pytest.warns(UserWarning, match=r"^the model uses gelu='exact' \(official: 'tanh'\); "):
        write_jax_npz(VisionTransformer(tiny(gelu="exact", ln_eps=1e-6)), tmp_path / "e.npz")


def test_prefixed_trees_read_the_same(tmp_path: Path) -> None:
    arrays = official_arrays()
    plain = read_jax_npz(save(tmp_path / "plain.npz", arrays))
    opt = {f"opt/target/{k}": v for k, v in arrays.items()} | {"opt/state/step": np.zeros(1, np.float32)}
    for prefix, tree in [("opt/target/", opt), ("params/", {f"params/{k}": v for k, v in arrays.items()})]:
        ck = read_jax_npz(save(tmp_path / "p.npz", tree))
        assert ck.meta["prefix"] == prefix and ck.config == plain.config
        assert all(torch.equal(ck.state_dict[k], v) for k, v in plain.state_dict.items())


# --- bad files -----------------------------------------------------------------------------------------------
def _edited(tmp_path: Path, edit) -> Path:
    arrays = official_arrays()
    edit(arrays)
    return save(tmp_path / "bad.npz", arrays)


def _drop_block_0(a: dict[str, np.ndarray]) -> None:
    for k in [k for k in a if k.startswith("Transformer/encoderblock_0/")]:
        del a[k]


def _scan_blocks(a: dict[str, np.ndarray]) -> None:
    """big_vision's layout: one `Transformer/encoderblock/` tree with the layers stacked (shapes don't matter)."""
    for k in [k for k in a if k.startswith("Transformer/encoderblock_")]:
        a["Transformer/encoderblock/" + k.split("/", 2)[2]] = a.pop(k)


def _put(name: str, value: np.ndarray):
    return lambda a: a.update({name: value})


BAD_EDITS = {  # name: (edit of a valid file, what the message must say)
    "missing": (lambda a: a.pop("Transformer/encoderblock_1/LayerNorm_2/scale"),
                r"missing tensor Transformer/encoderblock_1/LayerNorm_2/scale"),
    "missing-block": (_drop_block_0,
                      r"missing tensor Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"),
    "shape": (_put("Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias", np.zeros(95, np.float32)),
              r"Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias has shape \(95,\), expected \(96,\)"),
    "extra": (_put("foo/bar", np.zeros(3, np.float32)), r"unknown tensors foo/bar"),
    "mixed-numbering": (_put("Transformer/encoderblock_1/MultiHeadDotProductAttention_0/query/kernel",
                             np.zeros((48, 4, 12), np.float32)), r"mix the pre-Linen"),
    "non-square": (_put(POSEMBED, np.zeros((1, 13, 48), np.float32)), r"not a square grid.*image_size"),
    "int-dtype": (_put("head/bias", np.zeros(7, np.int32)), r"head/bias has dtype int32"),
    "no-embedding": (lambda a: a.pop("embedding/kernel"), r"no embedding/kernel"),
    "scanned": (_scan_blocks, r"big_vision"),
}


@pytest.mark.parametrize("name", list(BAD_EDITS))
def test_bad_tensors_are_named(tmp_path: Path, name: str) -> None:
    edit, message = BAD_EDITS[name]
    path = _edited(tmp_path, edit)
    with pytest.raises(WeightsError, match=message) as info:
        read_jax_npz(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def _valid_bytes(tmp_path: Path) -> bytes:
    return save(tmp_path / "ok.npz", official_arrays()).read_bytes()


BAD_FILES = {
    "text": (lambda tp: b"hello, not weights", r"not an \.npz archive"),
    "empty": (lambda tp: b"", r"not an \.npz archive"),
    "truncated": (lambda tp: _valid_bytes(tp)[: len(_valid_bytes(tp)) // 2], r"truncated or corrupt"),
    "corrupt": (lambda tp: (lambda b: b[:5000] + bytes(x ^ 0xFF for x in b[5000:5100]) + b[5100:])(_valid_bytes(tp)),
                r"truncated or corrupt"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_unreadable_files(tmp_path: Path, name: str) -> None:
    content, message = BAD_FILES[name]
    path = tmp_path / "bad.npz"
    path.write_bytes(content(tmp_path))
    with pytest.raises(WeightsError, match=message):
        read_jax_npz(path)


def test_other_containers_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "one.npy", np.zeros(3, np.float32))
    with pytest.raises(WeightsError, match="single .npy array"):
        read_jax_npz(tmp_path / "one.npy")
    with zipfile.ZipFile(tmp_path / "z.npz", "w") as z:
        z.writestr("embedding/kernel.npy", b"not an array")
    with pytest.raises(WeightsError, match="member embedding/kernel is not a numpy array"):
        read_jax_npz(tmp_path / "z.npz")
    torch.save({"w": torch.zeros(2)}, tmp_path / "t.pt")  # a zip of pickles
    with pytest.raises(WeightsError, match="not a numpy array|no embedding/kernel"):
        read_jax_npz(tmp_path / "t.pt")


def test_image_size_must_match_the_grid(tmp_path: Path) -> None:
    path = save(tmp_path / "m.npz", official_arrays())  # 4×4 grid at 8 pixels per token
    assert read_jax_npz(path, image_size=32).config.image_size == (32, 32)
    assert read_jax_npz(path, image_size=(16, 64)).config.image_size == (16, 64)  # 2×8: same 16 positions
    with pytest.raises(WeightsError, match="holds 16 grid positions"):
        read_jax_npz(path, image_size=48)


# --- writer refusals and atomicity ---------------------------------------------------------------------------
@pytest.mark.parametrize("model, message", [
    (lambda: VisionTransformer(tiny(pos_embed="2d")), "2d position"),
    (lambda: VisionTransformer(tiny(pos_embed="relative")), "relative position"),
    (lambda: VisionTransformer(tiny(qkv_bias=False)), "qkv_bias"),
], ids=["2d", "relative", "no-qkv-bias"])  # a BiT goes to big_transfer's layout: tests/weights/test_bit_npz.py
def test_writer_refuses_what_the_format_cannot_hold(tmp_path: Path, model, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_jax_npz(model(), tmp_path / "x.npz")
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.npz"
    path.write_bytes(b"previous")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", fail)
    with pytest.raises(OSError, match="disk full"):
        write_jax_npz(VisionTransformer(tiny()), path)
    assert path.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["m.npz"]
    monkeypatch.undo()
    write_jax_npz(VisionTransformer(tiny()), path)
    assert read_jax_npz(path).config == tiny() and [p.name for p in tmp_path.iterdir()] == ["m.npz"]

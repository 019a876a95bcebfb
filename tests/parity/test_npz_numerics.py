"""An official .npz written from a model with other numerics than the official code's (a timm ViT: exact GELU;
a transformers ViT: LayerNorm eps 1e-12) records them, reads back with them, and stays readable by timm's
independent npz loader; a file with the official numerics keeps exactly the official layout."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import vitlab
from vitlab.errors import WeightsError
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.weights.jax_npz import read_jax_npz, write_jax_npz


def tiny(**kw) -> ViTConfig:
    base = dict(image_size=32, patch_size=8, width=48, depth=2, mlp_dim=96, num_heads=4, num_classes=7)
    return ViTConfig(**{**base, **kw})


def random_vit(cfg: ViTConfig, seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))  # a non-zero head and biases: outputs depend on every tensor
    return model


def npz_keys(path: Path) -> set[str]:
    with np.load(path) as f:
        return set(f.files)


@pytest.mark.parametrize("numerics", [dict(gelu="exact"), dict(ln_eps=1e-12), dict(gelu="exact", ln_eps=1e-5)],
                         ids=["timm-gelu", "hf-eps", "both"])
def test_numerics_round_trip_through_npz(tmp_path, numerics):
    model = random_vit(tiny(**numerics))
    with pytest.warns(UserWarning, match="official"):
        write_jax_npz(model, tmp_path / "m.npz")
    back = read_jax_npz(tmp_path / "m.npz").config
    assert (back.gelu, back.ln_eps) == (model.config.gelu, model.config.ln_eps)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    loaded = vitlab.load(tmp_path / "m.npz")
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))  # the same computation, not the official one


def test_exact_gelu_read_as_tanh_was_a_measurable_change(tmp_path):
    """What the record prevents: the same weights computed with tanh GELU move the logits."""
    model = random_vit(tiny(gelu="exact"))
    with pytest.warns(UserWarning):
        write_jax_npz(model, tmp_path / "m.npz")
    tanh = VisionTransformer(model.config.replace(gelu="tanh")).eval()
    tanh.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (tanh(x) - model(x)).norm() / model(x).norm() > 1e-5
        assert torch.equal(vitlab.load(tmp_path / "m.npz")(x), model(x))


def test_official_numerics_keep_the_official_layout(tmp_path):
    write_jax_npz(random_vit(tiny(gelu="tanh")), tmp_path / "m.npz")
    assert not any(k.startswith("vitlab/") for k in npz_keys(tmp_path / "m.npz"))


def test_timm_reads_a_file_with_the_record(tmp_path):
    """timm's own npz loader (an official-format reader vitlab does not control) ignores the vitlab/ arrays and
    computes what vitlab computes, given the same (exact) GELU."""
    pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    from timm.models.vision_transformer import _load_weights

    model = random_vit(tiny(gelu="exact", num_classes=7))
    with pytest.warns(UserWarning):
        write_jax_npz(model, tmp_path / "m.npz")
    assert {"vitlab/gelu"} <= npz_keys(tmp_path / "m.npz")
    cfg = model.config
    ref = TimmViT(img_size=32, patch_size=8, embed_dim=cfg.width, depth=cfg.depth, num_heads=cfg.num_heads,
                  mlp_ratio=cfg.mlp_dim / cfg.width, num_classes=7, act_layer=partial(nn.GELU)).eval()
    with torch.no_grad():
        _load_weights(ref, str(tmp_path / "m.npz"))
        x = torch.randn(2, 3, 32, 32)
        assert ((ref(x) - model(x)).norm() / model(x).norm()) <= 1e-5


@pytest.mark.parametrize("key, value, said", [
    ("vitlab/gelu", np.array("relu"), "vitlab/gelu is 'relu'"),
    ("vitlab/gelu", np.array([1.0]), "vitlab/gelu is float64 (1,)"),
    ("vitlab/ln_eps", np.array(-1.0), "vitlab/ln_eps is -1.0"),
    ("vitlab/ln_eps", np.array("1e-6"), "vitlab/ln_eps is '1e-6'"),
])
def test_a_bad_record_is_one_line(tmp_path, key, value, said):
    write_jax_npz(random_vit(tiny(gelu="tanh")), tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(tmp_path / "bad.npz", **arrays, **{key: value})
    with pytest.raises(WeightsError, match=re.escape(said)) as err:
        read_jax_npz(tmp_path / "bad.npz")
    assert "\n" not in str(err.value)

"""`vitlab.runtime.quantize.quantize_int8`: dynamic int8 Linear layers against the float32 model they came from, on a
model trained here (a zero-initialised or random model has no margins to keep, so agreement would mean nothing)."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitlab.data import load_split
from vitlab.models import BiT, BiTConfig, VisionTransformer, ViTConfig
from vitlab.runtime.quantize import is_int8, quantize_int8

# 8x8 digits, patch 2: 17 tokens of width 64, trained ~300 Adam steps (a few seconds) to ~95 % top-1.
CFG = ViTConfig(image_size=8, patch_size=2, width=64, depth=2, mlp_dim=128, num_heads=4, num_classes=10,
                name="tiny-digits")


def _digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    s = load_split("digits", split)
    x = np.repeat(s.arrays[..., None], 3, axis=-1).astype(np.float32) / 255.0  # (N, 8, 8, 3)
    return torch.from_numpy((x - 0.5) / 0.5).permute(0, 3, 1, 2).contiguous(), torch.as_tensor(s.labels).long()


@functools.lru_cache(maxsize=1)
def trained_digits_vit() -> tuple[VisionTransformer, torch.Tensor, torch.Tensor]:
    """(model trained on the digits' training split, validation images, labels); shared with test_export."""
    torch.manual_seed(0)
    model = VisionTransformer(CFG)
    x, y = _digits("train")
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        idx = torch.randint(0, len(x), (64,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    xv, yv = _digits("val")
    return model.eval(), xv, yv


@pytest.fixture(scope="module")
def trained() -> tuple[VisionTransformer, torch.Tensor, torch.Tensor]:
    return trained_digits_vit()


def test_int8_keeps_the_trained_models_predictions(trained):
    model, x, y = trained
    with torch.inference_mode():
        ref = model(x)
        out = quantize_int8(copy.deepcopy(model))(x)
    top1 = (ref.argmax(-1) == y).float().mean().item()
    assert top1 > 0.85, f"the fixture did not train ({top1:.3f}): the agreement below would mean nothing"
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    rel = ((out - ref).norm() / ref.norm()).item()
    # Bounds of int8 against float32, stated in README's Deployment section: >= 99 % of the top-1 choices, logits
    # within 5 % (relative Frobenius norm); measured here 100 % and about 1 %.
    assert agree >= 0.99 and rel <= 0.05, (agree, rel)
    assert rel > 0  # it did change the arithmetic


def test_encoder_linears_become_int8_and_the_head_stays_float(trained):
    q = quantize_int8(copy.deepcopy(trained[0]))
    assert is_int8(q) and not is_int8(trained[0])
    kinds = {name: type(m).__name__ for name, m in q.named_modules()}
    assert kinds["blocks.0.attn.qkv"] == kinds["blocks.1.mlp.fc2"] == "Int8DynamicLinear"
    assert kinds["head"] == "Linear" and q.head.weight.dtype == torch.float32
    weights = q.blocks[0].attn.qkv.weight().int_repr()  # 7-bit, symmetric, the full range of each channel used
    assert weights.min().item() >= -64 and weights.max().item() <= 63 and weights.abs().max().item() >= 63
    assert q.config == CFG  # still the vitlab model: its config and methods are untouched
    assert q.forward_head(q.forward_features(trained[1][:2])).shape == (2, 10)


def test_large_activations_times_large_weights_do_not_saturate():
    """The worst case for x86 without VNNI: every activation at the top of its 8-bit range times every weight at
    the top of its range, summed in int16 pairs. Closed form: x = 1 everywhere, W = +-1 by row, so y = +-256.
    8-bit weights with 8-bit activations saturate here (255 x 127 x 2 > 32767: y came out 129, half, on AVX2);
    vitlab's 7-bit weights cannot (255 x 64 x 2 < 32767)."""
    layer = torch.nn.Linear(256, 4, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand(4, 256))
    q = quantize_int8(torch.nn.Sequential(layer))
    with torch.inference_mode():
        y = q(torch.ones(3, 256))
    assert torch.allclose(y, torch.tensor([256.0, -256.0, 256.0, -256.0]).expand(3, 4), rtol=0.02), y[0]


def test_the_users_quantized_engine_is_left_as_it_was(trained):
    """quantize_int8 packs with oneDNN's kernels (measured faster at batch >= 16) but must not change the engine
    the rest of the user's program quantizes with."""
    engines = [e for e in ("fbgemm", "x86", "qnnpack") if e in torch.backends.quantized.supported_engines]
    previous = torch.backends.quantized.engine
    try:
        for engine in engines:
            torch.backends.quantized.engine = engine
            q = quantize_int8(copy.deepcopy(trained[0]))
            assert torch.backends.quantized.engine == engine
        with torch.inference_mode():  # packed under oneDNN, run under whatever engine is set: still right
            agree = (q(trained[1]).argmax(-1) == trained[0](trained[1]).argmax(-1)).float().mean().item()
        assert agree >= 0.99
    finally:
        torch.backends.quantized.engine = previous


def test_bit_has_nothing_to_quantize_and_computes_as_before():
    torch.manual_seed(0)
    model = BiT(BiTConfig(layers=(1,), num_classes=5, image_size=32)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = model(x)
        out = quantize_int8(model)(x)
    assert not is_int8(model)
    assert torch.equal(out, ref)


def test_a_model_off_the_cpu_is_refused_in_one_line():
    model = VisionTransformer(CFG).to("meta")
    with pytest.raises(ValueError, match=r"int8 inference runs on the CPU only, and the model is on meta"):
        quantize_int8(model)


def test_no_deprecation_warning_reaches_the_user():
    """torch.ao.quantization warns once per process when imported: a fresh interpreter, every warning shown."""
    code = ("import torch, vitlab\nfrom vitlab.runtime.quantize import quantize_int8\n"
            "m = quantize_int8(vitlab.create_model('ViT-Ti/16', depth=1, image_size=32, num_classes=3))\n"
            "m(torch.randn(2, 3, 32, 32))\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
    assert "deprecat" not in done.stderr.lower(), done.stderr[-2000:]
    assert done.stderr.strip() == ""

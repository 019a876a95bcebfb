"""Initialisation as the official code (vit_jax models_vit.py, Flax defaults), measured against closed forms:

- patch embedding and `pre_logits`: Flax `lecun_normal` = variance_scaling(1, "fan_in", "truncated_normal"): a
  normal truncated at ±2 of σ = sqrt(1/fan_in)/0.87962566103423978, so that the samples' std is sqrt(1/fan_in);
- encoder Dense kernels xavier-uniform, bound sqrt(6/(fan_in + fan_out)), q/k/v each a D×D kernel (Flax's
  DenseGeneral initialises the flattened (D, heads·hd) kernel); MLP biases normal(1e-6); q/k/v/out biases 0;
- class token 0, position embedding normal(0.02), head kernel 0 and bias `head_bias_init`.
The truncated-normal reference is scipy.stats.truncnorm, independent of torch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from tests.conftest import TINY_VIT_ARGS
from vitlab.losses import classification_loss
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train import resolve_config
from vitlab.train.trainer import build_run_model


@pytest.fixture(scope="module")
def wide() -> VisionTransformer:
    """Large layers for the statistics: a 768·1024 patch embedding (16×16×3 → 1024) and a 1024×1024 pre_logits."""
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=16, width=1024, depth=1, mlp_dim=4096, num_heads=8, num_classes=10,
                    representation_size=1024)
    return VisionTransformer(cfg)


@pytest.mark.parametrize("layer", ["patch_embed", "pre_logits"])
def test_lecun_normal_is_truncated_with_the_correction(wide, layer):
    w = (wide.patch_embed.proj.weight if layer == "patch_embed" else wide.pre_logits[0].weight).detach().double()
    fan_in = w[0].numel()
    target = math.sqrt(1.0 / fan_in)
    sigma = target / stats.truncnorm.std(-2, 2)  # the untruncated σ; truncnorm.std(-2, 2) = 0.8796…
    assert stats.truncnorm.std(-2, 2) == pytest.approx(0.87962566103423978, rel=1e-12)
    x = w.flatten().numpy()
    assert abs(x.std() / target - 1) < 0.005  # was 1.137 with torch's absolute ±2 bounds
    assert np.abs(x).max() <= 2 * sigma * (1 + 1e-6)  # truncated at ±2σ …
    assert np.abs(x).max() >= 1.99 * sigma  # … and the tails reach it
    # Shape of the distribution: share beyond 1σ and Kolmogorov-Smirnov distance to the closed form.
    beyond = 1 - (stats.norm.cdf(1) - stats.norm.cdf(-1)) / (stats.norm.cdf(2) - stats.norm.cdf(-2))
    assert np.mean(np.abs(x) > sigma) == pytest.approx(beyond, abs=0.003)
    assert stats.kstest(x, stats.truncnorm(-2, 2, scale=sigma).cdf).statistic < 0.003


def test_biases_class_token_position_embedding_and_head(wide):
    block = wide.blocks[0]
    for b in (block.attn.qkv.bias, block.attn.proj.bias, wide.patch_embed.proj.bias, wide.pre_logits[0].bias,
              wide.head.weight, wide.head.bias, wide.cls_token):
        assert torch.count_nonzero(b) == 0
    mlp_bias = torch.cat([block.mlp.fc1.bias, block.mlp.fc2.bias]).double()  # 5120 samples of normal(1e-6)
    assert mlp_bias.std().item() == pytest.approx(1e-6, rel=0.05) and abs(mlp_bias.mean().item()) < 1e-7
    assert wide.pos_embed.std().item() == pytest.approx(0.02, rel=0.02)
    kurt = stats.kurtosis(wide.pos_embed.detach().flatten().numpy())  # a plain normal: excess kurtosis 0
    assert abs(kurt) < 0.1


def test_xavier_uniform_kernels_per_projection(wide):
    d = wide.config.width
    block = wide.blocks[0]
    q, k, v = block.attn.qkv.weight.detach().double().chunk(3)
    for kernel, fan_in, fan_out in [(q, d, d), (k, d, d), (v, d, d), (block.attn.proj.weight, d, d),
                                    (block.mlp.fc1.weight, d, 4 * d), (block.mlp.fc2.weight, 4 * d, d)]:
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        x = kernel.detach().double().flatten()
        assert x.abs().max().item() <= bound and x.abs().max().item() > 0.999 * bound
        assert x.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.005)


def test_initial_sigmoid_loss_of_a_fresh_21k_model():
    """Head kernel 0 and bias −10: every logit is −10, so the summed sigmoid cross-entropy per image is
    (K − 1)·log(1 + e^−10) + log(1 + e^10) = K·log(1 + e^−10) + 10."""
    k = 21_843
    cfg = resolve_config("pretrain", model="ViT-Ti/16", model_args=TINY_VIT_ARGS, image_size=32)
    model = build_run_model(cfg, [str(i) for i in range(k)])
    assert model.config.representation_size == 32 and model.pre_logits is not None
    x, y = torch.rand(4, 3, 32, 32) * 2 - 1, torch.randint(0, k, (4,))
    with torch.no_grad():
        loss = classification_loss(model(x), y, cfg.loss, cfg.label_smoothing).item()
    expected = k * math.log1p(math.exp(-10)) + 10  # 10.99164
    assert loss == pytest.approx(expected, rel=0.01)
    assert loss == pytest.approx(expected, rel=1e-5)  # in fact exact up to float32 rounding


def test_head_bias_init_only_from_scratch(tmp_path):
    cfg = resolve_config("demo", model="ViT-Ti/16", model_args=TINY_VIT_ARGS, image_size=32, head_bias_init=-3.0)
    model = build_run_model(cfg, ["a", "b"])
    assert torch.equal(model.head.bias, torch.full((2,), -3.0)) and torch.count_nonzero(model.head.weight) == 0
    assert model.pre_logits is None  # the demo recipe has no representation layer unless asked for
    import vitlab

    vitlab.save(model, tmp_path / "m.safetensors")
    tuned = build_run_model(resolve_config("finetune", init=str(tmp_path / "m.safetensors"), image_size=32), ["x"])
    assert torch.count_nonzero(tuned.head.bias) == 0  # a fine-tuning head stays zero
    with pytest.raises(ValueError, match="trained from scratch"):
        build_run_model(resolve_config("finetune", init=str(tmp_path / "m.safetensors"), image_size=32,
                                   head_bias_init=-10.0), ["x"])

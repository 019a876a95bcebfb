"""Stochastic depth against its definition (Huang et al. 2016; timm/DeiT's per-block schedule): in training each
sample keeps a branch with probability 1 − p, scaled by 1/(1 − p); in eval it is the identity; the rates rise
linearly over the blocks; the config field defaults to 0 so that configs without it still load and round-trip."""

import math

import pytest
import torch

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.models import ViTConfig, config_from_dict
from vitlab.models.droppath import DropPath, drop_path_rates


def test_train_mode_keeps_each_sample_with_prob_1_minus_p_scaled():
    p, n = 0.3, 20_000
    torch.manual_seed(0)
    x = torch.ones(n, 5, 4)
    y = DropPath(p).train()(x)
    per_sample = y.flatten(1)
    assert torch.equal(per_sample, per_sample[:, :1].expand_as(per_sample))  # one draw per sample, not per value
    values = set(per_sample[:, 0].tolist())
    assert len(values) == 2 and all(v == 0.0 or v == pytest.approx(1 / (1 - p)) for v in values)
    dropped = (per_sample[:, 0] == 0).float().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)  # binomial standard error of the dropped fraction
    assert abs(dropped - p) < 5 * sigma
    assert abs(y.mean().item() - 1.0) < 5 * sigma / (1 - p)  # unbiased: E[y] = x


def test_eval_mode_and_zero_rate_are_the_identity():
    x = torch.randn(8, 3)
    assert DropPath(0.5).eval()(x) is x
    assert DropPath(0.0).train()(x) is x


def test_rates_rise_linearly_as_timm():
    assert drop_path_rates(0.2, 5) == pytest.approx(torch.linspace(0, 0.2, 5).tolist())
    assert drop_path_rates(0.1, 1) == [0.0]
    model = vitlab.create_model("ViT-Ti/16", image_size=32, depth=4, drop_path_rate=0.3)
    rates = [getattr(b.drop_path, "p", 0.0) for b in model.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    hybrid = vitlab.create_model("R+ViT-Ti/16", image_size=32, depth=2, drop_path_rate=0.1)
    assert hybrid.blocks[-1].drop_path.p == pytest.approx(0.1)


def test_model_drops_whole_samples_in_training_only():
    """With p = 0.999 in the last block, almost every sample skips both of its branches: the training output of
    that block equals its input for those samples; eval equals the model without stochastic depth."""
    base = vitlab.create_model("ViT-Ti/16", image_size=32, depth=2, num_classes=3)
    sd = vitlab.create_model("ViT-Ti/16", image_size=32, depth=2, num_classes=3, drop_path_rate=0.999)
    sd.load_state_dict(base.state_dict())
    x = torch.randn(16, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(sd.eval()(x), base.eval()(x))
        z, _ = sd.embed(x)
        z = sd.blocks[0](z)
        torch.manual_seed(0)
        out = sd.blocks[1].train()(z)
    unchanged = (out == z).flatten(1).all(dim=1)
    assert unchanged.float().mean() > 0.9


def test_config_field_defaults_and_round_trips(tmp_path):
    old = ViTConfig(**TINY_VIT_ARGS, image_size=16, patch_size=8).to_dict()
    old.pop("drop_path_rate")  # a config written before the field existed
    assert config_from_dict(old).drop_path_rate == 0.0
    model = vitlab.create_model("ViT-Ti/16", image_size=32, drop_path_rate=0.1)
    assert model.config.name == "ViT-Ti/16"  # a regularisation setting keeps the variant's name
    vitlab.save(model, tmp_path / "m.safetensors")
    assert vitlab.load(tmp_path / "m.safetensors").config == model.config
    with pytest.raises(ValueError, match=r"drop_path_rate must be in \[0, 1\), got 1.0"):
        ViTConfig(drop_path_rate=1.0)

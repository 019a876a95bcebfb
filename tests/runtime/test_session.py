"""The one inference set-up (vitlab.runtime.session): weights or a model on a device, in the precision resolved
for inference, prepared for it (or float32 weights under autocast alone), with the weights' class names."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.models import ViTConfig, build_model
from vitlab.runtime.precision import Precision, resolve_precision
from vitlab.runtime.session import open_session

TINY = ViTConfig(image_size=(8, 8), patch_size=4, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=3)


@pytest.fixture
def weights(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tiny.safetensors"
    vitlab.save(build_model(TINY), path)
    return path


def test_a_file_opens_on_the_cpu_in_eval_mode_with_index_names(weights):
    session = open_session(weights, device="cpu", precision="fp32")
    assert session.device == torch.device("cpu") and not session.model.training
    assert session.precision == resolve_precision("fp32", torch.device("cpu"), use="infer", width=32)
    assert session.class_names == ("0", "1", "2")
    assert next(session.model.parameters()).dtype == torch.float32


def test_bf16_casts_a_vit_for_forward_or_keeps_float32_under_autocast(weights):
    cast = open_session(weights, device="cpu", precision="bf16")
    assert next(cast.model.parameters()).dtype == torch.bfloat16
    kept = open_session(weights, device="cpu", precision="bf16", cast_weights=False)
    assert next(kept.model.parameters()).dtype == torch.float32
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), kept.autocast():
        assert kept.model.patch_embed.proj(x).dtype == torch.bfloat16  # a float32 convolution computed in bf16
    with torch.no_grad(), cast.autocast():
        assert cast.model(x).dtype == torch.float32  # logits back in float32


def test_a_resolved_precision_is_taken_as_it_is():
    chosen = Precision("fp32", "the caller's reason")
    assert open_session(build_model(TINY), device="cpu", precision=chosen).precision is chosen


def test_load_options_and_int8_without_casting_are_refused(weights):
    with pytest.raises(ValueError, match="weights being loaded"):
        open_session(build_model(TINY), device="cpu", num_classes=5)
    with pytest.raises(ValueError, match="int8"):
        open_session(weights, device="cpu", precision="int8", cast_weights=False)
    assert open_session(weights, device="cpu", precision="fp32", num_classes=5).class_names == tuple("01234")


def test_vitlab_load_with_a_precision_is_the_session_model(weights):
    model = vitlab.load(weights, precision="bf16")
    assert model.precision == Precision("bf16", "requested")
    assert next(model.parameters()).dtype == torch.bfloat16

"""Fine-tuning end to end from every foreign format (official .npz, timm hub folder, HF folder), made here from
random weights, at a larger resolution than the weights' own: new zero-init head, position embedding resampled."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import vitlab
from vitlab.models.posembed import resample_pos_embed
from vitlab.train import resolve_config, run
from vitlab.train.trainer import build_run_model

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

CLASSES = ["ant", "bee", "cow"]


def folder(root):
    for split in ("train", "val"):
        for c, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (20, 20), (90 * c, 50 * i, 30)).save(root / split / name / f"{i}.png")
    return root


def official_npz(tmp_path):
    from vitlab.weights.jax_npz import write_jax_npz

    model = vitlab.create_model("ViT-Ti/8", image_size=16, num_classes=7, width=32, depth=2, num_heads=2, mlp_dim=64,
                                representation_size=16, gelu="tanh")
    write_jax_npz(model, tmp_path / "vit.npz")
    return tmp_path / "vit.npz"


def timm_folder(tmp_path):
    from timm.models import save_for_hf

    args = dict(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=7)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args)
    save_for_hf(model, tmp_path / "timm", model_args=args, safe_serialization=True)
    return tmp_path / "timm"


def hf_folder(tmp_path):
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification

    config = HFConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      image_size=16, patch_size=8, num_labels=7)
    ViTForImageClassification(config).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


MAKERS = {"jax-npz": official_npz, "timm": timm_folder, "hf": hf_folder}


def config(tmp_path, init, **overrides):
    base = dict(init=str(init), data=str(folder(tmp_path / "data")), out=str(tmp_path / "run"), image_size=32,
                batch_size=6, steps=3, warmup=1, eval_every=0, log_every=1, workers=0, eval_batch_size=64)
    return resolve_config("finetune", **{**base, **overrides})


@pytest.mark.parametrize("fmt", list(MAKERS))
def test_finetune_from_foreign_weights(tmp_path, fmt):
    init = MAKERS[fmt](tmp_path)
    source = vitlab.load(init)
    assert source.config.image_size == (16, 16) and source.config.num_classes == 7
    cfg = config(tmp_path, init)
    # the model fine-tuning starts from: the file's encoder, position embedding resampled to 32x32, zero head
    start = build_run_model(cfg, CLASSES)
    assert start.config.image_size == (32, 32) and start.config.num_classes == 3
    assert start.pre_logits is None and start.config.representation_size is None
    assert torch.count_nonzero(start.head.weight) == 0 and torch.count_nonzero(start.head.bias) == 0
    expected_pos = resample_pos_embed(source.pos_embed.detach(), (4, 4), (2, 2), 1)
    assert torch.allclose(start.pos_embed, expected_pos)
    assert torch.equal(start.blocks[1].mlp.fc1.weight, source.blocks[1].mlp.fc1.weight)
    assert (start.config.mean, start.config.std, start.config.gelu) == (
        source.config.mean, source.config.std, source.config.gelu)
    # a few SGD steps at the new resolution
    result = run(cfg)
    assert result.status == "completed" and result.metrics["count"] == 12
    tuned = vitlab.load(result.weights)
    assert tuned.config.image_size == (32, 32) and tuned.class_names == CLASSES
    assert torch.count_nonzero(tuned.head.weight) > 0
    assert not torch.equal(tuned.blocks[0].attn.qkv.weight, start.blocks[0].attn.qkv.weight)

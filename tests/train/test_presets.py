"""Fine-tuning presets (paper Table 4), the official fine-tuning dropout, and the BiT-HyperRule resolved from the
data, against the values quoted from their sources; `vitlab finetune --recipe bit-hyperrule` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.data import Datasets, ImageSplit
from vitlab.train import resolve, resolve_config
from vitlab.train.optim import build_scheduler
from vitlab.train.recipes import finetune_dropout, hyperrule, typical_image_size
from vitlab.train.trainer import build_run_model

# Paper Table 4 (steps, base LRs) and Appendix B.1.1 (dev splits: "10% for Pets and Flowers, 2% for CIFAR,
# 1% ImageNet"); VTAB: one setting, lr 0.01.
SWEEP = (0.001, 0.003, 0.01, 0.03)
TABLE4 = {
    "imagenet": (20_000, (0.003, 0.01, 0.03, 0.06), 0.01),
    "cifar10": (10_000, SWEEP, 0.02),
    "cifar100": (10_000, SWEEP, 0.02),
    "pets": (500, SWEEP, 0.10),
    "flowers": (500, SWEEP, 0.10),
    "vtab": (2_500, (), None),
}


@pytest.mark.parametrize("preset", list(TABLE4))
def test_presets_are_the_rows_of_table4(preset):
    steps, lrs, dev = TABLE4[preset]
    cfg = resolve_config("finetune", preset=preset)
    assert (cfg.steps, cfg.lr_sweep, cfg.dev_fraction, cfg.preset) == (steps, lrs, dev, preset)
    # Table 4 caption and Appendix B.1.1, for every row
    assert (cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.decay) == ("sgd", 0.9, 0.0, "cosine")
    assert (cfg.batch_size, cfg.grad_clip, cfg.image_size) == (512, 1.0, 384)
    if preset == "vtab":
        assert cfg.lr == 0.01


def test_flags_win_over_presets_and_an_explicit_lr_is_one_run():
    cfg = resolve_config("finetune", preset="cifar10", steps=7, dev_fraction=0.05)
    assert (cfg.steps, cfg.dev_fraction, cfg.lr_sweep) == (7, 0.05, SWEEP)
    assert resolve_config("finetune", preset="pets", lr=0.02).lr_sweep == ()
    assert resolve_config("finetune", preset="pets", lr=0.02, lr_sweep=(0.1, 0.2)).lr_sweep == (0.1, 0.2)
    with pytest.raises(ValueError, match="unknown preset 'cifar1'; choose one of imagenet, cifar10"):
        resolve_config("finetune", preset="cifar1")


# vision_transformer vit_jax/configs/models.py, transformer.dropout_rate: 0.1 in get_l16_config, get_h14_config,
# get_r50_b16_config and get_r50_l32_config (built on get_l16_config); get_l32_config sets 0.0; all others 0.0.
OFFICIAL_DROPOUT_RATE = {"ViT-L/16": 0.1, "ViT-H/14": 0.1, "R50+ViT-B/16": 0.1, "R50+ViT-L/32": 0.1}


def test_finetune_dropout_is_the_official_configs():
    for name in vitlab.list_models():
        if name.startswith("BiT-"):
            continue
        assert finetune_dropout(name) == OFFICIAL_DROPOUT_RATE.get(name.removesuffix("-gap"), 0.0), name


@pytest.mark.parametrize("name, expected", [("ViT-L/16", 0.1), ("ViT-B/16", 0.0)])
def test_finetuning_takes_the_dropout_of_the_model_unless_given(tmp_path, name, expected):
    # a tiny model carrying an official name, saved with pre-training's dropout 0.1
    source = vitlab.create_model("ViT-Ti/4", image_size=8, **TINY_VIT_ARGS, dropout=0.1,
                                 name=name)
    vitlab.save(source, tmp_path / "init.safetensors")
    cfg = resolve_config("finetune", init=str(tmp_path / "init.safetensors"), image_size=8)
    assert build_run_model(cfg, ["a", "b"]).config.dropout == expected
    given = resolve_config("finetune", init=str(tmp_path / "init.safetensors"), image_size=8, dropout=0.2)
    assert build_run_model(given, ["a", "b"]).config.dropout == 0.2


# big_transfer bit_hyperrule.py: get_schedule (warm-up, boundaries, total), get_mixup; resolution per the BiT
# paper, Section 3.3 (images under 96×96 pixels: 160 then a 128 crop; otherwise 448 then 384).
@pytest.mark.parametrize("n, steps, warmup, drops, mixup", [
    (1, 500, 100, (0.4, 0.6, 0.8), 0.0),  # supports [100, 200, 300, 400, 500]
    (19_999, 500, 100, (0.4, 0.6, 0.8), 0.0),
    (20_000, 10_000, 500, (0.3, 0.6, 0.9), 0.1),  # [500, 3000, 6000, 9000, 10_000]
    (499_999, 10_000, 500, (0.3, 0.6, 0.9), 0.1),
    (500_000, 20_000, 500, (0.3, 0.6, 0.9), 0.1),  # [500, 6000, 12_000, 18_000, 20_000]
])
def test_hyperrule_by_dataset_size(n, steps, warmup, drops, mixup):
    rule = hyperrule(n, (32, 32))
    assert (rule["steps"], rule["warmup"], rule["lr_drops"], rule["mixup"]) == (steps, warmup, drops, mixup)


@pytest.mark.parametrize("hw, size", [((32, 32), 128), ((95, 97), 128), ((96, 96), 384), ((224, 300), 384)])
def test_hyperrule_resolution_by_image_area(hw, size):
    assert hyperrule(100, hw)["image_size"] == size


def big_transfer_lr(step: int, supports: list[int], base_lr: float = 0.003) -> float | None:
    """bit_hyperrule.get_lr, transcribed: linear warm-up, then ÷10 after each boundary, None at the end."""
    if step < supports[0]:
        return base_lr * step / supports[0]
    if step >= supports[-1]:
        return None
    return base_lr / 10 ** sum(s < step for s in supports[1:-1])


@pytest.mark.parametrize("n, supports", [(1_438, [100, 200, 300, 400, 500]),
                                         (25_000, [500, 3000, 6000, 9000, 10_000])])
def test_resolved_schedule_is_big_transfers(n, supports):
    cfg = resolve("bit-hyperrule", {}, data=fake_data(n)).config
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    scheduler = build_scheduler(optimizer, cfg)
    ours = []
    for _ in range(cfg.steps):  # the lr the loop uses for update k (0-based)
        ours.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    theirs = [big_transfer_lr(k, supports) for k in range(supports[-1])]
    assert big_transfer_lr(supports[-1], supports) is None and len(ours) == len(theirs)
    assert np.allclose(ours, theirs, rtol=1e-9, atol=0)


def fake_data(n: int, hw: tuple[int, int] = (8, 8)) -> Datasets:
    labels = np.arange(n) % 2
    train = ImageSplit("train", labels, ["a", "b"], arrays=np.zeros((n, *hw), np.uint8))
    return Datasets(train, train.subset(np.arange(2), "val"), ["a", "b"], "fake")


def test_resolution_from_the_digits_is_reported_and_recorded():
    resolved = resolve("bit-hyperrule", {"data": "digits"})
    cfg = resolved.config
    assert (cfg.steps, cfg.warmup, cfg.lr_drops, cfg.mixup, cfg.image_size) == (500, 100, (0.4, 0.6, 0.8), 0.0, 128)
    assert resolved.sources["steps"] == "recipe bit-hyperrule: BiT-HyperRule on 1,438 training images"
    assert ("bit-hyperrule: 1,438 images < 20k → 500 steps, warm-up 100, lr ×0.1 after 40/60/80%, "
            "no MixUp, 128 px (images 8×8 < 96×96)") in resolved.notes
    assert len(resolved.data.train) == 1438  # built once, for the loop to reuse


def test_flags_win_over_the_hyperrule():
    resolved = resolve("bit-hyperrule", dict(steps=50, mixup=0.2, image_size=64), data=fake_data(25_000))
    cfg = resolved.config
    assert (cfg.steps, cfg.mixup, cfg.image_size) == (50, 0.2, 64)
    assert cfg.warmup == round(500 * 50 / 10_000)  # the rule's warm-up share of the steps given
    note = next(n for n in resolved.notes if n.startswith("bit-hyperrule"))
    assert "50 steps (set)" in note and "MixUp α=0.2 (set)" in note and "64 px (set)" in note


def test_typical_image_size_of_a_folder(tmp_path):
    split = ImageSplit("train", np.zeros(5, np.int64), ["a"], paths=[])
    for i, (w, h) in enumerate([(40, 30), (300, 200), (120, 90), (90, 120), (50, 50)]):
        Image.new("RGB", (w, h)).save(tmp_path / f"{i}.png")
        split.paths.append(str(tmp_path / f"{i}.png"))
    assert typical_image_size(split) == (90, 120)  # median area 10,800 (120×90 and 90×120; the first probed)
    assert typical_image_size(split, probe=3) == (120, 90)  # images 0, 1 and 3 probed


# The model fine-tuned end to end. The BiT line needs the BiT ResNetV2 family (models/bit.py); a tiny width keeps
# it fast. To test one model only, keep its line.
MODELS = {
    "vit": ("ViT-Ti/4", dict(**TINY_VIT_ARGS)),
    "bit": ("BiT-R50x1", dict(layers=(1, 1))),
}


def folder(root):
    for split in ("train", "val"):
        for c, name in enumerate(["ant", "bee", "cow"]):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (24, 20), (90 * c, 50 * i, 30)).save(root / split / name / f"{i}.png")
    return root


@pytest.mark.parametrize("model", list(MODELS))
def test_finetune_with_the_bit_hyperrule_end_to_end(tmp_path, capsys, caplog, model):
    name, args = MODELS[model]
    vitlab.save(vitlab.create_model(name, image_size=32, num_classes=7, **args), tmp_path / "init.safetensors")
    out = tmp_path / "run"
    caplog.set_level("INFO", logger="vitlab.train")
    code = main(["finetune", "--recipe", "bit-hyperrule", "--init", str(tmp_path / "init.safetensors"),
                 "--data", str(folder(tmp_path / "data")), "--out", str(out), "--steps", "2", "--batch-size", "6",
                 "--mixup", "0.1", "--workers", "0", "--eval-batch-size", "64", "--log-every", "1"])
    assert code == 0
    assert "done: step 2" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    # from the data: 12 images of 24×20 px (< 20k, < 96×96): 128-pixel crops (of 160), 40/60/80% drops;
    # warm-up = the rule's 100/500 of the 2 steps given; explicit --steps and --mixup kept
    assert (cfg["image_size"], cfg["lr_drops"], cfg["warmup"], cfg["steps"], cfg["mixup"]) == (
        128, [0.4, 0.6, 0.8], 0, 2, 0.1)
    assert (cfg["decay"], cfg["lr"], cfg["train_crop"], cfg["eval_resize"]) == (
        "step", 0.003, "resize-random-crop", "official")
    assert cfg["model_config"]["image_size"] == [128, 128] and cfg["model_config"]["num_classes"] == 3
    assert "bit-hyperrule: 12 images < 20k → 2 steps (set)" in caplog.text

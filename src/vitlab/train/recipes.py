"""The training recipes: their values, where each comes from, the pre-training values that depend on the model, and
the listing that `vitlab recipes` and `vitlab train --recipe X --help` print. As data:
- `RECIPES`: each recipe's values (plain TrainConfig fields; AugReg's and DeiT's in recipes_augreg);
- `RECIPE_SOURCES`: the paper table and row, or the official config, each recipe's values come from;
- `MODEL_ROWS`: values a pre-training recipe takes from another row of paper Table 3 when `--model` is that row's
  model (JFT-300M's learning rate falls with model size);
- `EPOCHS`: the epochs and dataset size a recipe's step count stands for, at the recipe's batch.
A recipe lists in its `auto` entry the settings the resolution step (vitlab.train.resolve) takes from the model
or the data; a setting given explicitly is never replaced.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# --------------------------------------------------------------------------------------------------------------
# The AugReg pre-training recipes (Steiner et al. 2021, "How to train your ViT?") and DeiT's ImageNet-1k recipe
# (Touvron et al. 2021, Table 9), as plain TrainConfig values with their sources.
#
# AugReg trains every model with the same optimiser and schedule and varies the augmentation along one axis,
# seven settings from `none` to `heavy2`: RandAugment with 2 operations at magnitude m and MixUp with α
# (big_vision `configs/vit_i21k.py` and `configs/vit_i1k.py`, RANDAUG_DEF and MIXUP_DEF, where `heavy` is named
# `strong`). Regularisation is a separate axis of the study: dropout and stochastic depth both 0 or both 0.1 (§3.3;
# the checkpoint names' `do_0.1-sd_0.1`). The recipes take 0 (most released checkpoints, e.g. B/16
# `aug_medium1-wd_0.1-do_0.0-sd_0.0`); `--dropout 0.1 --drop-path-rate 0.1` gives the regularised runs (L/16's).
# The weight decay 0.1 is AugReg's, applied as vitlab's (and vit_jax's) decoupled decay times the learning rate:
# big_vision's absolute `wd = 0.0001` = 0.1 × lr 0.001.

# level -> (RandAugment magnitude, MixUp α); RandAugment has 2 operations wherever it is on.
AUGREG_LEVELS: dict[str, tuple[float | None, float]] = {
    "none": (None, 0.0),
    "light1": (0.0, 0.0),  # randaug(2, 0): not nothing (identity magnitudes, but autocontrast, equalize, …)
    "light2": (10.0, 0.2),
    "medium1": (15.0, 0.2),
    "medium2": (15.0, 0.5),
    "heavy1": (20.0, 0.5),
    "heavy2": (20.0, 0.8),
}

# ImageNet-21k pre-training as AugReg (§3.4; big_vision configs/vit_i21k.py): Adam (0.9, 0.999), lr 1e-3, 10k
# warm-up, cosine decay, clipping at global norm 1, batch 4096, 300 epochs, sigmoid loss with head bias −10, no
# `pre_logits` layer (§3.2: the head's hidden layer was dropped), inception crop + flip, evaluation at short side
# 256 then the central 224.
_AUGREG_COMMON: dict[str, Any] = dict(
    model="ViT-B/16", image_size=224, optimizer="adam", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.999),
    warmup=10_000, decay="cosine", grad_clip=1.0, dropout=0.0, drop_path_rate=0.0, loss="sigmoid",
    head_bias_init=-10.0, batch_size=4096, steps=300 * 14_000_000 // 4096, crop_scale=(0.05, 1.0), flip=True,
    train_crop="inception", eval_resize="big_vision", eval_every=10_000, log_every=50,
)


def _augreg(level: str) -> dict[str, Any]:
    magnitude, alpha = AUGREG_LEVELS[level]
    randaug = dict(randaug_ops=0, randaug_magnitude=0.0) if magnitude is None else \
        dict(randaug_ops=2, randaug_magnitude=magnitude)
    return {**_AUGREG_COMMON, **randaug, "mixup": alpha}


AUGREG_RECIPES: dict[str, dict[str, Any]] = {f"augreg-{level}": _augreg(level) for level in AUGREG_LEVELS}

# DeiT-B on ImageNet-1k, Touvron et al. 2021 Table 9 (and the DeiT repository's main.py defaults): 300 epochs of
# batch 1024, AdamW lr 5e-4 × 1024/512, weight decay 0.05, cosine, 5 warm-up epochs, label smoothing 0.1, no
# dropout, stochastic depth 0.1, RandAugment m9 mstd 0.5 (timm `rand-m9-mstd0.5-inc1`), MixUp 0.8, CutMix 1.0,
# random erasing 0.25, no gradient clipping. Steps: 300 × 1,281,167 / 1024; warm-up 5 epochs.
_DEIT_BATCH = 1024
_DEIT_EPOCH = 1_281_167 // _DEIT_BATCH
DEIT_RECIPE: dict[str, Any] = dict(
    model="ViT-B/16", image_size=224, optimizer="adam", lr=5e-4 * _DEIT_BATCH / 512, weight_decay=0.05,
    betas=(0.9, 0.999), warmup=5 * _DEIT_EPOCH, decay="cosine", grad_clip=0.0, dropout=0.0, drop_path_rate=0.1,
    loss="softmax", label_smoothing=0.1, batch_size=_DEIT_BATCH, steps=300 * 1_281_167 // _DEIT_BATCH,
    randaug_ops=2, randaug_magnitude=9.0, randaug_mstd=0.5, mixup=0.8, cutmix=1.0, random_erasing=0.25,
    crop_scale=(0.08, 1.0), flip=True, train_crop="inception", eval_resize="big_vision", eval_every=10_000,
    log_every=50,
)

_AUGREG_SOURCE = ("Steiner et al. 2021 ('How to train your ViT?') §3.3-3.4: Adam, lr 1e-3, weight decay 0.1 "
                  "(×lr), 10k warm-up, cosine, clip 1, batch 4096, 300 epochs of ImageNet-21k, sigmoid loss; "
                  "augmentation level {level}: {what} (big_vision configs/vit_i21k.py RANDAUG_DEF / MIXUP_DEF, "
                  "'{bv}' there); dropout and stochastic depth 0, the study's other setting is 0.1 for both")


def _source(level: str) -> str:
    magnitude, alpha = AUGREG_LEVELS[level]
    what = "no RandAugment" if magnitude is None else f"RandAugment 2 operations at magnitude {magnitude:g}"
    what += f", MixUp α {alpha:g}" if alpha else ", no MixUp"
    return _AUGREG_SOURCE.format(level=level, what=what, bv=level.replace("heavy", "strong"))


AUGREG_SOURCES: dict[str, str] = {
    **{f"augreg-{level}": _source(level) for level in AUGREG_LEVELS},
    "deit": ("Touvron et al. 2021 (DeiT) Table 9, DeiT-B: AdamW lr 5e-4 × batch/512 (batch 1024), weight decay "
             "0.05, 300 epochs, 5 warm-up epochs, cosine, label smoothing 0.1, dropout 0, stochastic depth 0.1, "
             "RandAugment 9/0.5, MixUp 0.8, CutMix 1.0, random erasing 0.25, no clipping; not reproduced: "
             "repeated augmentation, bicubic resizing, the 1e-5 floor of the cosine"),
}

AUGREG_EPOCHS: dict[str, tuple[int, int]] = {
    **{f"augreg-{level}": (300, 14_000_000) for level in AUGREG_LEVELS},
    "deit": (300, 1_281_167),
}


# --------------------------------------------------------------------------------------------------------------
# Fine-tuning settings that depend on the dataset or the model, as data with their source.
#
# - `FINETUNE_PRESETS`: the paper's per-dataset fine-tuning (Table 4, Appendix B.1.1), chosen with `--preset`
#   on top of a recipe: step count, learning-rate sweep and the share of train held out as the dev split that
#   chooses the learning rate.
# - BiT-HyperRule (Kolesnikov et al. 2020, Section 3.3): step count, warm-up, resolution and MixUp chosen from
#   the training set's size and image size once the data is known (`resolve_from_data`).
# - The dropout of fine-tuning: the official model configs' `dropout_rate` (`finetune_dropout`).
#
# A recipe names the settings it leaves to the data or model in its `auto` entry; the resolution step
# (vitlab.train.resolve) fills in only those no later layer (initial weights, preset, config file, flag) set.

if TYPE_CHECKING:
    from vitlab.data import Datasets
    from vitlab.data.sources import ImageSplit

# Table 4 caption: "All models are fine-tuned with cosine learning rate decay, a batch size of 512, no weight
# decay, and grad clipping at global norm 1. If not mentioned otherwise, fine-tuning resolution is 384."
# Appendix B.1.1: SGD with momentum 0.9.
TABLE4_COMMON: dict[str, Any] = dict(
    optimizer="sgd", momentum=0.9, weight_decay=0.0, decay="cosine", batch_size=512, grad_clip=1.0, image_size=384,
)
PAPER_SWEEP = (0.001, 0.003, 0.01, 0.03)  # Table 4, every row but ImageNet and VTAB


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict[str, Any]  # TrainConfig fields, on top of TABLE4_COMMON
    source: str

    def settings(self) -> dict[str, Any]:
        return {**TABLE4_COMMON, **self.values}


# Steps and learning rates: paper Table 4. Dev splits: Appendix B.1.1 ("10% for Pets and Flowers, 2% for
# CIFAR, 1% ImageNet"). Warm-up: 500 steps as the official vit_jax configs/common.py; 100 for the 500-step
# runs as big_vision configs/transfer.py (a 500-step warm-up would take the whole run).
FINETUNE_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("imagenet", dict(steps=20_000, warmup=500, lr_sweep=(0.003, 0.01, 0.03, 0.06), dev_fraction=0.01),
               "paper Table 4, row ImageNet; dev split Appendix B.1.1"),
        Preset("cifar10", dict(steps=10_000, warmup=500, lr_sweep=PAPER_SWEEP, dev_fraction=0.02),
               "paper Table 4, row CIFAR10; dev split Appendix B.1.1"),
        Preset("cifar100", dict(steps=10_000, warmup=500, lr_sweep=PAPER_SWEEP, dev_fraction=0.02),
               "paper Table 4, row CIFAR100; dev split Appendix B.1.1"),
        Preset("pets", dict(steps=500, warmup=100, lr_sweep=PAPER_SWEEP, dev_fraction=0.10),
               "paper Table 4, row Oxford-IIIT Pets; dev split Appendix B.1.1"),
        Preset("flowers", dict(steps=500, warmup=100, lr_sweep=PAPER_SWEEP, dev_fraction=0.10),
               "paper Table 4, row Oxford Flowers-102; dev split Appendix B.1.1"),
        # One setting for all 19 tasks, no per-task sweep (Appendix B.1.1: chosen once on VTAB's 200-image
        # validation sets), trained on the whole train split.
        Preset("vtab", dict(steps=2_500, warmup=500, lr=0.01, lr_sweep=(), dev_fraction=None),
               "paper Table 4, row VTAB (19 tasks); Appendix B.1.1"),
    ]
}


def describe(name: str) -> str:
    """One line per preset for `--help`: its steps, learning rates and dev split, with the source."""
    v = FINETUNE_PRESETS[name].values
    lrs = "lr " + ("{" + ", ".join(f"{x:g}" for x in v["lr_sweep"]) + "}" if v["lr_sweep"] else f"{v['lr']:g}")
    dev = f", dev {100 * v['dev_fraction']:g}%" if v["dev_fraction"] else ""
    return f"{name}: {v['steps']:,} steps, {lrs}{dev} ({FINETUNE_PRESETS[name].source})"


# --- BiT-HyperRule --------------------------------------------------------------------------------------------
# Kolesnikov et al. 2020, Section 3.3, with the schedules of big_transfer's bit_hyperrule.py `get_schedule`, the
# code the paper's results ran: warm-up 100 and drops at 40/60/80% for the 500-step schedule (the paper's text
# says 30/60/90%, which the two longer schedules use, after a 500-step warm-up). Resolution as the paper: 384
# crops of images resized to 448 above 96×96 pixels (the released bit_hyperrule.py has 512 → 480 there).
SMALL_IMAGES, SMALL_DATASET, LARGE_DATASET = 96 * 96, 20_000, 500_000
BIT_DATA_FIELDS = ("steps", "warmup", "lr_drops", "mixup", "image_size")


def hyperrule(num_images: int, image_hw: tuple[int, int]) -> dict[str, Any]:
    """The BiT-HyperRule's data-dependent settings for a training set of `num_images` images of about
    `image_hw` (height, width) pixels."""
    if num_images < SMALL_DATASET:  # get_schedule: [100, 200, 300, 400, 500]
        steps, warmup, drops, mixup = 500, 100, (0.4, 0.6, 0.8), 0.0
    elif num_images < LARGE_DATASET:  # [500, 3000, 6000, 9000, 10_000]
        steps, warmup, drops, mixup = 10_000, 500, (0.3, 0.6, 0.9), 0.1
    else:  # [500, 6000, 12_000, 18_000, 20_000]
        steps, warmup, drops, mixup = 20_000, 500, (0.3, 0.6, 0.9), 0.1
    image_size = 128 if image_hw[0] * image_hw[1] < SMALL_IMAGES else 384  # resized to 160 / 448 first
    return dict(steps=steps, warmup=warmup, lr_drops=drops, mixup=mixup, image_size=image_size)


def typical_image_size(split: ImageSplit, probe: int = 64) -> tuple[int, int]:
    """(height, width) of the median-area image among up to `probe` images spread over the split (`image_size`:
    a file's header, nothing decoded)."""
    if split.arrays is not None:
        return int(split.arrays.shape[1]), int(split.arrays.shape[2])
    from vitlab.data.sources import DECODE_ERRORS

    n, m = len(split), min(probe, len(split))
    sizes = []
    for i in sorted({k * n // m for k in range(m)}):
        try:
            sizes.append(split.image_size(i))  # one over the image budget is skipped, as the loader skips it
        except DECODE_ERRORS:
            continue  # the loader reports unreadable files
    if not sizes:
        raise ValueError(f"no readable image among {m} probed in {split.name}; check the data")
    return sorted(sizes, key=lambda hw: (hw[0] * hw[1], hw))[len(sizes) // 2]  # ties: any order of the split agrees


def hyperrule_from_data(data: Datasets, todo: tuple[str, ...], values: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the BiT-HyperRule's values of the settings in `todo`, a one-line account). `values` holds the run's
    other settings: a warm-up left to the rule while the steps were set keeps the rule's share of the steps
    (20% for 500, 5% for 10k)."""
    n, hw = len(data.train), typical_image_size(data.train)
    rule = hyperrule(n, hw)
    chosen = {name: rule[name] for name in todo}
    if "warmup" in chosen and "steps" not in chosen:
        chosen["warmup"] = round(rule["warmup"] * values["steps"] / rule["steps"])
    r = {**values, **chosen}

    def note(name: str, text: str) -> str:
        return text if name in chosen else f"{text} (set)"

    size_class = "< 20k" if n < SMALL_DATASET else "< 500k" if n < LARGE_DATASET else ">= 500k"
    small = "<" if hw[0] * hw[1] < SMALL_IMAGES else ">="
    parts = [
        note("steps", f"{r['steps']:,} steps"),
        note("warmup", f"warm-up {r['warmup']:,}"),
        note("lr_drops", "lr ×0.1 after " + "/".join(f"{100 * f:g}" for f in r["lr_drops"]) + "%"),
        note("mixup", f"MixUp α={r['mixup']:g}" if r["mixup"] else "no MixUp"),
        note("image_size", f"{r['image_size']} px")
        + (f" (images {hw[0]}×{hw[1]} {small} 96×96)" if "image_size" in chosen else ""),
    ]
    return chosen, f"{n:,} images {size_class} → " + ", ".join(parts)


# --- dropout ----------------------------------------------------------------------------------------------------
# `transformer.dropout_rate` of the official vit_jax configs/models.py, which its fine-tuning uses: 0.1 for
# ViT-L/16, ViT-H/14, R50+ViT-B/16 and R50+ViT-L/32 (an L/16 transformer); 0 for every other model.
OFFICIAL_DROPOUT = {"ViT-L/16": 0.1, "ViT-H/14": 0.1, "R50+ViT-B/16": 0.1, "R50+ViT-L/32": 0.1}


def finetune_dropout(model_name: str) -> float:
    """The official config's dropout for a registry name (a "-gap" variant has its base model's)."""
    return OFFICIAL_DROPOUT.get(model_name.removesuffix("-gap"), 0.0)


# Paper Tables 3 and 4, Appendix B.1. Values are the paper's; `pretrain` runs ~90 epochs of ImageNet-21k.
RECIPES: dict[str, dict[str, Any]] = {
    # Pre-training, paper Table 3 (sources: RECIPE_SOURCES below, `vitlab recipes`). Upstream
    # ImageNet-21k and JFT training as the released models: sigmoid loss, head bias −10, a `pre_logits` layer
    # as wide as the model (`auto`), linear decay to 1e-5. Steps: epochs × images / 4096 (EPOCHS below).
    "pretrain": dict(
        model="ViT-B/16", image_size=224, optimizer="adam", lr=1e-3, weight_decay=0.03, betas=(0.9, 0.999),
        warmup=10_000, decay="linear", linear_end=1e-5, grad_clip=1.0, dropout=0.1, loss="sigmoid",
        head_bias_init=-10.0, batch_size=4096, steps=307_617, crop_scale=(0.05, 1.0), flip=True,
        eval_every=10_000, log_every=50, auto=("representation_size",),
        train_crop="inception", eval_resize="official",
    ),
    "pretrain-i1k": dict(
        model="ViT-B/16", image_size=224, optimizer="adam", lr=3e-3, weight_decay=0.3, betas=(0.9, 0.999),
        warmup=10_000, decay="cosine", grad_clip=1.0, dropout=0.1, loss="softmax", batch_size=4096,
        steps=93_835, crop_scale=(0.05, 1.0), flip=True, eval_every=10_000, log_every=50,
        train_crop="inception", eval_resize="official", auto=("representation_size",),
    ),
    "pretrain-jft": dict(
        model="ViT-B/16", image_size=224, optimizer="adam", lr=8e-4, weight_decay=0.1, betas=(0.9, 0.999),
        warmup=10_000, decay="linear", linear_end=1e-5, grad_clip=1.0, dropout=0.0, loss="sigmoid",
        head_bias_init=-10.0, batch_size=4096, steps=517_822, crop_scale=(0.05, 1.0), flip=True,
        eval_every=10_000, log_every=50, train_crop="inception", eval_resize="official",
        auto=("lr", "steps", "representation_size"),  # Table 3's row for --model (MODEL_ROWS below)
    ),
    "finetune": dict(
        model="ViT-B/16", image_size=384, optimizer="sgd", lr=0.03, momentum=0.9, weight_decay=0.0,
        warmup=500, decay="cosine", grad_clip=1.0, dropout=None, loss="softmax", batch_size=512, steps=10_000,
        crop_scale=(0.05, 1.0), flip=True, eval_every=1000, log_every=50,
        train_crop="inception", eval_resize="official",
        auto=("dropout",),  # the official model config's dropout (0.1 for L/16, H/14, R50+B/16)
    ),
    # BiT-HyperRule (Kolesnikov et al. 2020, Section 3.3; big_transfer bit_pytorch/train.py, bit_hyperrule.py):
    # SGD 0.9, lr 0.003, batch 512, no weight decay or clipping, step decay; steps, warm-up, decay points, MixUp
    # and resolution follow from the training set (`auto`, vitlab.train.recipes.hyperrule); the whole image
    # resized to 160 (448), a random 128 (384) crop, flip; evaluation resizes the whole image to the crop size.
    "bit-hyperrule": dict(
        model="BiT-R50x1", image_size=384, optimizer="sgd", lr=0.003, momentum=0.9, weight_decay=0.0,
        warmup=500, decay="step", lr_drops=(0.3, 0.6, 0.9), grad_clip=0.0, dropout=None, loss="softmax",
        batch_size=512, steps=10_000, mixup=0.1, flip=True, eval_every=1000, log_every=50,
        train_crop="resize-random-crop", eval_resize="official",
        auto=("steps", "warmup", "lr_drops", "mixup", "image_size", "dropout"),
    ),
    # Appendix B.1.2: ViT-B/16, 1M steps at batch 4096, Adam lr 2e-4, 10k warm-up, cosine decay.
    "mpp": dict(
        model="ViT-B/16", image_size=224, objective="mpp", mpp_target="mean-color", optimizer="adam", lr=2e-4,
        weight_decay=0.0, betas=(0.9, 0.999), warmup=10_000, decay="cosine", grad_clip=1.0, dropout=0.0,
        batch_size=4096, steps=1_000_000, crop_scale=(0.05, 1.0), flip=True, eval_every=10_000, log_every=50,
        train_crop="inception", eval_resize="official",
    ),
    # The pretrain recipe scaled to a laptop: a 4-layer, 128-wide ViT with 4×4 patches on the 8×8 digits
    # upsampled to 16×16 (16 tokens + class token), cosine decay, 1000 steps of 128 (~90 epochs; its top-1 and
    # time: docs/benchmarks.md, "Default run"). lr 2e-3: with the official (truncated) patch-embedding
    # initialisation, lr 1e-3 ends lower (BENCHMARKS.md "Bounds and choices in the code"). Digits are not
    # mirror-symmetric (no flip), and an inception crop of 5% of an 8×8 image is a blur, so crops keep at least
    # half of the area; boxes are sub-pixel (integer boxes on 8×8 pixels are too coarse). On square digits the
    # official eval resize equals a short-side resize.
    "demo": dict(
        data="digits", model="ViT-Ti/4", model_args={"depth": 4, "width": 128, "num_heads": 4, "mlp_dim": 256},
        image_size=16, optimizer="adam", lr=2e-3, weight_decay=0.05, betas=(0.9, 0.999), warmup=100,
        decay="cosine", grad_clip=1.0, dropout=0.0, loss="softmax", label_smoothing=0.1, batch_size=128,
        steps=1000, crop_scale=(0.5, 1.0), flip=False, eval_every=250, log_every=50,
        train_crop="inception-subpixel", eval_resize="official",
    ),
    # AugReg's seven pre-training augmentation levels and DeiT's ImageNet-1k recipe (values and sources:
    # vitlab.train.recipes).
    **AUGREG_RECIPES,
    "deit": DEIT_RECIPE,
}
DEFAULT_RECIPE = {"train": "demo", "finetune": "finetune"}  # the recipe of a verb run without --recipe

# Paper Section 4.1: ImageNet-21k has 14M images, JFT 303M; ILSVRC-2012 has 1,281,167 training images.
EPOCHS: dict[str, tuple[int, int]] = {
    "pretrain": (90, 14_000_000),
    "pretrain-i1k": (300, 1_281_167),
    "pretrain-jft": (7, 303_000_000),
    **AUGREG_EPOCHS,
}

_UPSTREAM = ("sigmoid cross-entropy summed over classes, head bias −10 and a model-wide `pre_logits` layer "
             "(Dense + tanh) as the released upstream models (github.com/google-research/vision_transformer/issues/2 "
             "and /issues/34; big_vision "
             "configs/vit_i21k.py: loss sigmoid_xent, init_head_bias −10); linear decay to 1e-5 (vit_jax "
             "create_learning_rate_schedule, linear_end)")

RECIPE_SOURCES: dict[str, str] = {
    "pretrain": ("paper Table 3, row ViT-B/{16,32} ImageNet-21k: 90 epochs, lr 1e-3, linear decay, weight decay "
                 "0.03, dropout 0.1; Section 4.1 and Appendix B.1: Adam β 0.9/0.999, batch 4096, 10k warm-up "
                 "steps, global-norm clipping 1; " + _UPSTREAM),
    "pretrain-i1k": ("paper Table 3, row ViT-* ImageNet: 300 epochs, lr 3e-3, cosine decay, weight decay 0.3, "
                     "dropout 0.1; Section 4.1 and Appendix B.1: Adam, batch 4096, 10k warm-up, clipping at "
                     "global norm 1 (stated for ImageNet); softmax cross-entropy with the `pre_logits` layer as "
                     "big_vision configs/vit_i1k.py (loss softmax_xent, rep_size=True)"),
    "pretrain-jft": ("paper Table 3, rows JFT-300M: ViT-B/{16,32} 7 epochs lr 8e-4, ViT-L/32 7 epochs 6e-4, "
                     "ViT-L/16 7 epochs 4e-4 (14 for the headline run), ViT-H/14 14 epochs 3e-4, R50+ViT-B/{16,32} "
                     "8e-4, R50+ViT-L/32 2e-4; linear decay, weight decay 0.1, dropout 0; Appendix B.1: Adam, "
                     "batch 4096, 10k warm-up; " + _UPSTREAM),
    "finetune": ("paper Table 4 and Appendix B.1.1: SGD momentum 0.9, no weight decay, cosine decay, batch 512, "
                 "clipping at global norm 1, resolution 384; CIFAR-10/100 10k steps, lr from {0.001, 0.003, "
                 "0.01, 0.03}; dropout of the official vit_jax model configs"),
    "bit-hyperrule": ("BiT-HyperRule (Kolesnikov et al. 2020, Section 3.3; big_transfer bit_hyperrule.py): SGD "
                      "0.9, lr 0.003, batch 512, step decay ×0.1, steps/warm-up/MixUp/resolution by dataset size"),
    "mpp": ("paper Section 4.6 and Appendix B.1.2: masked patch prediction, ViT-B/16, 1M steps at batch 4096, "
            "Adam lr 2e-4, 10k warm-up, cosine decay"),
    "demo": "vitlab's laptop scale-down of the pre-training recipe (embedded digits; not a paper row)",
    **AUGREG_SOURCES,
}

# Paper Table 3: the JFT-300M rows, keyed by the registry name of the row's model. The recipe's own values are
# the ViT-B row, which other models (Ti, S, B/8, …, not in the table) also get.
_JFT_14_EPOCHS = 14 * 303_000_000 // 4096
MODEL_ROWS: dict[str, dict[str, dict[str, Any]]] = {
    "pretrain-jft": {
        "ViT-L/32": dict(lr=6e-4),
        "ViT-L/16": dict(lr=4e-4),
        "ViT-H/14": dict(lr=3e-4, steps=_JFT_14_EPOCHS),
        "R50+ViT-L/32": dict(lr=2e-4),
    },
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    if isinstance(value, tuple):
        return " ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def recipe_record(name: str) -> dict[str, Any]:
    """One recipe as plain data: its values, the per-model rows, what it resolves later, its source."""
    values = dict(RECIPES[name])
    record: dict[str, Any] = {"name": name, "values": values, "auto": list(values.pop("auto", ())),
                              "source": RECIPE_SOURCES.get(name, "not recorded")}
    if name in MODEL_ROWS:
        record["by_model"] = MODEL_ROWS[name]
    if name in EPOCHS:
        record["epochs"], record["images"] = EPOCHS[name]
    return record


def describe_recipe(name: str) -> str:
    """A few lines for a terminal: values, per-model rows, settings resolved later, source."""
    r = recipe_record(name)
    lines = [_wrap(f"recipe {name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in r["values"].items()))]
    if "epochs" in r:
        batch = r["values"]["batch_size"]
        lines.append(f"  steps {r['values']['steps']:,} = {r['epochs']} epochs × {r['images']:,} images / batch "
                     f"{batch:,}")
    for model, row in r.get("by_model", {}).items():
        lines.append(f"  with --model {model}: {_fmt(row)}")
    if r["auto"]:
        lines.append(f"  resolved from the model or data unless given: {', '.join(r['auto'])}")
    lines.append(_wrap(f"  source: {r['source']}"))
    return "\n".join(lines)


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=110, subsequent_indent="    ", break_on_hyphens=False)

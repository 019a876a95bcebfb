"""The AugReg pre-training recipes (Steiner et al. 2021, "How to train your ViT?") and DeiT's ImageNet-1k recipe
(Touvron et al. 2021, Table 9), as plain TrainConfig values with their sources.

AugReg trains every model with the same optimiser and schedule and varies the augmentation along one axis,
seven settings from `none` to `heavy2`: RandAugment with 2 operations at magnitude m and MixUp with α
(big_vision `configs/vit_i21k.py` and `configs/vit_i1k.py`, RANDAUG_DEF and MIXUP_DEF, where `heavy` is named
`strong`). Regularisation is a separate axis of the study: dropout and stochastic depth both 0 or both 0.1 (§3.3;
the checkpoint names' `do_0.1-sd_0.1`). The recipes take 0 (most released checkpoints, e.g. B/16
`aug_medium1-wd_0.1-do_0.0-sd_0.0`); `--dropout 0.1 --drop-path-rate 0.1` gives the regularised runs (L/16's).
The weight decay 0.1 is AugReg's, applied as vitlab's (and vit_jax's) decoupled decay times the learning rate:
big_vision's absolute `wd = 0.0001` = 0.1 × lr 0.001.
"""

from __future__ import annotations

from typing import Any

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


RECIPE_SOURCES: dict[str, str] = {
    **{f"augreg-{level}": _source(level) for level in AUGREG_LEVELS},
    "deit": ("Touvron et al. 2021 (DeiT) Table 9, DeiT-B: AdamW lr 5e-4 × batch/512 (batch 1024), weight decay "
             "0.05, 300 epochs, 5 warm-up epochs, cosine, label smoothing 0.1, dropout 0, stochastic depth 0.1, "
             "RandAugment 9/0.5, MixUp 0.8, CutMix 1.0, random erasing 0.25, no clipping; not reproduced: "
             "repeated augmentation, bicubic resizing, the 1e-5 floor of the cosine"),
}

EPOCHS: dict[str, tuple[int, int]] = {
    **{f"augreg-{level}": (300, 14_000_000) for level in AUGREG_LEVELS},
    "deit": (300, 1_281_167),
}

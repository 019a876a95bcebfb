"""Defaults that follow the user's data when the recipe was written for other data.

- `vitlab train --data FOLDER` without `--recipe`: the default recipe is the digits demo (16 px, 1,438 images).
  On other data the resolution and model follow the images, as BiT-HyperRule picks the resolution from the image
  size (Kolesnikov et al. 2020 §3.3: below 96×96 pixels a small resolution, else a large one): images under
  96×96 keep about their own size (rounded up to a multiple of 8, 16-64 px) with the demo's 4-layer, 128-wide ViT
  on 4×4 patches; larger images train at 224 px, the paper's pre-training resolution, with the same trunk on
  16×16 patches (196 tokens, as ViT-*/16). The schedule keeps the demo's ~89 epochs (1,000 steps of 128 on
  1,438 images): batch the largest power of two up to 128 and 1/8 of the images, at most 10,000 steps, warm-up
  10% and an evaluation every quarter, as the demo.
- `vitlab finetune` (recipe `finetune`: paper Table 4's 10,000 steps of 512 at 384 px, CIFAR's row) on another
  dataset: the step count of Table 4's row for a dataset of that size, as BiT-HyperRule's buckets (under 20k
  images: 500 steps as Pets and Flowers; under 500k: 10,000 as CIFAR; else 20,000 as ImageNet), at most the
  epochs of the Flowers row (500 steps of 512 on 1,020 images: 250 epochs), batch the largest power of two up to
  512 and the training images, warm-up 20% of the steps for the short schedule (100 of 500, big_vision
  configs/transfer.py) and 500 steps otherwise (vit_jax configs/common.py).

A value given after the recipe (weights, preset, config file, flag) is never replaced; the rule's line in the
banner says what it chose and from what.
"""

from __future__ import annotations

import math
from typing import Any

from vitlab.data import DataError, build_datasets
from vitlab.train.presets import LARGE_DATASET, SMALL_DATASET, SMALL_IMAGES, typical_image_size

DEMO_DATA = "digits"
DEMO_TRUNK = {"depth": 4, "width": 128, "num_heads": 4, "mlp_dim": 256}  # the demo recipe's model arguments
DEMO_EPOCHS = 1000 * 128 / 1438  # the demo: 1,000 steps of 128 on digits' 1,438 training images
FLOWERS_EPOCHS = 500 * 512 / 1020  # Table 4's Oxford Flowers-102 row: 500 steps of 512 on 1,020 images
SCRATCH_FIELDS = ("model", "model_args", "image_size", "batch_size", "steps", "warmup", "eval_every", "train_crop",
                  "crop_scale", "flip")
# Above 96×96 the demo's digit-specific pre-processing (sub-pixel crops of at least half the image, no flip) gives
# way to the official one: TF's inception crop of 5-100% of the area and a random flip (vit_jax input_pipeline).
OFFICIAL_CROP = dict(train_crop="inception", crop_scale=(0.05, 1.0), flip=True)
FINETUNE_FIELDS = ("batch_size", "steps", "warmup")


def _pow2_at_most(n: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(n, 1)))))


def scratch_defaults(num_images: int, image_hw: tuple[int, int], image_size: int | None = None,
                     steps: int | None = None) -> tuple[dict[str, Any], str]:
    """The demo recipe scaled to a training set of `num_images` images of about `image_hw` pixels, and why.
    `image_size` / `steps`: values given by the user, which the patch size / warm-up then follow."""
    h, w = image_hw
    if image_size is not None:
        size, why = image_size, "given"
    elif h * w < SMALL_IMAGES:
        size, why = min(64, max(16, -(-min(h, w) // 8) * 8)), f"images {h}×{w} < 96×96: about their own size"
    else:
        size, why = 224, f"images {h}×{w} >= 96×96: the paper's 224"
    patch = 4 if size < 96 else 16
    batch = min(128, _pow2_at_most(num_images / 8))
    steps_given = steps is not None
    steps = steps if steps_given else max(50, min(10_000, round(DEMO_EPOCHS * num_images / batch)))
    values = dict(model=f"ViT-Ti/{patch}", model_args=dict(DEMO_TRUNK), image_size=size, batch_size=batch,
                  steps=steps, warmup=steps // 10, eval_every=max(1, steps // 4))
    crop = "the demo's crops"
    if size >= 96:
        values.update(OFFICIAL_CROP)
        crop = "the official inception crop and flip"
    schedule = (f"batch {batch}, steps as given" if steps_given  # by --steps, or --epochs after this rule
                else f"{steps:,} steps of {batch} (the demo's ~{DEMO_EPOCHS:.0f} epochs)")
    note = (f"{size} px ({why}), the demo's 4×128 ViT on {patch}×{patch} patches, {crop}; {num_images:,} images → "
            f"{schedule}")
    return values, note


def finetune_defaults(num_images: int) -> tuple[dict[str, Any], str]:
    """Paper Table 4's fine-tuning schedule for a training set of `num_images` images, and why."""
    if num_images < SMALL_DATASET:
        bucket, row = 500, "< 20k images: 500 steps (Pets, Flowers rows)"
    elif num_images < LARGE_DATASET:
        bucket, row = 10_000, "< 500k images: 10,000 steps (CIFAR rows)"
    else:
        bucket, row = 20_000, ">= 500k images: 20,000 steps (ImageNet row)"
    batch = min(512, _pow2_at_most(num_images))
    steps = max(1, min(bucket, math.ceil(FLOWERS_EPOCHS * num_images / batch)))
    warmup = round(0.2 * steps) if bucket == 500 else min(500, steps // 5)
    capped = f", capped at {FLOWERS_EPOCHS:.0f} epochs (Flowers row)" if steps < bucket else ""
    note = f"{num_images:,} images {row}{capped} → {steps:,} steps of {batch}, warm-up {warmup:,}"
    return dict(batch_size=batch, steps=steps, warmup=warmup), note


def _given_data(layers: Any) -> bool:
    source = layers.sources["data"]
    return source == "flag" or source.startswith("config ")


def follow_data(layers: Any, recipe: str, data: Any) -> Any:
    """Apply the rule for `recipe` (see the module docstring) to the values no later layer set; returns the
    Datasets when it had to build them."""
    v = layers.values
    if recipe == "demo" and layers.sources["recipe"] == "recipe demo" and not v["init"]:
        fields, rule = SCRATCH_FIELDS, "scratch"
        if v["data"] == DEMO_DATA or not _given_data(layers):
            return data
    elif recipe == "finetune" and _given_data(layers):
        fields, rule = FINETUNE_FIELDS, "finetune"
    else:
        return data
    todo = [k for k in fields if not layers.given_after(k, recipe)]
    if rule == "scratch" and "model" not in todo:  # a model the user chose keeps its own arguments
        todo = [k for k in todo if k != "model_args"]
    if "steps" not in todo:  # given steps: warm-up and evaluations follow them as for the recipe (resolve's rules)
        todo = [k for k in todo if k not in ("warmup", "eval_every")]
    if not todo:
        return data
    try:
        data = data or build_datasets(v["data"], v["val_fraction"], v["strict"])
    except DataError:  # unusable as it is (no val/ split, …): whoever needs the data says why, in its own words
        return None
    n = len(data.train)
    if rule == "scratch":
        given_size = None if "image_size" in todo else v["image_size"]
        chosen, note = scratch_defaults(n, typical_image_size(data.train), given_size,
                                        None if "steps" in todo else v["steps"])
    else:
        chosen, note = finetune_defaults(n)
    source = f"data rule on {n:,} training images (recipe {recipe} was written for other data)"
    layers.apply({k: chosen[k] for k in todo if k in chosen}, source)
    kept = [k for k in fields if k not in todo and k in chosen]
    layers.notes.append(f"{recipe} on {v['data']}: {note}" + (f"; as given: {', '.join(kept)}" if kept else ""))
    return data

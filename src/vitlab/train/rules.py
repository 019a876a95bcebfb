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
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitlab.data import DataError, build_datasets
from vitlab.errors import setting
from vitlab.models.config import ViTConfig
from vitlab.models.registry import model_config
from vitlab.runtime.attention import config_attention
from vitlab.runtime.precision import training_precision
from vitlab.train.finetune import frozen_backbone_settings
from vitlab.train.recipes import (
    BIT_DATA_FIELDS,
    EPOCHS,
    FINETUNE_PRESETS,
    LARGE_DATASET,
    MODEL_ROWS,
    RECIPES,
    SMALL_DATASET,
    SMALL_IMAGES,
    finetune_dropout,
    hyperrule_from_data,
    typical_image_size,
)

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


# --------------------------------------------------------------------------------------------------------------
# A run's length in epochs: `--epochs N` on any recipe, and the warning for a schedule out of proportion to the
# data.
#
# - `--epochs N` sets the steps from the training set and the global batch: ceil(N × images / batch), the
#   training images counted after `--val-fraction` holds its share out. Every step is a whole batch (the loader
#   draws batches from a reshuffled stream: no step sees fewer images, no image is skipped): 1 epoch of 80 images
#   at batch 32 is 3 steps, 1.2 epochs, and the source line says so. The recipe's warm-up keeps its share of the
#   schedule (vitlab.train.resolve's warm-up rule), so DeiT's 5 warm-up epochs of 300 stay 1/60 of the run.
#   `--epochs` and `--steps` both set the length: given together they are refused.
# - A recipe's step count stands for epochs of the dataset it was written for (DeiT: 300 epochs of ImageNet-1k's
#   1,281,167 images at batch 1,024). On other data those steps are other epochs: `--recipe deit` on 240 photos plans
#   375,341 steps = 1.6 million epochs. Where the steps came from a recipe or preset (not a flag, not a rule that
#   followed the data) and amount to more than `OUT_OF_PROPORTION` times the epochs they stand for, or less than a
#   `OUT_OF_PROPORTION`-th of them, the banner and `--print-config` say so in one line with the `--epochs` fix.

OUT_OF_PROPORTION = 10  # the factor between planned epochs and the epochs a recipe's steps stand for
FLAG = "flag --epochs"  # the source of steps --epochs sets (a flag: the warm-up rule keeps the warm-up's share)
# What the other recipes' and presets' steps stand for (recipes.EPOCHS has the pre-training recipes): training-set
# sizes of the dataset each was written for, at its own steps and batch.
RECIPE_IMAGES = {"finetune": 50_000,  # paper Table 4's CIFAR rows: 10k steps of 512 = 102 epochs
                 "mpp": 303_000_000,  # Appendix B.1.2: 1M steps of 4096 on JFT-300M, 13.5 epochs
                 "demo": 1_438}  # digits' training split: 1,000 steps of 128 = 89 epochs
PRESET_IMAGES = {"imagenet": 1_281_167, "cifar10": 50_000, "cifar100": 50_000, "pets": 3_680, "flowers": 1_020,
                 "vtab": 1_000}  # paper Table 4's datasets (VTAB-1k: 800 train + 200 val images per task)


def check_epochs(flags: dict[str, Any]) -> float | None:
    """`--epochs` taken out of the flags (None: not given); one line if it is not a positive number or comes
    with `--steps`."""
    epochs = flags.pop("epochs", None)
    if epochs is None:
        return None
    if isinstance(epochs, bool) or not isinstance(epochs, int | float) or not math.isfinite(epochs) or epochs <= 0:
        raise ValueError(f"{setting('epochs')} must be a positive number, got {epochs}")
    if flags.get("steps") is not None:
        raise ValueError(f"{setting('epochs', value=epochs)} and {setting('steps', value=flags['steps'])} both set "
                         "the run's length; pass one")
    return float(epochs)


def steps_for(epochs: float, images: int, batch: int) -> int:
    """The optimiser steps that take `epochs` passes over `images` training images at a global `batch`."""
    return max(1, math.ceil(epochs * images / batch - 1e-9))  # 1e-9: 30 × 240 / 32 is 225, not 226


def apply_epochs(layers: Any, epochs: float | None, data: Any) -> Any:
    """Set the steps from `--epochs` once the batch is decided (resolve's layers); returns the Datasets (built
    here when no rule needed them: a split the run would refuse is refused now, in the run's words)."""
    if epochs is None:
        return data
    v = layers.values
    data = data or build_datasets(v["data"], v["val_fraction"], v["strict"])
    images, batch = len(data.train), v["batch_size"]
    steps = steps_for(epochs, images, batch)
    whole = steps * batch / images
    rounded = "" if math.isclose(whole, epochs) else f", rounded up to whole batches: {whole:.3g} epochs"
    layers.apply({"steps": steps}, f"{FLAG} {epochs:g}: {images:,} training images / batch {batch:,}{rounded}")
    return data


# --------------------------------------------------------------------------------------------------------------
# Short runs you can watch. A recipe's intervals are written for its own length (1,000 steps between evaluations,
# 50 between log lines): a 10-step run would log once and validate only at its end. Unless the user chose them (a
# flag or a --config file), they follow the run instead:
#
# - with --epochs, validation once per epoch (each validation also saves a checkpoint unless --save-every is set);
# - a log line at least every tenth of the run: log_every at most steps // 10 (1 for runs under 20 steps).
#
# Each is recorded with the rule as its source, which the banner and --print-config show.

LOG_LINES = 10  # log lines a run shows at least, when the user did not set --log-every


def user_set(source: str) -> bool:
    """Whether a value's source is the user's: a flag (or keyword) or a --config file."""
    return source.startswith(("flag", "config "))


def interval_rules(layers: Any, epochs: float | None, data: Any) -> None:
    """eval_every and log_every scaled to the run's length when the user did not set them (see above); `data`: the
    Datasets (built by `apply_epochs` when `epochs` is given)."""
    v, s = layers.values, layers.sources
    steps, batch = v["steps"], v["batch_size"]
    if epochs is not None and data is not None and not user_set(s["eval_every"]):
        per_epoch = steps_for(1, len(data.train), batch)
        if per_epoch < steps and v["eval_every"] != per_epoch:
            layers.apply({"eval_every": per_epoch}, f"{FLAG} {epochs:g}: once per epoch ({len(data.train):,} "
                                                    f"training images / batch {batch:,})")
    most = max(1, steps // LOG_LINES)
    if not user_set(s["log_every"]) and v["log_every"] > most:
        layers.apply({"log_every": most}, f"a tenth of the run's {steps:,} steps ({s['log_every']} says "
                                          f"{v['log_every']:,})")


def mark_given(layers: Any, epochs: float | None) -> None:
    """Before the data rules: steps are the user's (--epochs), so no rule chooses them (nor, from them, the
    warm-up and evaluation interval a rule derives)."""
    if epochs is not None:
        layers.sources["steps"] = FLAG


# --------------------------------------------------------------------------------------------------------------
# The rules, applied once the layers are merged (vitlab.train.resolution), in this order: the run folder; the
# settings a recipe leaves to the model (a Table 3 row, a `pre_logits` as wide as the model, the official fine-tuning
# dropout); the data (a recipe written for other data, --epochs, BiT-HyperRule); the warm-up; the intervals; a frozen
# backbone's settings; the precision and attention `auto` choices. A value a layer after the recipe chose is never
# replaced; each rule's value is recorded with the rule as its source.

def apply_rules(layers: Any, recipe: str, epochs: float | None, data: Any, checkpoint: Any) -> Any:
    """Apply the rules (above) to the merged `layers` of a run of `recipe`; `checkpoint`: the initial weights' record
    (None from scratch). Returns the Datasets when a rule needed them (`data`: built already, or None)."""
    auto = tuple(RECIPES[recipe].get("auto", ()))
    mark_given(layers, epochs)
    if "out" not in layers.values or layers.sources["out"] == "default":
        layers.apply({"out": f"runs/{recipe}-{time.strftime('%Y%m%d-%H%M%S')}"}, "default (recipe and time)")
    _model_rules(layers, recipe, auto, checkpoint)
    data = follow_data(layers, recipe, data)  # a recipe written for other data: steps, size from it
    data = apply_epochs(layers, epochs, data)  # after the batch is decided, before BiT-HyperRule's warm-up
    data = _data_rules(layers, recipe, auto, data)
    _warmup_rule(layers, recipe)
    interval_rules(layers, epochs, data)
    for key, (value, source) in frozen_backbone_settings(layers.values, layers.sources).items():
        layers.apply({key: value}, source)
    _precision_rule(layers, checkpoint)
    _attention_rule(layers, checkpoint)
    if checkpoint is not None:
        _note_resolution_change(layers, checkpoint)
    return data


def _note_resolution_change(layers: Any, checkpoint: Any) -> None:
    native, size = checkpoint.config.image_size, layers.values["image_size"]
    if native != (size, size):
        how = ("the position embedding is resampled (bilinear, corners aligned, paper Section 3.2)"
               if isinstance(checkpoint.config, ViTConfig) else "a CNN takes any size")
        layers.notes.append(f"fine-tuning at {size}×{size} px ({layers.sources['image_size']}); the weights were "
                            f"trained at {native[0]}×{native[1]}: {how}")


def _model_rules(layers: Any, recipe: str, auto: tuple[str, ...], checkpoint: Any) -> None:
    """A recipe's settings that depend on the model, unless a later layer set them."""
    todo = [k for k in auto if not layers.given_after(k, recipe)]
    name = str(layers.values["model"]).removesuffix("-gap")
    row = MODEL_ROWS.get(recipe, {}).get(name, {})
    for key in todo:
        if key in row:
            layers.apply({key: row[key]}, f"recipe {recipe}, paper Table 3 row {name}")
    if "representation_size" in todo:
        width = None if checkpoint is not None else _width(layers.values)
        layers.apply({"representation_size": width}, f"recipe {recipe}: as wide as the model")
    if "dropout" in todo and _is_vit(layers.values, checkpoint):
        layers.apply({"dropout": finetune_dropout(name)}, f"recipe {recipe}: official config of {name}")


def _is_vit(values: Mapping[str, Any], checkpoint: Any) -> bool:
    return isinstance(checkpoint.config, ViTConfig) if checkpoint is not None else _width(values) is not None


def _width(values: Mapping[str, Any]) -> int | None:
    config = model_config(values["model"], **values.get("model_args", {}))
    return config.width if isinstance(config, ViTConfig) else None  # a BiT has no representation layer


def _data_rules(layers: Any, recipe: str, auto: tuple[str, ...], data: Any) -> Any:
    """BiT-HyperRule: steps, warm-up, decay points, MixUp and resolution from the training set; the datasets
    are returned for the loop to reuse."""
    by_model = {k for row in MODEL_ROWS.get(recipe, {}).values() for k in row}  # a model rule's fields
    todo = tuple(k for k in auto if k in BIT_DATA_FIELDS and k not in by_model and not layers.given_after(k, recipe))
    if not todo:
        return data
    v = layers.values
    data = data or build_datasets(v["data"], v["val_fraction"], v["strict"])
    chosen, message = hyperrule_from_data(data, todo, v)
    layers.apply(chosen, f"recipe {recipe}: BiT-HyperRule on {len(data.train):,} training images")
    layers.notes.append(f"{recipe}: {message}")
    return data


def _warmup_rule(layers: Any, recipe: str) -> None:
    """A warm-up must end before the run does. One the recipe (or preset) chose for its own step count keeps
    its share of the steps when --steps changes them; one typed as a flag is refused if it does not fit."""
    v, s = layers.values, layers.sources
    warmup, steps = v["warmup"], v["steps"]
    if s["warmup"] == "flag" and warmup >= steps > 1:
        raise ValueError(f"{setting('warmup', value=warmup)} is not below {setting('steps', value=steps)}: the "
                         f"learning rate would still be rising when the run ends; lower {setting('warmup')} "
                         f"(e.g. {steps // 10})")
    chosen_steps = s["steps"].startswith(("flag", "preset ", "config "))  # "flag --epochs 30 (…)" too
    if s["warmup"] in (s["steps"], "flag") or not warmup or not chosen_steps:
        return
    reference = _steps_of(layers, s["warmup"], recipe)
    if reference is None or reference == steps:
        return
    scaled = round(warmup * steps / reference)
    layers.notes.append(f"warm-up {warmup:,} of {reference:,} steps ({s['warmup']}) scaled to {scaled:,} of "
                        f"{steps:,} (the same {100 * warmup / reference:.3g}%); pass --warmup to set it")
    layers.apply({"warmup": scaled}, f"{s['warmup']}, scaled to the steps")


def _precision_rule(layers: Any, checkpoint: Any) -> None:
    """--precision auto decided once, by vitlab.runtime.precision's measured rule: config.json records the choice with
    the rule's reason as its source, and a resumed run keeps it on any machine."""
    v = layers.values
    if v["precision"] == "auto":
        chosen = training_precision(_run_model_config(v, checkpoint), v["device"])
        layers.apply({"precision": chosen.name}, chosen.reason)


def _attention_rule(layers: Any, checkpoint: Any) -> None:
    """--attention auto decided once the precision is, by vitlab.runtime.attention's measured rule for the model,
    the device and the micro-batch each process computes (torchrun's WORLD_SIZE); config.json records the choice
    with the rule's reason as its source."""
    v = layers.values
    if v["attention"] == "auto":
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        batch = max(1, v["batch_size"] // (max(v["accum"], 1) * max(world, 1)))
        chosen = config_attention("auto", _run_model_config(v, checkpoint), v["device"], v["precision"], batch)
        layers.apply({"attention": chosen.name}, chosen.reason)


def _run_model_config(v: Mapping[str, Any], checkpoint: Any) -> Any:
    """The model as the run builds it, at the run's image size (its token count): what the measured rules read."""
    size = {"image_size": v["image_size"]} if v.get("image_size") else {}
    if checkpoint is None:
        return model_config(v["model"], **size, **v["model_args"])
    if isinstance(checkpoint.config, ViTConfig):
        return checkpoint.config.replace(**size)
    return checkpoint.config


def _steps_of(layers: Any, source: str, recipe: str) -> int | None:
    """The step count of the layer that chose the warm-up."""
    if source.startswith("preset "):
        return FINETUNE_PRESETS[source.removeprefix("preset ")].values.get("steps")
    if source == f"recipe {recipe}":  # not a rule's value ("recipe X: BiT-HyperRule …"): that one fits already
        return RECIPES[recipe].get("steps")
    return None


def steps_on_resume(record: dict[str, Any], epochs: float, path: Path) -> int:
    """`--epochs` on `--resume`: the steps of that many epochs of the stored run (its recorded training images
    and batch; `record`: its config.json, `path`), which the resumed run extends its schedule to as with `--steps`."""
    try:
        images, batch = int(record["train_images"]), int(record["batch_size"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{setting('epochs')} with {setting('resume')}: {path} does not record the run's training "
                         f"images and batch; pass {setting('steps')} instead") from None
    return steps_for(epochs, images, batch)


def schedule_line(cfg: Any, source: str, images: int) -> str:
    """The schedule in steps and epochs: what the banner and `--print-config` show."""
    epochs = cfg.steps * cfg.batch_size / max(images, 1)
    return (f"schedule {cfg.steps:,} steps of {cfg.batch_size:,} images = {_epochs(epochs)} epochs of {images:,} "
            f"training images ({source})")


def proportion_warning(cfg: Any, source: str, images: int) -> str | None:
    """One line when steps a recipe or preset chose are far out of proportion to this training set (see the
    module doc), None otherwise."""
    reference = _written_for(source)
    if reference is None or images < 1:
        return None
    written, batch = reference
    intended = cfg.steps * batch / written  # the epochs these steps stand for on the data they were written for
    planned = cfg.steps * cfg.batch_size / images
    if intended / OUT_OF_PROPORTION <= planned <= intended * OUT_OF_PROPORTION:
        return None
    epochs = _suggestion(intended)
    return (f"{source} plans {cfg.steps:,} steps of {cfg.batch_size:,} = {_epochs(planned)} epochs of these "
            f"{images:,} training images (written for {_epochs(intended)} epochs of {written:,}); pass --epochs N "
            f"to fit the schedule to this data, e.g. --epochs {epochs:g} "
            f"({steps_for(epochs, images, cfg.batch_size):,} steps)")


def _written_for(source: str) -> tuple[int, int] | None:
    """(training images, batch) of the data the steps of `source` were written for; None when the steps were
    the user's or a rule chose them from this data."""
    if source.startswith("preset "):
        name = source.removeprefix("preset ")
        return PRESET_IMAGES[name], FINETUNE_PRESETS[name].settings()["batch_size"]
    if not source.startswith("recipe ") or ":" in source:  # "recipe X: BiT-HyperRule on …": chosen from the data
        return None
    name = source.removeprefix("recipe ").split(",")[0]  # "recipe pretrain-jft, paper Table 3 row ViT-H/14"
    images = EPOCHS[name][1] if name in EPOCHS else RECIPE_IMAGES.get(name)
    return (images, RECIPES[name]["batch_size"]) if images else None


def _suggestion(epochs: float) -> float:
    return float(round(epochs)) if epochs >= 10 else float(f"{epochs:.2g}")


def _epochs(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"

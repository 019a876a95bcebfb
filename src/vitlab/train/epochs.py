"""A run's length in epochs: `--epochs N` on any recipe, and the warning for a schedule out of proportion to the
data.

- `--epochs N` sets the steps from the training set and the global batch: ceil(N × images / batch), the
  training images counted after `--val-fraction` holds its share out. The recipe's warm-up keeps its share of the
  schedule (vitlab.train.resolve's warm-up rule), so DeiT's 5 warm-up epochs of 300 stay 1/60 of the run.
  `--epochs` and `--steps` both set the length: given together they are refused.
- A recipe's step count stands for epochs of the dataset it was written for (DeiT: 300 epochs of ImageNet-1k's
  1,281,167 images at batch 1,024). On other data those steps are other epochs: `--recipe deit` on 240 photos plans
  375,341 steps = 1.6 million epochs. Where the steps came from a recipe or preset (not a flag, not a rule that
  followed the data) and amount to more than `OUT_OF_PROPORTION` times the epochs they stand for, or less than a
  `OUT_OF_PROPORTION`-th of them, the banner and `--print-config` say so in one line with the `--epochs` fix.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vitlab.data import build_datasets
from vitlab.train.presets import FINETUNE_PRESETS
from vitlab.train.recipes import EPOCHS, RECIPES

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
        raise ValueError(f"--epochs must be a positive number, got {epochs}")
    if flags.get("steps") is not None:
        raise ValueError(f"--epochs {epochs:g} and --steps {flags['steps']} both set the run's length; pass one")
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
    layers.apply({"steps": steps}, f"{FLAG} {epochs:g}: {images:,} training images / batch {batch:,}")
    return data


def mark_given(layers: Any, epochs: float | None) -> None:
    """Before the data rules: steps are the user's (--epochs), so no rule chooses them (nor, from them, the
    warm-up and evaluation interval a rule derives)."""
    if epochs is not None:
        layers.sources["steps"] = FLAG


def steps_on_resume(run: Path, epochs: float) -> int:
    """`--epochs` on `--resume`: the steps of that many epochs of the stored run (its recorded training images
    and batch), which the resumed run extends its schedule to as with `--steps`."""
    try:
        record = json.loads((run / "config.json").read_text())
        images, batch = int(record["train_images"]), int(record["batch_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"--epochs with --resume: {run / 'config.json'} does not record the run's training images "
                         "and batch; pass --steps instead") from None
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

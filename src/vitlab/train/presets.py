"""Fine-tuning settings that depend on the dataset or the model, as data with their source.

- `FINETUNE_PRESETS`: the paper's per-dataset fine-tuning (Table 4, Appendix B.1.1), chosen with `--preset`
  on top of a recipe: step count, learning-rate sweep and the share of train held out as the dev split that
  chooses the learning rate.
- BiT-HyperRule (Kolesnikov et al. 2020, Section 3.3): step count, warm-up, resolution and MixUp chosen from
  the training set's size and image size once the data is known (`resolve_from_data`).
- The dropout of fine-tuning: the official model configs' `dropout_rate` (`finetune_dropout`).

A recipe names the settings it leaves to the data or model in its `auto` entry; the resolution step
(vitlab.train.resolve) fills in only those no later layer (initial weights, preset, config file, flag) set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vitlab.data.sources import DECODE_ERRORS

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
    """(height, width) of the median-area image among up to `probe` images spread over the split (file headers
    only: nothing is decoded)."""
    if split.arrays is not None:
        return int(split.arrays.shape[1]), int(split.arrays.shape[2])
    from PIL import Image

    n, m = len(split), min(probe, len(split))
    sizes = []
    for i in sorted({k * n // m for k in range(m)}):
        try:
            with Image.open(split.encoded(i)) as img:
                sizes.append((img.height, img.width))
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

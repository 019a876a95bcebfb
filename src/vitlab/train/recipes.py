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
from typing import Any

from vitlab.train.recipes_augreg import AUGREG_RECIPES, DEIT_RECIPE
from vitlab.train.recipes_augreg import EPOCHS as AUGREG_EPOCHS
from vitlab.train.recipes_augreg import RECIPE_SOURCES as AUGREG_SOURCES

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
    # and resolution follow from the training set (`auto`, vitlab.train.presets.hyperrule); the whole image
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
    # upsampled to 16×16 (16 tokens + class token), cosine decay, 1000 steps of 128 (~90 epochs): 97.8-98.6%
    # test top-1 over seeds 0-2 in about 2 minutes on 2 CPU cores. lr 2e-3: with the official (truncated)
    # patch-embedding initialisation, lr 1e-3 gave 96.9-97.5%. Digits are not mirror-symmetric (no flip), and
    # an inception crop of 5% of an 8×8 image is a blur, so crops keep at least half of the area; boxes are
    # sub-pixel (integer boxes on 8×8 pixels are too coarse). On square digits the official eval resize is the
    # short-side resize the demo used before the choice existed.
    "demo": dict(
        data="digits", model="ViT-Ti/4", model_args={"depth": 4, "width": 128, "num_heads": 4, "mlp_dim": 256},
        image_size=16, optimizer="adam", lr=2e-3, weight_decay=0.05, betas=(0.9, 0.999), warmup=100,
        decay="cosine", grad_clip=1.0, dropout=0.0, loss="softmax", label_smoothing=0.1, batch_size=128,
        steps=1000, crop_scale=(0.5, 1.0), flip=False, eval_every=250, log_every=50,
        train_crop="inception-subpixel", eval_resize="official",
    ),
    # AugReg's seven pre-training augmentation levels and DeiT's ImageNet-1k recipe (values and sources:
    # vitlab.train.recipes_augreg).
    **AUGREG_RECIPES,
    "deit": DEIT_RECIPE,
}

# Paper Section 4.1: ImageNet-21k has 14M images, JFT 303M; ILSVRC-2012 has 1,281,167 training images.
EPOCHS: dict[str, tuple[int, int]] = {
    "pretrain": (90, 14_000_000),
    "pretrain-i1k": (300, 1_281_167),
    "pretrain-jft": (7, 303_000_000),
    **AUGREG_EPOCHS,
}

_UPSTREAM = ("sigmoid cross-entropy summed over classes, head bias −10 and a model-wide `pre_logits` layer "
             "(Dense + tanh) as the released upstream models (vision_transformer issues #2 and #34; big_vision "
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

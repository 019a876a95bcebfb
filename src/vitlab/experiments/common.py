"""What the experiments share: the scale (full or --quick), the three model families at three sizes, the
pre-training and fine-tuning specs, the learning-rate choices, and small statistics helpers.

Everything is at 32×32 px on a 2-core CPU. The families are chosen so that at size M the ViT, the BiT ResNetV2
and the hybrid have parameter counts and multiply-adds within 1.15× of each other by vitlab's own counters
(`model_table`, reported with every result): ViT/4 (8×8 patches of 4 px), a one-stage BiT ResNetV2 (root + 3
units, 8×8 feature map), and the paper's root-only hybrid ("R+ViT-Ti/16": the ResNet root, then 1×1 patches of
its 8×8 map).

Pre-training follows the paper's ImageNet-1k recipe (Table 3: Adam, cosine decay, weight decay 0.3, dropout 0.1,
softmax with a `pre_logits` layer; vitlab recipe `pretrain-i1k`) at a CPU's scale: batch 64, 500 steps, the
warm-up keeping its share of the steps (the resolution step's rule), the learning rate chosen per family from a
small grid on the pre-training set's own validation split. Fine-tuning is the paper's protocol (Table 4, recipe
`finetune`: SGD 0.9, cosine, no weight decay) with the learning rate chosen on a 10% dev split of the digits
training set, once per family (Appendix B.1.1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .runner import Context, Record
from .spec import RunSpec

TUNING_SEED = 0  # learning rates are chosen on seed-0 runs whatever --seeds says, so every choice is shared
FAMILIES = ("ViT", "BiT", "hybrid")
SIZES = ("S", "M", "L")
# 8×8-pixel digits upsampled to 32 px: a 5% inception crop of them is a blur and digits are not mirror-symmetric
# (the demo recipe's reasoning), so crops keep half the area, with sub-pixel boxes, and no flip.
DIGITS_PREPROCESSING = {"train_crop": "inception-subpixel", "crop_scale": [0.5, 1.0], "flip": False}
# Pre-training at this scale (Steiner et al. 2021, "How to train your ViT?": small models on small data want light
# augmentation and regularisation). Crops keep at least half the image (a 5 % crop of a 32-px fractal or glyph is a
# shapeless texture while validation sees the whole image), no dropout, weight decay 0.05 instead of the paper's
# i1k 0.1 and 0.3. The probes found these; the pilot's ablation (experiments/pilot.py) tests each factor.
PRETRAIN_SMALL = {"train_crop": "inception-subpixel", "crop_scale": [0.5, 1.0], "dropout": 0.0, "weight_decay": 0.05}
# Fractal instances are drawn flipped already (a flip is one more instance of the category); a flipped glyph is
# another glyph, so stroke and font glyphs are not flipped, as digits are not.
SOURCE_PREPROCESSING = {"fractal": {"flip": True}, "strokes": {"flip": False}, "fonts": {"flip": False}}


def source_preprocessing(data: str) -> dict[str, Any]:
    """The pre-processing a pre-training source's kind asks for ('strokes:64:1024' -> strokes')."""
    return SOURCE_PREPROCESSING[data.split(":")[0]]


@dataclass(frozen=True)
class Scale:
    name: str  # full or quick
    categories: int  # fractal categories of every pre-training set
    per_class: tuple[int, ...]  # the data-scaling sizes: training images per category
    steps: int  # pre-training steps (every size: more data is more variety, not more compute)
    batch_size: int
    finetune_steps: int
    lrs: tuple[float, ...]  # pre-training learning rates to choose from
    finetune_lrs: tuple[float, ...]  # the paper's fine-tuning grid (Appendix B.1.1), without its smallest
    fewshot_data: tuple[str, ...]
    finetune_data: tuple[str, ...]  # data-scaling fine-tunes on each (the other experiments on the first)
    shots: tuple[int, ...]
    fewshot_seeds: int  # few-shot draws per shot count (big_vision: 3)
    curve_points: int  # checkpoints kept and evaluated per pre-training run
    curve_data: str
    attention_images: int
    workers: int | None  # loader processes (None: the trainer's default)
    image_size: int = 32
    dev_fraction: float = 0.1

    def fractal(self, per_class: int) -> str:
        return f"fractal:{self.categories}:{per_class}"

    @property
    def largest(self) -> str:
        return self.fractal(max(self.per_class))

    def images(self, per_class: int) -> int:
        return self.categories * per_class

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Scale("full", categories=64, per_class=(16, 64, 256, 1024), steps=500, batch_size=64, finetune_steps=100,
             lrs=(3e-4, 1e-3, 3e-3), finetune_lrs=(0.003, 0.01, 0.03), fewshot_data=("digits", "mnist"),
             finetune_data=("digits", "mnist"), shots=(5, 25), fewshot_seeds=3, curve_points=4, curve_data="digits",
             attention_images=128, workers=None)
# The pipeline end to end in seconds per experiment: the same models at 16 px on 16- and 32-image sets, a few steps.
QUICK = Scale("quick", categories=4, per_class=(4, 8), steps=6, batch_size=16, finetune_steps=3, lrs=(1e-3, 3e-3),
              finetune_lrs=(0.01, 0.03), fewshot_data=("digits",), finetune_data=("digits", "mnist"), shots=(5, 25),
              fewshot_seeds=3, curve_points=2, curve_data="digits", attention_images=16, workers=None, image_size=16)
SCALES = {"full": FULL, "quick": QUICK}


def _vit(depth: int, width: int, heads: int) -> tuple[str, dict[str, Any]]:
    return "ViT-Ti/4", {"depth": depth, "width": width, "num_heads": heads, "mlp_dim": 2 * width}


def _hybrid(depth: int, width: int, heads: int) -> tuple[str, dict[str, Any]]:
    # the paper's R+ViT-Ti/16 design (ResNet root only, stride 4) with 1×1 patches of its 8×8 map at 32 px
    name, args = _vit(depth, width, heads)
    return "R+ViT-Ti/16", {**args, "patch_size": 1, "resnet": {"layers": [], "width_factor": 0.5}}


MODELS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("ViT", "S"): _vit(4, 48, 2), ("ViT", "M"): _vit(6, 64, 2), ("ViT", "L"): _vit(8, 96, 3),
    ("BiT", "S"): ("BiT-R50x1", {"layers": [1], "width_factor": 1}),
    ("BiT", "M"): ("BiT-R50x1", {"layers": [3], "width_factor": 1}),
    ("BiT", "L"): ("BiT-R50x1", {"layers": [2], "width_factor": 2}),
    ("hybrid", "S"): _hybrid(4, 48, 2), ("hybrid", "M"): _hybrid(6, 64, 2), ("hybrid", "L"): _hybrid(8, 96, 3),
}


def model_settings(family: str, size: str, **overrides: Any) -> dict[str, Any]:
    name, args = MODELS[(family, size)]
    return {"model": name, "model_args": {**args, **overrides}}


def pretrain(scale: Scale, family: str, size: str, data: str, lr: float, seed: int, *, mpp: bool = False,
             tag: str = "", **model_overrides: Any) -> RunSpec:
    """Supervised (or MPP) pre-training of one model on `data`, the weights of `curve_points` checkpoints kept for
    the transfer curve."""
    settings = {
        **model_settings(family, size, **model_overrides), "data": data, "image_size": scale.image_size,
        "batch_size": scale.batch_size, "steps": scale.steps, "lr": lr, "seed": seed, "eval_every": 0,
        "log_every": max(1, scale.steps // 10), "save_every": max(1, scale.steps // scale.curve_points),
        "keep_last": scale.curve_points, "workers": scale.workers,
        **(DIGITS_PREPROCESSING if data == "digits" else {}),
    }
    kind = "mpp" if mpp else "pre"
    label = f"{kind}-{family}{tag}-{size}-{data}-s{seed}"
    return RunSpec(label, "mpp" if mpp else "pretrain-i1k", settings, curve=True)


def untrained(scale: Scale, family: str, size: str, seed: int) -> RunSpec:
    """The model exactly as pre-training with `seed` initialises it: one step at learning rate 0 of the same
    pre-training run (Adam's update and the decoupled weight decay are both scaled by the learning rate, so the
    weights do not move). The reference a pre-trained representation must beat to have learnt anything that
    transfers: a random network's features are far from useless to a linear classifier on digits."""
    settings = {**pretrain(scale, family, size, scale.largest, 0.0, seed).settings, "steps": 1, "save_every": 0,
                "keep_last": 1}
    return RunSpec(f"init-{family}-{size}-s{seed}", "pretrain-i1k", settings)


def finetune(scale: Scale, parent: RunSpec | None, lr: float, seed: int, *, dev: bool = False,
             scratch: tuple[str, str] | None = None, data: str = "digits") -> RunSpec:
    """Fine-tuning on `data` (digits or mnist, both small grey digits upsampled to the scale's size) from
    `parent`'s weights (or, with scratch=(family, size), training that model from random initialisation with the
    same recipe); `dev`: on train minus a 10% dev split, to choose the lr."""
    settings = {
        "data": data, "image_size": scale.image_size, "batch_size": scale.batch_size,
        "steps": scale.finetune_steps, "lr": lr, "seed": seed, "eval_every": 0,
        "log_every": max(1, scale.finetune_steps // 5), "keep_last": 1, "workers": scale.workers,
        **DIGITS_PREPROCESSING, **({"val_fraction": scale.dev_fraction} if dev else {}),
    }
    split = f"-dev-lr{lr:g}" if dev else ""
    if scratch is not None:
        settings.update(model_settings(*scratch))
        return RunSpec(f"scratch-{scratch[0]}-{scratch[1]}-{data}{split}-s{seed}", "finetune", settings)
    own_seed = "" if parent.settings.get("seed") == seed else f"-s{seed}"
    target = "" if data == "digits" else f"{data}-"
    return RunSpec(f"ft-{target}{parent.label}{split}{own_seed}", "finetune", settings, verb="finetune",
                   init=parent.key)


def transfer_evals(scale: Scale) -> list[str]:
    return [f"fewshot/{d}" for d in scale.fewshot_data]


def tuned_pretrain_lr(ctx: Context, family: str, size: str = "M", *, mpp: bool = False, tag: str = "",
                      **model_overrides: Any) -> float:
    """The pre-training lr with the best final top-1 (MPP: colour top-1) on the largest set's validation split,
    from seed-0 runs that are themselves the seed-0 runs of the chosen lr."""
    candidates = {lr: pretrain(ctx.scale, family, size, ctx.scale.largest, lr, TUNING_SEED, mpp=mpp, tag=tag,
                               **model_overrides) for lr in ctx.scale.lrs}
    return ctx.best(candidates)


def tuned_finetune_lr(ctx: Context, parent: RunSpec | None, scratch: tuple[str, str] | None = None,
                      data: str = "digits") -> float:
    """The fine-tuning lr with the best top-1 on `data`'s dev split, from `parent`'s weights (or scratch)."""
    if parent is not None:
        ctx.run(parent, transfer_evals(ctx.scale))
    candidates = {lr: finetune(ctx.scale, parent, lr, TUNING_SEED, dev=True, scratch=scratch, data=data)
                  for lr in ctx.scale.finetune_lrs}
    return ctx.best(candidates)


# --- measurements -------------------------------------------------------------------------------------------------
def fewshot(record: Record, data: str, shots: int) -> float:
    """Mean few-shot accuracy (%) of a pre-training run over the protocol's draws."""
    return 100 * record.evaluation(f"fewshot/{data}")["accuracy"][str(shots)]["mean"]


def top1(record: Record) -> float:
    return 100 * record.val["top1"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def stat(values: list[float]) -> dict[str, Any]:
    mean, std = mean_std(values)
    return {"mean": round(mean, 3), "std": round(std, 3), "n": len(values), "values": [round(v, 3) for v in values]}


def show(s: dict[str, Any]) -> str:
    """'41.2±1.3 %' (± one standard deviation over seeds)."""
    return f"{s['mean']:.1f}±{s['std']:.1f} %"


def metric_names(scale: Scale, finetune_data: tuple[str, ...] = ("digits",)) -> list[tuple[str, str]]:
    """(key, caption) of the transfer metrics reported: few-shot per dataset and shot count, fine-tuned per
    dataset."""
    names = [(f"{d}/{k}-shot", f"{k}-shot {d}") for d in scale.fewshot_data for k in scale.shots]
    return names + [(f"{d}/fine-tuned", f"fine-tuned {d}") for d in finetune_data]


def transfer(scale: Scale, pre: Record, finetuned: Mapping[str, Record]) -> dict[str, float]:
    """Every transfer metric of one pre-training run and its fine-tuning runs, by target dataset."""
    values = {f"{d}/{k}-shot": fewshot(pre, d, k) for d in scale.fewshot_data for k in scale.shots}
    for data, record in finetuned.items():
        values[f"{data}/fine-tuned"] = top1(record)
    return values


def model_table(scale: Scale, num_classes: int) -> list[dict[str, Any]]:
    """Parameters and multiply-adds (vitlab.flops, per image) of every family and size at the scale's input size,
    as pre-trained (ViTs with their `pre_logits` layer)."""
    from ..flops import count_macs
    from ..models.config import ViTConfig
    from ..models.registry import build_model, describe_architecture, model_config

    rows = []
    for (family, size), (name, args) in MODELS.items():
        config = model_config(name, num_classes=num_classes, image_size=scale.image_size, **args)
        if isinstance(config, ViTConfig):
            config = config.replace(representation_size=config.width)
        params = sum(p.numel() for p in build_model(config).parameters())
        macs = count_macs(config)
        rows.append({"family": family, "size": size, "architecture": describe_architecture(config),
                     "params": params, "macs": macs.total, "train_macs": macs.training})
    return rows

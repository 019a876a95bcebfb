"""What a run says about itself in words: the start banner (printed once before step 1, and by --print-config)
and the result line after the last step."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from vitlab.models.flops import count_macs
from vitlab.train.resolution import Resolved
from vitlab.train.rules import proportion_warning, schedule_line

# The start banner, from the resolved settings: model (name, parameters, multiply-adds), data (source, classes,
# images per split, pre-processing), every setting grouped by where its value came from, the notes of the
# resolution step, the output folder, devices and processes. It is also kept in `<run>/console.log`.

# Settings shown in the model/data/run lines instead of in the grouped list.
_SHOWN_ELSEWHERE = {"out", "recipe", "data", "model", "model_args", "init"}


def settings_lines(resolved: Resolved, defaults: bool = True) -> list[str]:
    """Every setting as `value`, grouped by source, then the notes: what --print-config prints. `defaults=False`
    (the banner) counts the settings left at vitlab's defaults instead of listing them: config.json records every
    value, and the banner keeps to what the recipe, the weights and the flags chose."""
    values = resolved.config.to_dict()
    groups: dict[str, list[str]] = {}
    for key, value in values.items():
        if key in _SHOWN_ELSEWHERE:
            continue
        groups.setdefault(resolved.sources.get(key, "given"), []).append(f"{key} {_fmt(value)}")
    order = sorted(groups, key=lambda s: (s == "default", s.startswith("recipe"), s))  # flags and weights first
    lines = [f"recipe {values['recipe']}, data {values['data']}, model {values['model']}"
             + (f" {_fmt(values['model_args'])}" if values["model_args"] else "")
             + (f", initial weights {values['init']}" if values["init"] else "") + f", out {values['out']}"]
    for source in order:
        if source == "default" and not defaults:
            lines.append(f"  from default: {len(groups[source])} other settings (config.json lists every value)")
            continue
        lines.append(_wrap(f"  from {source}: " + ", ".join(groups[source])))
    lines += [_wrap(f"  note: {note}") for note in resolved.notes]
    return lines


def banner_lines(resolved: Resolved, model: Any, data: Any, device: Any, world: int, workers: int,
                 threads: int, start_step: int, training: list[str] | None = None) -> list[str]:
    """`training`: the trainer's lines on what trains, layer decay and EMA (after the compute line)."""
    cfg = resolved.config
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    macs = count_macs(config, cfg.image_size).total
    start = f"resuming at step {start_step:,} of {cfg.steps:,}" if start_step else f"{cfg.steps:,} steps"
    lines = [
        f"vitlab {cfg.recipe}: {start} → {cfg.out}",
        f"model   {config.name or cfg.model}: {_count(params)} parameters, {_count(macs)} multiply-adds per "
        f"{cfg.image_size}×{cfg.image_size} image, mean {_fmt(config.mean)} std {_fmt(config.std)}",
        f"data    {data.source}: {data.num_classes} classes, {len(data.train):,} train / {len(data.val):,} val "
        f"images at {cfg.image_size} px; train {_train_preprocessing(cfg)}; eval resize {cfg.eval_resize}",
        *schedule_lines(resolved, len(data.train)),
        f"devices {device.type} × {world} process{'es' if world > 1 else ''}, {threads} compute thread"
        f"{'s' if threads != 1 else ''} and {workers} loader worker{'s' if workers != 1 else ''} per process",
        f"compute {cfg.precision} ({resolved.sources.get('precision', 'given')})",
        *([f"attention {cfg.attention} ({resolved.sources.get('attention', 'given')})"]
          if hasattr(config, "head_dim") else []),
        *([_wrap(line)] if (line := loss_line(cfg, data.num_classes)) else []),
        *(_wrap(line) for line in training or ()),
    ]
    settings = settings_lines(resolved, defaults=False)
    return lines + ["settings " + line if i == 0 else line for i, line in enumerate(settings)]


def schedule_lines(resolved: Resolved, train_images: int) -> list[str]:
    """The run's length in steps and epochs of this training set, and a warning when a recipe's schedule is far
    out of proportion to it (vitlab.train.rules); the banner and --print-config show them."""
    cfg, source = resolved.config, resolved.sources.get("steps", "given")
    warning = proportion_warning(cfg, source, train_images)
    return [_wrap(schedule_line(cfg, source, train_images))] + ([_wrap(f"warning: {warning}")] if warning else [])


def loss_line(cfg: Any, num_classes: int) -> str | None:
    """What a sigmoid loss implies for this run's classes, which a practitioner used to softmax would misread: the
    first loss (the head starts at zero, so every logit is the head bias b: softplus(−b) for the image's class plus
    softplus(b) for each other, whatever the label smoothing or mixing) and softmax's log K beside it."""
    if cfg.loss != "sigmoid":
        return None
    bias = 0.0 if cfg.init else float(cfg.head_bias_init)  # fine-tuning replaces the head with a zero one
    first = _softplus(-bias) + (num_classes - 1) * _softplus(bias)
    return (f"loss    sigmoid cross-entropy summed over {num_classes} classes, head bias {bias:g}: the first steps' "
            f"loss is about {first:.2f}, not softmax's log {num_classes} = {math.log(num_classes):.2f} (the "
            "upstream pre-training loss of the paper's ImageNet-21k and JFT models, each class a yes/no); for "
            "one label per image, --loss softmax is the usual choice")


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))  # log(1 + e^x) without overflow


def _count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n):,}"


def _train_preprocessing(cfg: Any) -> str:
    flip = ", flip" if cfg.flip else ", no flip"
    if cfg.train_crop == "resize-random-crop":
        return f"resize then random crop{flip}" + _augmentation(cfg)
    lo, hi = cfg.crop_scale
    return f"{cfg.train_crop} crop ({100 * lo:g}%–{100 * hi:g}% of the area){flip}" + _augmentation(cfg)


def _augmentation(cfg: Any) -> str:
    """RandAugment, random erasing, MixUp and CutMix when on."""
    parts = []
    if cfg.randaug_ops:
        spread = f" ± {cfg.randaug_mstd:g}" if cfg.randaug_mstd else ""
        parts.append(f"RandAugment {cfg.randaug_ops} ops at level {cfg.randaug_magnitude:g}{spread}")
    if cfg.random_erasing:
        parts.append(f"random erasing p {cfg.random_erasing:g}")
    if cfg.mixup:
        parts.append(f"MixUp α {cfg.mixup:g}")
    if cfg.cutmix:
        parts.append(f"CutMix α {cfg.cutmix:g}")
    return "".join(", " + part for part in parts)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(value.items())) + ")"
    return str(value)


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=118, subsequent_indent="      ", break_on_hyphens=False, break_long_words=False)


def result_line(result: Any, verb: str) -> str:
    """The final line of `vitlab train` and `vitlab.train.fit`: what this call did (trained, or evaluated again
    a run that had already finished)."""
    if result.status == "preempted":
        return f"preempted at step {result.step}; continue with: vitlab {verb} --out {result.out_dir} --resume"
    m = result.metrics
    top5 = f"top-5 {100 * m['top5']:.2f}%, " if "top5" in m else ""  # only where it can be below 100%
    scores = (f"val top-1 {100 * m.get('top1', 0):.2f}%, {top5}loss {m.get('loss', 0):.4f} ({m.get('count', 0)} "
              "images)")
    if not result.images_per_s:  # no step ran: the run had finished before this invocation
        return (f"done: {result.out_dir} had already finished its {result.step:,} steps; nothing trained, its final "
                f"weights evaluated again in {result.seconds:.0f} s: {scores}; weights {result.weights}")
    return (f"done: step {result.step}, {scores} in {result.seconds:.0f} s; {result.images_per_s:.0f} img/s model, "
            f"{result.data_images_per_s:.0f} img/s data; weights {result.weights}")

"""How long the runs still to do will take, from step times measured on this machine before starting.

Each distinct model (architecture, input size, batch, objective) is timed for a few synthetic training steps and
one forward pass, with the thread count the trainer will use; a run costs its steps times its step time, plus its
evaluations (images forwarded) and a fixed per-run overhead (datasets, checkpoints, figures), plus rendering the
fractal sets not yet in the cache.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from reproduction.evals import parse
from reproduction.families import MODELS
from reproduction.spec import RunSpec
from vitlab import train as training
from vitlab.data import describe_drawn, load_split
from vitlab.runtime import pick_device
from vitlab.train import RECIPES

RUN_OVERHEAD_S = 2.5  # building datasets, writing config/metrics/checkpoints/curves.png: measured on 2 vCPUs
RENDER_S_PER_IMAGE = 0.0035  # fractal rendering at 64 px, measured on 2 vCPUs (vitlab.data.fractal)
STROKES_S_PER_IMAGE = 0.00025  # stroke glyphs at 32 px (vitlab.data.strokes; benchmarks/generators.py)
FONTS_S_PER_IMAGE = 0.0005  # font glyphs at 32 px (vitlab.data.fontglyphs; benchmarks/generators.py)
TIMED_STEPS = 2


@dataclass
class StepTime:
    train_s: float  # one optimiser step at the spec's batch size
    forward_s_per_image: float  # inference, for evaluations


class CostModel:
    """Seconds a spec and its evaluations will take; measured step times are cached per model."""

    def __init__(self, workers: int | None):
        self.workers = workers
        self.measured: dict[str, StepTime] = {}
        self.names: dict[str, str] = {}

    def named(self) -> dict[str, StepTime]:
        """The measured step times by a short model name (family and size, batch, objective)."""
        return {self.names[k]: t for k, t in self.measured.items()}

    def step_time(self, spec: RunSpec) -> StepTime:
        s = {**spec.settings, "objective": spec.settings.get("objective", RECIPES[spec.recipe].get("objective"))}
        key = repr((spec.recipe, s.get("model"), sorted((s.get("model_args") or {}).items()), s.get("image_size"),
                    s.get("batch_size"), s.get("objective")))
        if key not in self.measured:
            self.measured[key] = _measure(RunSpec(spec.label, spec.recipe, s), self.workers)
            self.names[key] = f"{short_name(s)} {spec.recipe}"
        return self.measured[key]

    def train_seconds(self, spec: RunSpec) -> float:
        t = self.step_time(spec)
        val = val_images(spec.settings.get("data", "digits"), spec.settings.get("val_fraction"))
        return spec.steps * t.train_s + val * t.forward_s_per_image + RUN_OVERHEAD_S

    def eval_seconds(self, spec: RunSpec, name: str, curve_points: int) -> float:
        kind, data = parse(name)
        t = self.step_time(spec)
        images = {"fewshot": total_images(data), "fewshot-encoder": total_images(data),
                  "curve": curve_points * total_images(data), "upstream": split_size(data, "val"),
                  "attention": 128}[kind]
        return images * t.forward_s_per_image * (3 if kind == "attention" else 1) + 0.5


def short_name(settings: dict[str, Any]) -> str:
    """'ViT-M (batch 64)', 'ViT-M gap (batch 64)': the family and size of the experiments' model table."""
    args = dict(settings.get("model_args") or {})
    name = settings.get("model", "?")
    for (family, size), (base, base_args) in MODELS.items():
        if base == name and all(args.get(k) == v for k, v in base_args.items()):
            extra = {k: v for k, v in args.items() if k not in base_args}
            name = " ".join([f"{family}-{size}", *(str(v) for v in extra.values())])
            break
    return f"{name} (batch {settings.get('batch_size')})"


def _measure(spec: RunSpec, workers: int | None) -> StepTime:
    """A few optimiser steps of the model, loss, clipping and optimiser the run will build (the resolution step
    and the trainer's own builders), on random images; and one forward pass of the representation."""
    # the trainer's builders bring the data augmentations (torchvision) with them: not imported by `vitlab --help`
    from vitlab.train import step_parts

    flags = {k: v for k, v in spec.settings.items() if k not in ("init", "resume")}
    # a fine-tuning run's config, trained from scratch here
    cfg = training.resolve(spec.recipe, {**flags, "out": "unused"}, verb="train").config
    device = pick_device(cfg.device)
    classes = [str(i) for i in range(_classes(cfg.data))]
    parts = step_parts(cfg, classes, device)
    model, optimizer = parts.model, parts.optimizer
    x = torch.rand(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device=device) * 2 - 1
    y = torch.randint(0, len(classes), (cfg.batch_size,), device=device)
    threads = torch.get_num_threads()
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:  # as the trainer sets it (train/trainer.py)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        loaders = min(8, cpus - 1) if workers is None else workers
        torch.set_num_threads(max(1, cpus - loaders))
    try:
        def step() -> None:
            parts.loss(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        train_s = _timed(step, device)
        encoder = getattr(model, "encoder", model)
        encoder.eval()
        with torch.no_grad():
            forward_s = _timed(lambda: encoder.forward_head(encoder.forward_features(x), pre_logits=True), device)
    finally:
        torch.set_num_threads(threads)
    return StepTime(train_s, forward_s / cfg.batch_size)


def _classes(data: str) -> int:
    spec = _drawn(data)
    return spec[0] if spec else 10


def _drawn(data: str) -> tuple[int, int, int] | None:
    """(classes, training images, validation images) of a drawn source (fractal:, strokes:, fonts:), None
    otherwise."""
    drawn = describe_drawn(data)
    return None if drawn is None else (drawn.classes, drawn.train_images, drawn.val_images)


def _timed(fn: Any, device: torch.device) -> float:
    fn()  # warm-up: allocations, kernel selection
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(TIMED_STEPS):
        fn()
    sync()
    return (time.perf_counter() - start) / TIMED_STEPS


@cache
def total_images(data: str) -> int:
    """Images a few-shot evaluation on `data` forwards: its train and test splits."""
    return split_size(data, "train") + split_size(data, "val")


@cache
def split_size(data: str, split: str) -> int:
    drawn = _drawn(data)
    if drawn is not None:
        return drawn[1] if split == "train" else drawn[2]

    return len(load_split(data, split))


def val_images(data: str, val_fraction: float | None) -> int:
    return round(val_fraction * split_size(data, "train")) if val_fraction else split_size(data, "val")


def render_seconds(data: str) -> float:
    """Drawing a fractal, stroke or font set that is not in the cache yet (once: later runs load it)."""
    drawn = describe_drawn(data)
    if drawn is None or drawn.cached:
        return 0.0
    per_image = {"fractal": RENDER_S_PER_IMAGE, "strokes": STROKES_S_PER_IMAGE, "fonts": FONTS_S_PER_IMAGE}[drawn.kind]
    return (split_size(data, "train") + split_size(data, "val")) * per_image

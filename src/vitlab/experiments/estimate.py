"""How long the runs still to do will take, from step times measured on this machine before starting.

Each distinct model (architecture, input size, batch, objective) is timed for a few synthetic training steps and
one forward pass, with the thread count the trainer will use; a run costs its steps times its step time, plus its
evaluations (images forwarded) and a fixed per-run overhead (datasets, checkpoints, figures), plus rendering the
fractal sets not yet in the cache.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from .spec import RunSpec

RUN_OVERHEAD_S = 2.5  # building datasets, writing config/metrics/checkpoints/curves.png: measured on 2 vCPUs
RENDER_S_PER_IMAGE = 0.0035  # fractal rendering at 64 px, measured on 2 vCPUs (vitlab.data.fractal)
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
        from ..train.config import RECIPES

        s = {**spec.settings, "objective": spec.settings.get("objective", RECIPES[spec.recipe].get("objective"))}
        key = repr((s.get("model"), sorted((s.get("model_args") or {}).items()), s.get("image_size"),
                    s.get("batch_size"), s.get("objective", "classify")))
        if key not in self.measured:
            self.measured[key] = _measure(s, self.workers)
            self.names[key] = short_name(s)
        return self.measured[key]

    def train_seconds(self, spec: RunSpec) -> float:
        t = self.step_time(spec)
        val = val_images(spec.settings.get("data", "digits"), spec.settings.get("val_fraction"))
        return spec.steps * t.train_s + val * t.forward_s_per_image + RUN_OVERHEAD_S

    def eval_seconds(self, spec: RunSpec, name: str, curve_points: int) -> float:
        from .evals import parse

        kind, data = parse(name)
        t = self.step_time(spec)
        images = {"fewshot": total_images(data), "curve": curve_points * total_images(data),
                  "attention": 128}[kind]
        return images * t.forward_s_per_image * (3 if kind == "attention" else 1) + 0.5


def short_name(settings: dict[str, Any]) -> str:
    """'ViT-M (batch 64)', 'ViT-M gap MPP (batch 64)': the family and size of the experiments' model table."""
    from .common import MODELS

    args = dict(settings.get("model_args") or {})
    name = settings.get("model", "?")
    for (family, size), (base, base_args) in MODELS.items():
        if base == name and all(args.get(k) == v for k, v in base_args.items()):
            extra = {k: v for k, v in args.items() if k not in base_args}
            name = " ".join([f"{family}-{size}", *(str(v) for v in extra.values())])
            break
    mpp = " MPP" if settings.get("objective") == "mpp" else ""
    return f"{name}{mpp} (batch {settings.get('batch_size')})"


def _measure(settings: dict[str, Any], workers: int | None) -> StepTime:
    from ..models.registry import build_model, model_config
    from ..train.distributed import pick_device

    device = pick_device(settings.get("device", "auto"))
    size, batch = int(settings.get("image_size", 32)), int(settings.get("batch_size", 64))
    mpp = settings.get("objective") == "mpp"
    config = model_config(settings["model"], num_classes=0 if mpp else 10, image_size=size,
                          **(settings.get("model_args") or {}))
    model = build_model(config)
    if mpp:
        from ..selfsup import MaskedPatchPredictor

        model = MaskedPatchPredictor(model)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), 1e-4)
    x = torch.rand(batch, 3, size, size, device=device) * 2 - 1
    y = torch.randint(0, 10, (batch,), device=device)
    threads = torch.get_num_threads()
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:  # as the trainer sets it (train/setup.py)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        loaders = min(8, cpus - 1) if workers is None else workers
        torch.set_num_threads(max(1, cpus - loaders))
    try:
        def step() -> None:
            loss = model(x)[0] if mpp else torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        train_s = _timed(step, device)
        encoder = model.encoder if mpp else model
        encoder.eval()
        with torch.no_grad():
            forward_s = _timed(lambda: encoder.forward_head(encoder.forward_features(x), pre_logits=True), device)
    finally:
        torch.set_num_threads(threads)
    return StepTime(train_s, forward_s / batch)


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
    from ..data.fractal import is_fractal_source, parse_spec

    if is_fractal_source(data):
        spec = parse_spec(data)
        return spec.categories * spec.count(split)
    from ..data import load_split

    return len(load_split(data, split))


def val_images(data: str, val_fraction: float | None) -> int:
    return round(val_fraction * split_size(data, "train")) if val_fraction else split_size(data, "val")


def render_seconds(data: str) -> float:
    """Rendering a fractal set that is not in the cache yet (once: later runs load it)."""
    from ..data.fractal import cache_path, is_fractal_source, parse_spec

    if not is_fractal_source(data) or cache_path(parse_spec(data)).is_file():
        return 0.0
    return (split_size(data, "train") + split_size(data, "val")) * RENDER_S_PER_IMAGE

"""Trained weights ready for inference: what `vitlab eval`, `predict`, `fewshot`, `analyze` and the experiments
load a model with."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vitlab.runtime.precision import Precision, model_width, prepare_for_inference, resolve_precision
from vitlab.weights.load import load


def load_for_inference(weights: str | Path, device: torch.device) -> tuple[nn.Module, list[str]]:
    """(model on device in eval mode, class names: the file's, else the class indices as text). `weights`: anything
    `vitlab.load` reads (a file or folder, a run or checkpoint directory, a published name)."""
    model = load(weights).to(device).eval()
    k = model.config.num_classes
    names = list(getattr(model, "class_names", None) or [str(i) for i in range(k)])
    return model, names


def with_precision(model: nn.Module, device: torch.device, precision: str,
                   compile: bool = False) -> tuple[nn.Module, Precision]:
    """(the model in the fastest form of `precision` for inference, the resolved choice with its reason); the
    caller computes under `precision.autocast_for(device, chosen)`. fp32 leaves the model as it is. `compile`:
    wrap the prepared model with `torch.compile` (off by default: on a CPU its compilation costs more than it
    saves except in evaluations of many minutes, BENCHMARKS.md "int8 and compile on a quiet machine"); the
    wrapper still exposes `model.config` and `model.class_names`."""
    chosen = resolve_precision(precision, device, use="infer", width=model_width(model))
    model = prepare_for_inference(model, chosen)
    if compile:
        model = torch.compile(model)
    return model, chosen

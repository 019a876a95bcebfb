"""Trained weights ready for inference: what `vitlab eval`, `predict`, `fewshot`, `analyze` and the experiments
load a model with."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .. import load
from ..hub import resolve_path
from ..weights.load import weights_path


def resolve_weights(path: str | Path) -> Path:
    """A weights file or folder as `vitlab.load` takes it: a published checkpoint's name (`augreg-i21k:ViT-B/16`,
    `hf-hub:owner/name`) means its file in the download cache (vitlab.hub); a run or checkpoint directory its
    model.safetensors (`vitlab.weights.load.weights_path`, the rule every reader shares)."""
    return weights_path(resolve_path(path))


def load_for_inference(weights: str | Path, device: torch.device) -> tuple[nn.Module, list[str]]:
    """(model on device in eval mode, class names: the file's, else the class indices as text)."""
    model = load(resolve_weights(weights)).to(device).eval()
    k = model.config.num_classes
    names = list(getattr(model, "class_names", None) or [str(i) for i in range(k)])
    return model, names

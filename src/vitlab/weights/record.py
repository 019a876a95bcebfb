"""What every format reader returns, `WeightsRecord`: a config and a state dict in vitlab's own names and layouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vitlab.models.config import ModelConfig


@dataclass
class WeightsRecord:
    """A weights file as read: its architecture and tensors, whichever format it came in (not a training
    checkpoint, which is a run's step folder: vitlab.files.rundir)."""

    config: ModelConfig
    state_dict: dict[str, torch.Tensor]  # keys and layouts of vitlab's model.state_dict()
    source: str  # "vitlab", "jax-npz", "timm", "hf"
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. {"class_names": [...]} when the file has them

"""The strict check every reader ends with: the file's tensors against the model's, by name and shape."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from .errors import WeightsError


def _names(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(sorted(keys)[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_state_dict(
    path: str | Path, expected: Mapping[str, torch.Size], got: Mapping[str, torch.Tensor]
) -> None:
    """WeightsError for missing tensors, unexpected tensors or shape mismatches; nothing is loaded partially."""
    missing = [k for k in expected if k not in got]
    if missing:
        raise WeightsError(path, f"missing tensors {_names(missing)}",
                           "the file does not match the architecture it declares; re-export it")
    extra = [k for k in got if k not in expected]
    if extra:
        raise WeightsError(path, f"unexpected tensors {_names(extra)}",
                           "the file holds parts this architecture lacks; re-export it or name the right arch")
    for key, shape in expected.items():
        if tuple(got[key].shape) != tuple(shape):
            raise WeightsError(path, f"tensor {key} has shape {tuple(got[key].shape)}, expected {tuple(shape)}",
                               "the file does not match the architecture it declares; re-export it")

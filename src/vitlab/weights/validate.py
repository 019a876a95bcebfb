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


def check_values(
    path: str | Path, state: Mapping[str, torch.Tensor], class_names: object, num_classes: int
) -> None:
    """WeightsError for a file that would make every prediction NaN or crash on naming one: a floating-point
    tensor with NaN or inf values (a diverged run, a corrupt file), or a `class_names` list that does not name
    each of the head's classes exactly once. One pass of isfinite over the weights: milliseconds for ViT-B."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and tensor.device.type != "meta" and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise WeightsError(path, f"tensor {key} has {bad} non-finite value(s) (NaN or inf) of {tensor.numel()}",
                               "the file is corrupt or from a diverged run; use an earlier checkpoint")
    if class_names is None:
        return
    if not isinstance(class_names, list) or not all(isinstance(c, str) for c in class_names):
        raise WeightsError(path, "class_names in the metadata is not a list of strings", "re-save the model")
    if len(class_names) != num_classes:
        raise WeightsError(path, f"class_names lists {len(class_names)} names for a head of {num_classes} classes",
                           "re-save the model with one name per class")

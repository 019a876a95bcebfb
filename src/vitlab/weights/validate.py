"""The strict check every reader ends with: the file's tensors against the model's, by name and shape; the shapes
an architecture needs (built on the meta device, after its declared size is bounded); finite values. And the
warning every BiT writer gives when its format computes with other epsilons than the model."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.errors import WeightsError
from vitlab.models.config import ModelConfig
from vitlab.models.registry import build_model
from vitlab.ranges import MAX_DEPTH

# The deepest published model has 66 units (BiT-R200x3: 3 + 24 + 36 + 3) and the widest stage count is four; a
# file declaring more blocks than this is corrupt or crafted. Building even a meta-device model costs
# milliseconds and kilobytes per block, so the bound (vitlab.ranges.MAX_DEPTH) comes before anything is built.
# Fewest tensors one block brings (a ViT block: two LayerNorms and four Dense kernels at least; a ResNet unit:
# three convolutions), so a file's tensor count bounds the depth it can honestly declare.
_TENSORS_PER_BLOCK = {"vit": 8, "unit": 3}


def check_declared_size(path: str | Path, config: object, tensors: int | None) -> None:
    """WeightsError, before any model is built, when the architecture a file's metadata declares has more blocks
    than vitlab's limit or than the file's `tensors` could hold (a 6 KB file declaring depth 10^6). `tensors`
    None: the caller named the architecture (arch=), so only the limit applies and the tensor check that follows
    names the architecture."""
    depth = int(getattr(config, "depth", 0) or 0)
    resnet = getattr(config, "resnet", None)
    units = list(getattr(resnet, "layers", ()) if resnet is not None else getattr(config, "layers", ()) or ())
    blocks = depth + sum(units) + len(units)
    what = (f"depth {depth}" if depth else "") + (" and " if depth and units else "") + (
        f"{sum(units)} ResNet units in {len(units)} stages" if units else "")
    if blocks > MAX_DEPTH:
        raise WeightsError(path, f"declares {what}: beyond vitlab's limit of {MAX_DEPTH:,} blocks",
                           "the file's metadata is corrupt or crafted; re-export it")
    needed = _TENSORS_PER_BLOCK["vit"] * depth + _TENSORS_PER_BLOCK["unit"] * sum(units)
    if tensors is not None and needed > tensors:
        raise WeightsError(path, f"declares {what} (at least {needed:,} tensors) but holds {tensors:,} tensors",
                           "the file's metadata does not match its weights; re-export it")


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


def expected_shapes(config: ModelConfig, path: str | Path | None = None, tensors: int | None = None
                    ) -> dict[str, torch.Size]:
    """Every tensor the architecture needs, with its shape, without allocating or initialising weights. For a
    config read from a file, `path` and the file's tensor count bound the declared depth before anything is built
    (validate.check_declared_size)."""
    if path is not None:
        check_declared_size(path, config, tensors)
    with torch.device("meta"):
        model = build_model(config)
    return {k: v.shape for k, v in model.state_dict().items()}


def check_against(
    path: str | Path, expected: Mapping[str, torch.Size], got: Mapping[str, torch.Tensor], arch: str
) -> None:
    """`check_state_dict`, with the architecture the expectation came from added to the message."""
    try:
        check_state_dict(path, expected, got)
    except WeightsError as e:
        raise WeightsError(e.path, f"{e.problem} (expected by {arch})", e.fix) from None


def warn_numerics(model: nn.Module, target: str, ws_eps: float, gn_eps: float, stacklevel: int = 3) -> None:
    """Warn when `target` computes GroupNorm or weight standardisation with other epsilons than the model. The
    weights are written as they are (rescaling them to compensate would change how they fine-tune), so the
    target's outputs differ; a WS eps mismatch too small to move a float32 filter by 1e-6 is not reported."""
    config: Any = model.config
    if config.gn_eps != gn_eps:
        warnings.warn(f"the model uses GroupNorm eps {config.gn_eps:g} and {target} {gn_eps:g}: its outputs will "
                      "differ slightly", stacklevel=stacklevel)  # fmt: skip
    if config.ws_eps == ws_eps:
        return
    # sqrt(var + eps) changes by a relative |Δeps| / (2·var): largest for the conv with the smallest variance.
    var = min(float(m.weight.detach().float().var(dim=(1, 2, 3), unbiased=False).min())
              for m in model.modules() if isinstance(m, nn.Conv2d))  # fmt: skip
    bound = abs(config.ws_eps - ws_eps) / (2 * var) if var > 0 else float("inf")
    if bound > 1e-6:
        warnings.warn(f"the model standardises conv weights with eps {config.ws_eps:g} and {target} with "
                      f"{ws_eps:g}: its outputs will differ (filters rescaled by up to {bound:.1e} relative)",
                      stacklevel=stacklevel)  # fmt: skip

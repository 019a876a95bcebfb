"""Upper bounds on an architecture's sizes, checked when a config is made (from a user's keywords, a command-line
flag or a file's metadata), so that a typo or a crafted file is one line naming the field instead of a request
for terabytes or torch's "Storage size calculation overflowed".

The bounds themselves are declared with every other range in vitlab.ranges.
"""

from __future__ import annotations

from typing import Any

from vitlab.ranges import (
    MAX_CHANNELS,
    MAX_CLASSES,
    MAX_DEPTH,
    MAX_HEADS,
    MAX_IMAGE_SIDE,
    MAX_MLP_DIM,
    MAX_PATCH,
    MAX_TOKENS,
    MAX_WIDTH,
    MAX_WIDTH_FACTOR,
    is_int,
)

_BOUNDS = {"width": MAX_WIDTH, "mlp_dim": MAX_MLP_DIM, "num_heads": MAX_HEADS, "patch_size": MAX_PATCH,
           "in_chans": MAX_CHANNELS, "num_classes": MAX_CLASSES,
           "representation_size": MAX_WIDTH, "width_factor": MAX_WIDTH_FACTOR}


def check_blocks(cfg: Any) -> None:
    """ValueError when a config (ViT, hybrid or BiT) has more blocks than MAX_DEPTH, checked when a model is built
    (a file's config is checked first, by weights.validate, which names the file)."""
    resnet = getattr(cfg, "resnet", None)
    units = tuple(getattr(resnet, "layers", ()) if resnet is not None else getattr(cfg, "layers", ()) or ())
    depth = getattr(cfg, "depth", 0) or 0
    if depth + sum(units) + len(units) > MAX_DEPTH:
        what = f"depth {depth:,}" if depth > MAX_DEPTH else f"{sum(units):,} ResNet units in {len(units):,} stages"
        raise ValueError(f"{what} is beyond vitlab's limit of {MAX_DEPTH:,} blocks; check the value")


def check_limits(cfg: Any) -> None:
    """ValueError naming the first integer field of `cfg` (a ViTConfig or BiTConfig) that is a bool or above its
    bound, or an image size or token grid too large; lower bounds and types are the config's own checks."""
    for name, bound in _BOUNDS.items():
        value = getattr(cfg, name, None)
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if is_int(value) and value > bound:
            raise ValueError(f"{name} {value:,} is beyond vitlab's limit of {bound:,}; check the value")
    h, w = cfg.image_size
    if max(h, w) > MAX_IMAGE_SIDE:
        raise ValueError(f"image_size {h}x{w} is beyond vitlab's limit of {MAX_IMAGE_SIDE:,} pixels per side; "
                         "check the value")
    stride = getattr(cfg, "total_stride", None)
    if isinstance(stride, int) and stride > 0 and (h // stride) * (w // stride) > MAX_TOKENS:
        raise ValueError(f"image_size {h}x{w} with patch size {stride} makes {(h // stride) * (w // stride):,} "
                         f"patches, beyond vitlab's limit of {MAX_TOKENS:,}; use a smaller size or larger patches")

"""Inputs for the analyses: image files or an embedded dataset's held-out images, resized to the model's size
and normalised with the mean/std the weights expect; and the inverse mapping back to [0, 1] for drawing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..models.config import ViTConfig


def channel_stats(config: ViTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, 1, 1) mean and std for the model's input channels. Configs carry three values even for 1-channel
    models, so take as many as there are channels (a single value is repeated)."""
    c = config.in_chans

    def pick(values: Sequence[float]) -> torch.Tensor:
        vals = list(values) * c if len(values) == 1 else list(values)[:c]
        return torch.tensor(vals, dtype=torch.float32).reshape(c, 1, 1)

    return pick(config.mean), pick(config.std)


def normalize(pixels: torch.Tensor, config: ViTConfig) -> torch.Tensor:
    """(N, C, H, W) in [0, 1] -> values the weights expect."""
    mean, std = channel_stats(config)
    return (pixels - mean) / std


def to_display(x: torch.Tensor, config: ViTConfig) -> np.ndarray:
    """Model inputs (N, C, H, W) -> (N, H, W, C) floats in [0, 1] for matplotlib."""
    mean, std = channel_stats(config)
    pixels = (x.detach().float().cpu() * std + mean).clamp(0, 1)
    return pixels.permute(0, 2, 3, 1).numpy()


def _to_input(img, mode: str, image_size: tuple[int, int]) -> torch.Tensor:
    """PIL image -> (C, H, W) floats in [0, 1]: converted to the model's mode and resized bilinearly (the
    resampler of the training pipeline) to image_size (H, W), without cropping so the whole image is analysed."""
    from PIL import Image

    h, w = image_size
    img = img.convert(mode).resize((w, h), Image.Resampling.BILINEAR)  # PIL sizes are (W, H)
    arr = np.asarray(img, dtype=np.float32) / 255.0
    arr = arr[:, :, None] if arr.ndim == 2 else arr  # (H, W, C)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def load_images(paths: Sequence[str | Path], config: ViTConfig, image_size: tuple[int, int]) -> torch.Tensor:
    """Image files -> (N, C, H, W) normalised model inputs: grayscale for 1-channel models, RGB for 3."""
    from PIL import Image, UnidentifiedImageError

    mode = "L" if config.in_chans == 1 else "RGB"
    batch = []
    for path in paths:
        try:
            with Image.open(path) as img:
                batch.append(_to_input(img, mode, image_size))
        except FileNotFoundError:
            raise FileNotFoundError(f"image not found: {path}") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
            raise ValueError(f"cannot read image {path}: {err}") from None
    if not batch:
        raise ValueError("no images given")
    return normalize(torch.stack(batch), config)


def embedded_images(
    config: ViTConfig, image_size: tuple[int, int], count: int = 8, dataset: str = "digits"
) -> torch.Tensor:
    """(N, C, H, W) normalised images from the held-out split of an embedded dataset (`vitlab.data`, bundled
    with installed packages, no download), one per class in turn (0, 1, 2, …) so the figures show variety."""
    from ..data.embedded import EMBEDDED, embedded_splits

    if dataset not in EMBEDDED:
        raise ValueError(f"unknown embedded dataset {dataset!r}; choose from {', '.join(EMBEDDED)}")
    _, held_out = embedded_splits(dataset)
    by_class = [np.flatnonzero(held_out.labels == c) for c in np.unique(held_out.labels)]
    picks = []
    for i in range(min(count, len(held_out))):
        members, rank = by_class[i % len(by_class)], i // len(by_class)  # the rank-th image of this class
        if rank < len(members):
            picks.append(int(members[rank]))
    mode = "L" if config.in_chans == 1 else "RGB"
    return normalize(torch.stack([_to_input(held_out.load(i), mode, image_size) for i in picks]), config)

"""Inputs for the analyses: image files, or held-out images of any dataset the trainer accepts (embedded sets,
image folders), resized to the model's size and normalised with the mean/std the weights expect, each with its
file and true class; and the inverse mapping back to [0, 1] for drawing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab.data import EMBEDDED, DataError, is_embedded, load_split
from vitlab.data.sources import DECODE_ERRORS, open_image, to_rgb
from vitlab.files.reading import open_regular
from vitlab.models.config import ViTConfig


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
    img = to_rgb(img).convert(mode).resize((w, h), Image.Resampling.BILINEAR)  # 16-bit, float: scaled, not clipped
    arr = np.asarray(img, dtype=np.float32) / 255.0
    arr = arr[:, :, None] if arr.ndim == 2 else arr  # (H, W, C)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


@dataclass
class AnalysisInputs:
    """What `analyze` looks at: the model inputs and, per image, where it came from."""

    x: torch.Tensor  # (N, C, H, W) normalised as the weights expect
    images: list[dict[str, Any]]  # per image: "file" (path or dataset:split[index]), "true_class" (None: unknown)
    source: str  # where they come from, for the captions: "validation images of data/shapes"


def _mode(config: ViTConfig) -> str:
    return "L" if config.in_chans == 1 else "RGB"


def load_images(paths: Sequence[str | Path], config: ViTConfig, image_size: tuple[int, int]) -> torch.Tensor:
    """Image files -> (N, C, H, W) normalised model inputs: grayscale for 1-channel models, RGB for 3."""
    batch = []
    for path in paths:
        try:
            with open_regular(path) as f, open_image(f) as img:  # a FIFO named x.png would block Image.open
                batch.append(_to_input(img, _mode(config), image_size))
        except FileNotFoundError:
            raise FileNotFoundError(f"image not found: {path}") from None
        except DECODE_ERRORS as err:  # an image over the image budget included
            raise ValueError(f"cannot read image {path}: {err}") from None
    if not batch:
        raise ValueError("no images given")
    return normalize(torch.stack(batch), config)


def image_file_inputs(
    paths: Sequence[str | Path], config: ViTConfig, image_size: tuple[int, int], class_names: Sequence[str] = ()
) -> AnalysisInputs:
    """Image files given directly. The true class is known when the file sits in a folder named after one of
    the model's classes (data/val/cat/1.jpg for a model with a class "cat"), as in an image-folder dataset."""
    x = load_images(paths, config, image_size)
    known = set(class_names)
    images = [{"file": str(p), "true_class": Path(p).parent.name if Path(p).parent.name in known else None}
              for p in paths]
    return AnalysisInputs(x, images, "image files")


def pick_per_class(labels: np.ndarray, count: int) -> list[int]:
    """Up to `count` indices, one per class in turn (the first image of each class, then the second, …), so
    the figures show every class before repeating one."""
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    picks: list[int] = []
    for rank in range(max((len(m) for m in by_class), default=0)):
        for members in by_class:
            if len(picks) < count and rank < len(members):
                picks.append(int(members[rank]))
    return picks


def dataset_inputs(data: str, config: ViTConfig, image_size: tuple[int, int], count: int = 8) -> AnalysisInputs:
    """Held-out images of any dataset the trainer accepts: an embedded set (its test split) or an image folder
    (root/val/<class>/, a plain root/<class>/ tree, or root/train/<class>/ when there is no val/), one per
    class in turn, labelled with their file and class."""
    try:
        split = load_split(data, "val")
        which = "test-split images of the embedded set" if is_embedded(data) else "validation images of"
    except DataError as err:
        if "missing split" not in str(err):
            raise
        split = load_split(data, "train")  # root/train/ without val/: the only images there are
        which = "training images (no val/ folder) of"
    picks = pick_per_class(split.labels, count)
    batch, images = [], []
    for i in picks:
        name = split.paths[i] if split.paths is not None else f"{data}:{split.name}[{i}]"
        try:
            batch.append(_to_input(split.load(i), _mode(config), image_size))
        except DECODE_ERRORS as err:
            raise ValueError(f"cannot read image {name}: {err}") from None
        images.append({"file": name, "true_class": split.class_names[int(split.labels[i])]})
    return AnalysisInputs(normalize(torch.stack(batch), config), images, f"{which} {data}")


def embedded_images(
    config: ViTConfig, image_size: tuple[int, int], count: int = 8, dataset: str = "digits"
) -> torch.Tensor:
    """(N, C, H, W) normalised images from the held-out split of an embedded dataset (`vitlab.data`, bundled
    with installed packages, no download), one per class in turn (0, 1, 2, …) so the figures show variety."""
    if dataset not in EMBEDDED:
        raise ValueError(f"unknown embedded dataset {dataset!r}; choose from {', '.join(EMBEDDED)}")
    return dataset_inputs(dataset, config, image_size, count).x


def is_grey(x: torch.Tensor, config: ViTConfig) -> bool:
    """Are these RGB model inputs grey (R = G = B to within one level of 8 bits)?"""
    if config.in_chans != 3:
        return False
    pixels = torch.from_numpy(to_display(x, config))  # (N, H, W, 3) in [0, 1]
    return bool((pixels.amax(-1) - pixels.amin(-1)).max() <= 1.5 / 255)

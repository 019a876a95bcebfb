"""The official pre-processing (paper Appendix B.1; official vit_jax input_pipeline) on PIL images, with the
randomness passed in explicitly.

Training: "inception crop" (random area 5%-100%, aspect ratio 3/4-4/3, resized to the target) and a random
horizontal flip. Evaluation: resize the short side to the target, then central crop. Transforms return uint8
(H, W, 3) arrays; `normalize` maps them to the range the weights expect on the device, so workers ship 1 byte
per value instead of 4 and the mean/std stay a property of the model (official: [-1, 1]).

Every random draw comes from a `random.Random` seeded per sample by the loader, so an augmented batch depends
only on (seed, position in the sample stream): the same with 0 or 8 workers, 1 or 2 processes, before or after
a resume.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

Size = tuple[int, int]  # (height, width)


def as_size(image_size: int | tuple[int, int] | list[int]) -> Size:
    if isinstance(image_size, int):
        return (image_size, image_size)
    return (int(image_size[0]), int(image_size[1]))


def inception_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: random.Random
) -> tuple[float, float, float, float]:
    """A crop box (left, top, right, bottom) as TF's `sample_distorted_bounding_box` draws it for the
    inception crop: area fraction and aspect ratio uniform in their ranges, 10 attempts, else the whole image.
    Boxes are fractional: PIL resamples from sub-pixel boxes, which matters for tiny images such as digits."""
    area = width * height
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = rng.uniform(*ratio)  # TF draws the ratio uniformly (torchvision: log-uniformly)
        w = math.sqrt(target_area * aspect)
        h = math.sqrt(target_area / aspect)
        if w <= width and h <= height:
            left = rng.uniform(0, width - w)
            top = rng.uniform(0, height - h)
            return (left, top, left + w, top + h)
    return (0.0, 0.0, float(width), float(height))


def _to_rgb_array(img: Image.Image) -> np.ndarray:
    arr = np.asarray(img, dtype=np.uint8)
    if arr.ndim == 2:  # grayscale sources (digits, MNIST) stay 1 channel until here: 3x less resampling
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return arr


@dataclass(frozen=True)
class TrainTransform:
    """Inception crop + random horizontal flip. Digits must not be flipped, so `flip` is a setting."""

    image_size: Size
    crop_scale: tuple[float, float] = (0.05, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True

    @property
    def min_source_size(self) -> int:
        """Smallest short side a JPEG may be decoded at (draft mode) so that the smallest crop still has the
        target's resolution."""
        return math.ceil(max(self.image_size) / math.sqrt(max(self.crop_scale[0], 1e-4)))

    def __call__(self, img: Image.Image, rng: random.Random) -> np.ndarray:
        box = inception_box(img.width, img.height, self.crop_scale, self.crop_ratio, rng)
        img = img.resize((self.image_size[1], self.image_size[0]), Image.Resampling.BILINEAR, box=box)
        if self.flip and rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return _to_rgb_array(img)


@dataclass(frozen=True)
class EvalTransform:
    """Resize the short side to the target, then central crop (big_vision's resize_small + central_crop),
    done as one resampling of the central source box."""

    image_size: Size

    @property
    def min_source_size(self) -> int:
        return max(self.image_size)

    def __call__(self, img: Image.Image, rng: random.Random | None = None) -> np.ndarray:
        th, tw = self.image_size
        scale = max(th / img.height, tw / img.width)  # source pixels -> target pixels
        ch, cw = th / scale, tw / scale  # the central source box that becomes the target
        left, top = (img.width - cw) / 2, (img.height - ch) / 2
        img = img.resize((tw, th), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))
        return _to_rgb_array(img)


def normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float32 ((x / 255) - mean) / std. Official weights: mean = std = 0.5, i.e.
    (x - 127.5) / 127.5 in [-1, 1]; timm/HF ImageNet weights use their own mean and std."""
    m = torch.tensor(mean, device=images.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    s = torch.tensor(std, device=images.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    return (images.float() - m) / s

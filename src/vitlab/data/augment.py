"""RandAugment and random erasing after the training crop, with their randomness a function of the sample's seed.

RandAugment (Cubuk et al. 2020) is torchvision's `transforms.v2.RandAugment`: N operations drawn uniformly from its
14 (identity, shear x/y, translate x/y, rotate, brightness, colour, contrast, sharpness, posterize, solarize,
autocontrast, equalize), each applied at one magnitude with a random sign where the operation has one. The
magnitude is a *level* on the scale of TF's RandAugment (EfficientNet `autoaugment.py`, which big_vision's
`randaug(N, M)` runs and AugReg's recipes name): level 10 is the operations' maximum in torchvision (rotate 30°,
shear 0.3, translate 150/331 of the side, enhance ±0.9, posterize to 4 bits, solarize at 0), which are TF's
values at level 10. AugReg uses levels 15 and 20: the geometric operations extend linearly past 10 as TF's do
(rotate 45° at 15, 60° at 20); the others stop where torchvision's range does (enhance factors within (0, 2),
posterize 4 bits, solarize at 0). At the integer levels 0-10 the result equals torchvision's stock RandAugment
with 11 magnitude bins, sample for sample (tests/data/test_augment.py). `randaug_mstd` > 0 draws each image's level
from N(level, std) clipped to [0, 20], as timm's `mstd` (DeiT: m9, mstd 0.5) does per image. Holes are filled
with grey 128, as TF's `replace` value.

Random erasing (Zhong et al. 2020, DeiT's `--reprob 0.25`, timm `RandomErasing(mode="pixel")`): with probability
p one box of 2%–33% of the area and aspect ratio in [0.3, 3.3] (log-uniform) is replaced by per-pixel noise,
N(0, 1) in the official [-1, 1] value range (mean 127.5, std 127.5 grey levels, clipped to uint8).

torchvision draws from torch's global generator: each call runs under `torch.random.fork_rng` seeded from the
sample's own `random.Random`, after the crop and flip have taken their draws, so an augmented batch stays a
function of (seed, step) with any number of workers and across a resume, and the crop is the one the same seed
gives without RandAugment.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import RandomErasing
from torchvision.transforms.v2 import RandAugment

MAX_LEVEL = 20  # AugReg's heaviest setting, randaug(2, 20)
_STEPS = 10  # magnitude bins per level: levels are used to 0.1
_ENHANCE_LIMIT = 0.99  # brightness/colour/contrast/sharpness factors 1 ± m stay positive
ERASE_SCALE, ERASE_RATIO = (0.02, 1 / 3), (0.3, 3.3)  # timm RandomErasing's defaults (DeiT)


def _linear(at_level_10: Any, limit: float | None = None) -> Any:
    """Magnitudes at levels 0, 0.1, …, MAX_LEVEL: level/10 of the value at level 10, capped at `limit`."""

    def magnitudes(num_bins: int, height: int, width: int) -> torch.Tensor:
        top = at_level_10(height, width)
        values = torch.linspace(0.0, top * MAX_LEVEL / 10, num_bins)
        values[: 10 * _STEPS + 1 : _STEPS] = torch.linspace(0.0, top, 11)  # levels 0-10: torchvision's own floats
        return values if limit is None else values.clamp(max=limit)

    return magnitudes


def _posterize(num_bins: int, height: int, width: int) -> torch.Tensor:
    levels = torch.arange(num_bins) / _STEPS
    return (8 - levels * 0.4).round().clamp(min=4).int()  # torchvision: 8 bits at level 0, 4 at level 10


def _solarize(num_bins: int, height: int, width: int) -> torch.Tensor:
    return torch.linspace(1.0, 1.0 - MAX_LEVEL / 10, num_bins).clamp(min=0.0)  # threshold, share of 255


class LevelRandAugment(RandAugment):
    """torchvision's RandAugment with its magnitude given as a level on TF's 0–10 scale, extended to 20 (see the
    module docstring). `level` is rounded to 0.1."""

    _AUGMENTATION_SPACE = {
        "Identity": (lambda num_bins, height, width: None, False),
        "ShearX": (_linear(lambda h, w: 0.3), True),
        "ShearY": (_linear(lambda h, w: 0.3), True),
        "TranslateX": (_linear(lambda h, w: 150.0 / 331.0 * w), True),
        "TranslateY": (_linear(lambda h, w: 150.0 / 331.0 * h), True),
        "Rotate": (_linear(lambda h, w: 30.0), True),
        "Brightness": (_linear(lambda h, w: 0.9, _ENHANCE_LIMIT), True),
        "Color": (_linear(lambda h, w: 0.9, _ENHANCE_LIMIT), True),
        "Contrast": (_linear(lambda h, w: 0.9, _ENHANCE_LIMIT), True),
        "Sharpness": (_linear(lambda h, w: 0.9, _ENHANCE_LIMIT), True),
        "Posterize": (_posterize, False),
        "Solarize": (_solarize, False),
        "AutoContrast": (lambda num_bins, height, width: None, False),
        "Equalize": (lambda num_bins, height, width: None, False),
    }

    def __init__(self, num_ops: int, level: float, fill: int = 128):
        if not 0 <= level <= MAX_LEVEL:
            raise ValueError(f"RandAugment magnitude must be in [0, {MAX_LEVEL}], got {level:g}")
        super().__init__(num_ops=num_ops, magnitude=round(level * _STEPS), num_magnitude_bins=MAX_LEVEL * _STEPS + 1,
                         fill=fill)


@dataclass(frozen=True)
class Augmented:
    """A training transform (crop + flip) followed by RandAugment (`randaug_ops` operations at level
    `randaug_magnitude` ± `randaug_mstd`; 0 operations: off) and random erasing with probability
    `random_erasing`. Called as the transform it wraps: (PIL image, random.Random) -> uint8 (H, W, 3)."""

    base: Any
    randaug_ops: int = 0
    randaug_magnitude: float = 0.0
    randaug_mstd: float = 0.0
    random_erasing: float = 0.0

    @property
    def image_size(self) -> tuple[int, int]:
        return self.base.image_size

    @property
    def min_source_size(self) -> int:
        return self.base.min_source_size

    def __call__(self, img: Any, rng: random.Random) -> np.ndarray:
        arr = self.base(img, rng)
        seed = rng.getrandbits(63)  # drawn after the crop and flip: they stay what the seed gives without these
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if self.randaug_ops:  # on a PIL image: torchvision's PIL kernels are faster than its uint8 ones
                arr = np.asarray(LevelRandAugment(self.randaug_ops, self._level())(Image.fromarray(arr)))
            if self.random_erasing and float(torch.rand(())) < self.random_erasing:
                x = torch.from_numpy(np.array(arr)).permute(2, 0, 1)  # (3, H, W) uint8, a writable copy
                arr = erase_with_noise(x).permute(1, 2, 0).numpy()
        return np.ascontiguousarray(arr)

    def _level(self) -> float:
        if self.randaug_mstd <= 0:
            return self.randaug_magnitude
        level = self.randaug_magnitude + self.randaug_mstd * float(torch.randn(()))
        return min(max(level, 0.0), float(MAX_LEVEL))


def erase_with_noise(x: torch.Tensor) -> torch.Tensor:
    """One random box of uint8 (3, H, W) `x` replaced by noise N(0, 1) in the [-1, 1] range (torch's generator)."""
    top, left, h, w, noise = RandomErasing.get_params(x, scale=ERASE_SCALE, ratio=ERASE_RATIO, value=None)
    if noise is x:  # no box fitted in 10 attempts: the image stays as it is
        return x
    out = x.clone()
    out[:, top : top + h, left : left + w] = (127.5 + 127.5 * noise).round().clamp(0, 255).to(torch.uint8)
    return out


def with_augmentation(base: Any, randaug_ops: int = 0, randaug_magnitude: float = 0.0, randaug_mstd: float = 0.0,
                      random_erasing: float = 0.0) -> Any:
    """`base`, or `base` followed by RandAugment / random erasing when either is on."""
    if not randaug_ops and not random_erasing:
        return base
    return Augmented(base, randaug_ops, randaug_magnitude, randaug_mstd, random_erasing)

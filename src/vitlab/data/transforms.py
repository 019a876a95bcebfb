"""The official pre-processing on PIL images, with the randomness passed in explicitly.

Training crops (`train_crop`):
- "inception": the official code's inception crop (vit_jax input_pipeline, big_vision
  `decode_jpeg_and_inception_crop`): TF's `sample_distorted_bounding_box(area_range=(0.05, 1),
  min_object_covered=0)`, i.e. the aspect ratio drawn uniformly, then an integer crop HEIGHT drawn uniformly
  between the heights of the smallest and largest allowed areas (clamped to the image), width = round(height ·
  aspect), up to 100 attempts, else the whole image. The crop is resized to the target and flipped with p = 0.5.
- "inception-subpixel": area fraction and aspect ratio uniform, fractional boxes, 10 attempts. Not TF's
  sampler (it favours larger crops: mean area 0.43 instead of 0.34 on a 500×375 image); kept for tiny images
  such as the 8×8 digits, where an integer box is a coarse choice among a handful of pixels.
- "resize-random-crop": BiT-HyperRule (Kolesnikov et al. 2020, big_transfer): the whole image resized to R×R,
  a random S×S crop, flip; R = 160 for S = 128, 448 for S = 384, otherwise round(S·8/7).

Evaluation resizes (`eval_resize`):
- "official": the whole image to S×S, aspect ratio ignored, no crop (vit_jax input_pipeline).
- "big_vision": short side to round(S·8/7) (256 for 224; 448 for 384, as big_vision's transfer configs), then
  the central S×S crop.
- "resize-short-crop": short side to S, then the central crop (what vitlab did before the choice existed).
- "timm:INTERPOLATION:CROP_PCT[:squash]" (constants.timm_resize): timm's evaluation transform
  (`transforms_imagenet_eval`), as timm's pretrained cfg states it for the weights of a timm name: the target
  scaled by 1/CROP_PCT and floored, the short side resized to it (both sides with ":squash"), the central S×S crop.
Few-shot evaluation ("fewshot", big_vision configs/common_fewshot.py): the whole image to 256×256, aspect
ignored, then the central 224 crop; scaled as round(S·8/7) (448 for 384) for other sizes.

Resampling is bilinear (PIL; a timm spelling: its interpolation). `TrainTransform(resize="tensor")` resizes the
integer crops with torch's antialiased bilinear kernel on uint8 instead (`F.interpolate(..., antialias=True)` on a
channels-last uint8 tensor, vectorised): PIL's filter (same support, half-pixel centres) within one grey level. Its
speed against PIL's per image on one core is measured by benchmarks/tensor_resize_ab.py (BENCHMARKS.md).

Transforms return uint8 (H, W, 3) arrays; `normalize` maps them to the range the weights expect on the device,
so workers ship 1 byte per value instead of 4 and the mean/std stay a property of the model (official: [-1, 1]).

Every random draw comes from a `random.Random` seeded per sample by the loader, so an augmented batch depends
only on (seed, position in the sample stream): the same with 0 or 8 workers, 1 or 2 processes, before or after
a resume.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitlab.constants import (  # noqa: F401  (EVAL_RESIZES, FEWSHOT_RESIZE: re-exported to vitlab.data, eval/)
    EVAL_RESIZES,
    FEWSHOT_RESIZE,
    TRAIN_CROPS,
    TRAIN_RESIZES,
    check_eval_resize,
    resize_before_crop,
    timm_resize,
)
from vitlab.data.sources import ImageSplit, check_pixels, to_rgb

Size = tuple[int, int]  # (height, width)
Box = tuple[float, float, float, float]  # (left, top, right, bottom) in source pixels, as PIL takes it

TF_MAX_ATTEMPTS = 100  # sample_distorted_bounding_box's default max_attempts
# The largest intermediate image a resize-then-crop materialises (64 MiB as PIL's 4-byte RGB): far above any
# photograph's (a 4:1 panorama's short side to 448 is 0.8 M pixels), far below an extreme aspect ratio's.
MAX_RESIZED_PIXELS = 1 << 24


def as_size(image_size: int | tuple[int, int] | list[int]) -> Size:
    if isinstance(image_size, int):
        return (image_size, image_size)
    return (int(image_size[0]), int(image_size[1]))


def bit_resize(size: int) -> int:
    """BiT-HyperRule's resize before its random crop (big_transfer: 160 → 128, 448 → 384)."""
    return {128: 160, 384: 448}.get(size, round(size * 8 / 7))


def tf_inception_box(
    width: int, height: int, area_range: tuple[float, float], ratio_range: tuple[float, float],
    rng: random.Random, max_attempts: int = TF_MAX_ATTEMPTS,
) -> tuple[int, int, int, int]:
    """An integer crop box (left, top, right, bottom) drawn as TF's `sample_distorted_bounding_box` kernel
    draws it (min_object_covered = 0, no bounding boxes): per attempt an aspect ratio uniform in
    `ratio_range`, then a crop. Whole image if no attempt succeeds."""
    for _ in range(max_attempts):
        aspect = ratio_range[0] + rng.random() * (ratio_range[1] - ratio_range[0])
        box = _tf_random_crop(width, height, area_range, aspect, rng)
        if box is not None:
            return box
    return (0, 0, width, height)


def _tf_random_crop(
    width: int, height: int, area_range: tuple[float, float], aspect: float, rng: random.Random
) -> tuple[int, int, int, int] | None:
    """One attempt (the kernel's GenerateRandomCrop). Heights are drawn, not areas: the crop's side length is
    uniform, so small crops are more likely than with a uniform area. Rounding is half-to-even (lrintf)."""
    min_area = area_range[0] * width * height
    max_area = area_range[1] * width * height
    h = round(math.sqrt(min_area / aspect))
    max_h = round(math.sqrt(max_area / aspect))
    if round(max_h * aspect) > width:  # the largest height whose rounded width still fits
        max_h = int((width + 0.5 - 1e-7) / aspect)
        if round(max_h * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += rng.randrange(max_h - h + 1)  # uniform in [h, max_h], both ends included
    w = round(h * aspect)
    if w * h < min_area:  # rounding made it too small: one pixel taller
        h += 1
        w = round(h * aspect)
    if w * h > max_area:  # too large: one pixel shorter
        h -= 1
        w = round(h * aspect)
    if not (min_area <= w * h <= max_area and 0 < w <= width and 0 < h <= height):
        return None
    top = rng.randrange(height - h) if h < height else 0  # Uniform(n) is [0, n): the last offset is never drawn
    left = rng.randrange(width - w) if w < width else 0
    return (left, top, left + w, top + h)


def subpixel_inception_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: random.Random
) -> Box:
    """A fractional crop box: area fraction and aspect ratio uniform in their ranges, 10 attempts, else the
    whole image. Not TF's sampler (see the module docstring); PIL resamples from sub-pixel boxes, which keeps
    crops of an 8×8 image varied."""
    area = width * height
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = rng.uniform(*ratio)
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


def tensor_resize(arr: np.ndarray, size: Size) -> torch.Tensor:
    """uint8 (H, W, C) or (H, W) -> uint8 (1, C, th, tw), channels-last: antialiased bilinear, as PIL's BILINEAR
    resize (its filter widens with the scale when shrinking). The array is seen as a channels-last (1, C, H, W)
    tensor with the batch stride of a whole image: with any other batch stride (a plain permute gives C) torch
    takes the batch as ambiguous, writes planes and the (H, W, C) result costs a transposing copy."""
    hwc = np.ascontiguousarray(arr if arr.ndim == 3 else arr[:, :, None])
    h, w, c = hwc.shape
    t = torch.as_strided(torch.from_numpy(hwc), (1, c, h, w), (h * w * c, 1, w * c, c))
    return torch.nn.functional.interpolate(t, size=size, mode="bilinear", antialias=True, align_corners=False)


def _tensor_to_array(t: torch.Tensor, flip: bool) -> np.ndarray:
    """(1, C, H, W) uint8 -> (H, W, C), or (H, W) for one channel (grayscale stays 1 channel until the end),
    mirrored left-right if `flip`."""
    hwc = t[0].permute(1, 2, 0)  # channels-last: a view
    arr = (hwc.flip(1) if flip else hwc).contiguous().numpy()
    return arr[:, :, 0] if arr.shape[2] == 1 else arr


def _crop_of_resized(img: Image.Image, resized: Size, top: int, left: int, size: Size,
                     resample: Image.Resampling = Image.Resampling.BILINEAR) -> Image.Image:
    """img resized to `resized` (h, w), then the `size` crop at integer offset (top, left). The whole image is
    resized when the result has at most MAX_RESIZED_PIXELS pixels: resampling only the matching source box moves
    the filter by float rounding (pixels of an upsampled digit one grey level off, BENCHMARKS.md "Bounds and
    choices in the code"). Beyond that (a 10000 x 1 image's short side to 256 is 2.6 GB) only the crop's box is
    resampled, at the same scale: what a resize costs is bounded by its output, not by the image's aspect ratio."""
    if resized[0] * resized[1] <= MAX_RESIZED_PIXELS:
        img = img.resize((resized[1], resized[0]), resample)
        return img.crop((left, top, left + size[1], top + size[0]))
    sy, sx = img.height / resized[0], img.width / resized[1]  # source pixels per resized pixel
    x0, x1 = left * sx, min(img.width, (left + size[1]) * sx)
    y0, y1 = top * sy, min(img.height, (top + size[0]) * sy)
    img = img.resize((size[1], img.height), resample, box=(x0, 0, x1, img.height))  # the rows, as PIL's first pass
    return img.resize((size[1], size[0]), resample, box=(0, y0, size[1], y1))


def _check_range(name: str, value: object, high: float) -> None:
    """A (low, high) pair of numbers with 0 < low <= high <= `high`, else ValueError naming it."""
    pair = tuple(value) if isinstance(value, tuple | list) else ()
    if not (len(pair) == 2 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
            and 0 < pair[0] <= pair[1] <= high and math.isfinite(pair[1])):
        bound = "" if math.isinf(high) else f" <= {high:g}"
        raise ValueError(f"{name} must be two numbers (low, high) with 0 < low <= high{bound}, got {value!r}")


@dataclass(frozen=True)
class TrainTransform:
    """Random crop (`crop`: one of TRAIN_CROPS) + random horizontal flip. Digits must not be flipped, so
    `flip` is a setting. `crop_scale` / `crop_ratio` are the inception crops' area and aspect ranges. `resize`
    (one of TRAIN_RESIZES) picks what resamples the crop; the random draws are the same for both."""

    image_size: Size
    crop_scale: tuple[float, float] = (0.05, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop: str = "inception"
    resize: str = "pil"

    def __post_init__(self) -> None:
        if self.crop not in TRAIN_CROPS:
            raise ValueError(f"unknown train crop {self.crop!r}; use one of {', '.join(TRAIN_CROPS)}")
        if self.resize not in TRAIN_RESIZES:
            raise ValueError(f"unknown train resize {self.resize!r}; use one of {', '.join(TRAIN_RESIZES)}")
        _check_range("crop_scale", self.crop_scale, 1.0)
        _check_range("crop_ratio", self.crop_ratio, math.inf)
        if self.resize == "tensor" and self.crop == "inception-subpixel":
            raise ValueError("train resize 'tensor' resamples integer crop boxes; the inception-subpixel crop draws "
                             "fractional ones: use train resize 'pil' or another train crop")

    @property
    def min_source_size(self) -> int:
        """Smallest short side a JPEG may be decoded at (draft mode) so that the smallest crop still has the
        target's resolution."""
        if self.crop == "resize-random-crop":
            return bit_resize(max(self.image_size))
        return math.ceil(max(self.image_size) / math.sqrt(max(self.crop_scale[0], 1e-4)))

    def __call__(self, img: Image.Image, rng: random.Random) -> np.ndarray:
        if self.resize == "tensor":
            return self._tensor_path(img, rng)
        th, tw = self.image_size
        if self.crop == "resize-random-crop":
            r = bit_resize(max(th, tw))
            top, left = rng.randrange(r - th + 1), rng.randrange(r - tw + 1)  # tf.image.random_crop: both ends
            img = _crop_of_resized(img, (r, r), top, left, (th, tw))
        elif self.crop == "inception":  # slice, then resize: only the crop's pixels enter it (tf.slice)
            box = tf_inception_box(img.width, img.height, self.crop_scale, self.crop_ratio, rng)
            img = img.crop(box).resize((tw, th), Image.Resampling.BILINEAR)
        else:
            box_f = subpixel_inception_box(img.width, img.height, self.crop_scale, self.crop_ratio, rng)
            img = img.resize((tw, th), Image.Resampling.BILINEAR, box=box_f)
        if self.flip and rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return _to_rgb_array(img)

    def _tensor_path(self, img: Image.Image, rng: random.Random) -> np.ndarray:
        """The same draws in the same order as the PIL path, resampled by `tensor_resize`. The crop is cut by
        PIL (a copy of the box alone) before the array copy out of PIL's pixel store."""
        th, tw = self.image_size
        if self.crop == "resize-random-crop":
            r = bit_resize(max(th, tw))
            top, left = rng.randrange(r - th + 1), rng.randrange(r - tw + 1)
            out = tensor_resize(np.array(img, dtype=np.uint8), (r, r))[:, :, top : top + th, left : left + tw]
        else:
            box = tf_inception_box(img.width, img.height, self.crop_scale, self.crop_ratio, rng)
            out = tensor_resize(np.array(img.crop(box), dtype=np.uint8), (th, tw))  # np.array: torch needs writable
        return _to_rgb_array(_tensor_to_array(out, self.flip and rng.random() < 0.5))


@dataclass(frozen=True)
class EvalTransform:
    """Deterministic resize to the target (`resize`: one of EVAL_RESIZES, FEWSHOT_RESIZE or a timm spelling)."""

    image_size: Size
    resize: str = "official"

    def __post_init__(self) -> None:
        check_eval_resize(self.resize)

    @property
    def min_source_size(self) -> None:
        """None: evaluation decodes every pixel. A JPEG drafted (DCT-scaled) to the resize's input size is not the
        image timm, transformers or the official code resize, so its evaluation pixels and logits would differ from
        theirs (BENCHMARKS.md "Bounds and choices in the code")."""
        return None

    def __call__(self, img: Image.Image, rng: random.Random | None = None) -> np.ndarray:
        th, tw = self.image_size
        if self.resize == "official":
            img = img.resize((tw, th), Image.Resampling.BILINEAR)
        elif self.resize == "resize-short-crop":
            img = _short_side_crop(img, (th, tw))
        elif (timm := timm_resize(self.resize)) is not None:
            img = _timm_eval_crop(img, (th, tw), *timm)
        else:
            r = resize_before_crop(max(th, tw))
            if self.resize == "big_vision":  # resize_small(r): short side to r, the other side rounded
                ratio = r / min(img.height, img.width)
                resized = (round(img.height * ratio), round(img.width * ratio))
            else:  # few-shot: resize(r), aspect ignored
                resized = (r, r)
            top, left = (resized[0] - th) // 2, (resized[1] - tw) // 2  # central_crop's integer offsets
            img = _crop_of_resized(img, resized, top, left, (th, tw))
        return _to_rgb_array(img)


def _short_side_crop(img: Image.Image, size: Size) -> Image.Image:
    """Short side to the target, then the central crop, as one resampling of the fractional central box."""
    th, tw = size
    scale = max(th / img.height, tw / img.width)  # source pixels -> target pixels
    ch, cw = th / scale, tw / scale  # the central source box that becomes the target
    left, top = (img.width - cw) / 2, (img.height - ch) / 2
    return img.resize((tw, th), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))


def _timm_eval_crop(img: Image.Image, size: Size, interpolation: str, crop_pct: float, crop_mode: str) -> Image.Image:
    """timm's evaluation resize and crop: the target scaled to floor(side / crop_pct); "center" resizes the short
    side to it (the long side truncated, as torchvision's Resize(int); for a non-square target the side that reaches
    its scaled size first, the other rounded, as timm's ResizeKeepRatio), "squash" both sides; then the central
    crop at offsets rounded half to even (torchvision's CenterCrop). Each step as timm does it, so the pixels are
    timm's."""
    th, tw = size
    sh, sw = math.floor(th / crop_pct), math.floor(tw / crop_pct)
    if crop_mode == "squash":
        resized = (sh, sw)
    elif sh == sw:
        long = int(sh * max(img.height, img.width) / min(img.height, img.width))
        resized = (sh, long) if img.height <= img.width else (long, sh)
    else:
        ratio = min(img.height / sh, img.width / sw)
        resized = (round(img.height / ratio), round(img.width / ratio))
    top, left = round((resized[0] - th) / 2), round((resized[1] - tw) / 2)
    return _crop_of_resized(img, resized, top, left, size, Image.Resampling[interpolation.upper()])


def normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float32 ((x / 255) - mean) / std. Official weights: mean = std = 0.5, i.e.
    (x - 127.5) / 127.5 in [-1, 1]; timm/HF ImageNet weights use their own mean and std."""
    m = torch.tensor(mean, device=images.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    s = torch.tensor(std, device=images.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    return (images.float() - m) / s


@dataclass
class ModelTransform:
    """A model's pre-processing as one callable, for Python users (`vitlab.transforms`): an image (PIL image,
    uint8 (H, W, 3) or (H, W) array, or a file path) -> float32 (3, H, W) normalised with the model's mean/std.
    It is the pipeline `vitlab eval` / `vitlab predict` run (same decoding, resize and normalisation: files are
    decoded exactly, as timm and transformers decode them); with a TrainTransform it is the training augmentation,
    its draws taken from `rng` (seeded once)."""

    base: EvalTransform | TrainTransform
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rng: random.Random | None = None

    def __call__(self, image: object) -> torch.Tensor:
        arr = self.base(as_pil_image(image, self.base.min_source_size), self.rng)
        x = torch.tensor(arr).permute(2, 0, 1)[None]  # (1, 3, H, W) uint8, as predict builds it
        return normalize(x, self.mean, self.std)[0]


def as_pil_image(image: object, min_size: int | None = None) -> Image.Image:
    """A PIL image as vitlab's data sources hand it to a transform: files decoded as `ImageSplit.load` decodes
    them (every pixel, then RGB; JPEG draft decoding down to `min_size` only when one is given: training),
    arrays as the embedded sets (uint8; grayscale stays 'L'), PIL images other than RGB/L converted to RGB. Images
    in memory are held to what files are (`sources.check_pixels`: the pixel budget, no side of 0)."""
    if isinstance(image, (str, Path)):
        return ImageSplit("image", np.zeros(1, dtype=np.int64), [], paths=[str(image)]).load(0, min_size)
    if isinstance(image, Image.Image):
        check_pixels(image.width, image.height)
        return image if image.mode in ("RGB", "L") else to_rgb(image)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
            raise ValueError(f"expected a uint8 (H, W, 3) or (H, W) array, got {image.dtype} {image.shape}; "
                             "convert with (x * 255).round().astype(np.uint8) for floats in [0, 1]")  # fmt: skip
        check_pixels(image.shape[1], image.shape[0])
        return Image.fromarray(image)
    raise ValueError(f"expected a PIL image, a uint8 array or an image path, got {type(image).__name__}; "
                     "a torch tensor is already pre-processed: pass the image it came from")  # fmt: skip


def model_transform(
    image_size: int | tuple[int, int], mean: tuple[float, ...], std: tuple[float, ...], eval_resize: str = "official",
    train: bool = False, seed: int = 0, **train_options: object,
) -> ModelTransform:
    """The eval pipeline at `image_size` with `eval_resize`, or (train=True) the training augmentation
    (TrainTransform's defaults: the official inception crop and flip; `train_options` override crop,
    crop_scale, crop_ratio, flip, resize) drawing from random.Random(seed)."""
    size = as_size(image_size)
    if train:
        try:
            augment = TrainTransform(size, **train_options)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(f"unknown training option in {sorted(train_options)}; use crop, crop_scale, "
                             "crop_ratio, flip, resize") from None  # fmt: skip
        return ModelTransform(augment, tuple(mean), tuple(std), random.Random(seed))
    if train_options:
        raise ValueError(f"{', '.join(train_options)}: training options apply only with train=True")
    return ModelTransform(EvalTransform(size, eval_resize), tuple(mean), tuple(std))

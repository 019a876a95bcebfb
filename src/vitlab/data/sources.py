"""Where the pixels come from: arrays in memory (the embedded sets) or image files (folders).

A split is a list of images plus integer labels; `ImageSplit.load(i)` returns a PIL image, every pixel decoded.
Given a `min_size` (training transforms give one, evaluation never does), a JPEG much larger than needed is decoded
in Pillow's draft mode: the decoder skips detail (DCT scaling by 1/2, 1/4 or 1/8), which makes decoding big photos
several times faster but changes the pixels, so only augmentation that crops and resamples afterwards may use it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from vitlab.data.containers import largest_member
from vitlab.errors import DataError, EnvironmentSettingError
from vitlab.files.reading import open_regular
from vitlab.ranges import MAX_IMAGE_PIXELS, POSITIVE_INT

# Errors Pillow raises for files it cannot decode: truncated (OSError), not an image (UnidentifiedImageError,
# an OSError), broken PNG chunks (SyntaxError), bad headers (ValueError), absurd sizes (DecompressionBombError,
# and vitlab's ImageTooLarge under it).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)

PIXELS_ENV = "VITLAB_MAX_IMAGE_PIXELS"


def pixel_budget() -> int:
    """The most pixels (width x height, as the header declares them) an image file may have to be decoded:
    $VITLAB_MAX_IMAGE_PIXELS, default MAX_IMAGE_PIXELS (8192 x 8192), never above Pillow's own refusal threshold
    (twice PIL.Image.MAX_IMAGE_PIXELS, checked by Pillow as it opens a file). The default admits a full-frame
    camera's photographs (61 megapixels: 9504 x 6336) and a phone's, and bounds what one image costs to decode:
    192 MiB as 8-bit RGB, where Pillow's threshold lets a PNG of a few hundred KB of zeros take gigabytes."""
    budget = _parse_budget(os.environ.get(PIXELS_ENV, "").strip())
    pillow = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else budget
    return min(budget, pillow)


@functools.lru_cache(maxsize=4)
def _parse_budget(text: str) -> int:
    if not text:
        return MAX_IMAGE_PIXELS
    try:
        return int(POSITIVE_INT.parse(text))
    except ValueError as err:
        raise EnvironmentSettingError(f"{PIXELS_ENV} {err}; set it to the most pixels an image may have, e.g. "
                                      f"{MAX_IMAGE_PIXELS} (the default), or unset it") from None


class ImageTooLarge(Image.DecompressionBombError):
    """An image whose header declares more pixels than `pixel_budget()`: refused before anything is decoded. A
    DecompressionBombError, so whatever handles Pillow's refusal handles this one."""


def open_image(source: Any) -> Image.Image:
    """`Image.open(source)`: the header read, nothing decoded; ImageTooLarge (one line: the size, the budget and
    how to raise it) when it declares more pixels than `pixel_budget()`, or when a member of a container (an ICO or
    ICNS icon) declares more (`data.containers`); ValueError for an image without pixels (a side of 0). The image
    is closed when refused."""
    budget = pixel_budget()  # a bad setting fails here, as itself, before Pillow's errors are caught as a bad file
    member = _largest_member(source)
    if member is not None:
        check_pixels(member[1], member[2], budget, f"its {member[0]} declares ")
    img = Image.open(source)
    try:
        check_pixels(*img.size, budget)
    except BaseException:
        img.close()
        raise
    return img


def _largest_member(source: Any) -> tuple[str, int, int] | None:
    """`data.containers.largest_member` of a path or a seekable file."""
    if isinstance(source, (str, os.PathLike)):
        with open_regular(source) as f:
            return largest_member(f)
    return largest_member(source)


def check_pixels(width: int, height: int, budget: int | None = None, what: str = "") -> None:
    """An image of width x height may be decoded (or, already decoded, transformed): ImageTooLarge over the pixel
    budget, ValueError for a side of 0 (no pixel to resize from). `what` starts the message ("its icon 0
    declares ")."""
    budget = pixel_budget() if budget is None else budget
    if width * height > budget:
        raise ImageTooLarge(f"{what}{width:,} x {height:,} = {width * height:,} pixels, over the budget of {budget:,} "
                            f"pixels an image may have; raise it with {PIXELS_ENV}=N if this image is wanted")
    if not width or not height:
        raise ValueError(f"{what}{width} x {height} pixels: an image without pixels cannot be resized")


def decode_rgb(source: Any, min_size: int | None = None) -> Image.Image:
    """A file or file-like image decoded to RGB; a JPEG at least twice `min_size` on its short side is drafted
    (DCT-scaled) down to no less than `min_size`. An image that decodes as RGB is returned as decoded:
    `convert("RGB")` would copy it, and for photographs that copy (a fresh mmap-ed buffer each time under
    glibc) cost as much as the decoding (BENCHMARKS.md "JPEG decoding on one core", benchmarks/decode.py).
    Raises one of DECODE_ERRORS for unreadable data (OSError for a path that is not a regular file: a FIFO
    named x.png would block Image.open forever); the file is closed either way."""
    if isinstance(source, (str, os.PathLike)):
        with open_regular(source) as f:
            return _decode(f, min_size, owned=True)
    return _decode(source, min_size, owned=False)


def _decode(source: Any, min_size: int | None, owned: bool) -> Image.Image:
    """`owned`: `source` is a file the caller closes, so a decoded image may be returned while it is open."""
    img = open_image(source)
    try:
        if min_size and img.format == "JPEG" and min(img.size) >= 2 * min_size:
            img.draft("RGB", (min_size, min_size))  # both sides stay >= min_size
        img.load()  # decodes: errors in the data surface here
    except BaseException:
        img.close()
        raise
    if img.mode == "RGB" and (owned or getattr(img, "fp", None) is None):  # loaded: the file is no longer read
        return img
    with img:
        return to_rgb(img)


# Pillow's modes for more than 8 bits per channel: 16-bit greyscale (PNG, TIFF; "I" where older Pillow widened it)
# and 32-bit float (TIFF). Pillow's own convert("RGB") clips them to 0-255: a 16-bit PNG saturates to white, a
# float TIFF in [0, 1] comes out black. They are scaled to 8 bits here instead, or refused.
WIDE_INT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_SLICE_PIXELS = 1 << 20  # wide images are scaled a slice of rows at a time, never widened whole


def to_rgb(img: Image.Image) -> Image.Image:
    """`img` as 8-bit RGB: 16-bit greyscale scaled by 255/65535 (rounded), float images with values in [0, 1]
    by 255 (rounded); ValueError (one of DECODE_ERRORS) for other float or 32-bit ranges. Wide images are
    converted in slices of rows, so the conversion needs the 8-bit result and one slice, not a 64-bit copy of
    the whole image."""
    if img.mode == "RGB":
        return img
    if img.mode not in (*WIDE_INT_MODES, "F"):
        return img.convert("RGB")
    grey = np.empty((img.height, img.width), dtype=np.uint8)
    for top, values in _row_slices(img):
        if not _in_range(values, img.mode):
            raise _out_of_range(img)
        grey[top : top + len(values)] = _to_8_bits(values, img.mode)
    return Image.fromarray(grey).convert("RGB")


def _row_slices(img: Image.Image) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, pixel values) of consecutive slices of about _SLICE_PIXELS pixels: each a copy of its rows only
    (np.asarray of a whole image copies all of it)."""
    rows = max(1, _SLICE_PIXELS // max(img.width, 1))
    for top in range(0, img.height, rows):
        with img.crop((0, top, img.width, min(img.height, top + rows))) as part:
            yield top, np.asarray(part)


def _in_range(values: np.ndarray, mode: str) -> bool:
    if not values.size:
        return True
    if mode == "F":
        return bool(np.isfinite(values).all() and values.min() >= 0 and values.max() <= 1)
    return bool(values.min() >= 0 and values.max() <= 65535)


def _to_8_bits(values: np.ndarray, mode: str) -> np.ndarray:
    if mode == "F":
        return np.round(values.astype(np.float64) * 255).astype(np.uint8)
    return ((values.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)  # 0 -> 0, 65535 -> 255, rounded


def _out_of_range(img: Image.Image) -> ValueError:
    """The refusal of an image whose values vitlab does not read, naming their range over the whole image."""
    lows, highs = zip(*((v.min(), v.max()) for _, v in _row_slices(img) if v.size), strict=True)
    low, high = np.min(lows), np.max(highs)  # NaN, if any, propagates as in values.min()
    if img.mode == "F":
        return ValueError(f"a floating-point image with values from {low:g} to {high:g}: vitlab reads float images "
                          "in [0, 1]; scale it to [0, 1] or save it as 8-bit")
    return ValueError(f"a 32-bit integer image with values from {low} to {high}: vitlab reads 8- and 16-bit images; "
                      "save it as 16-bit")


@dataclass
class ImageSplit:
    """One split of a dataset. Exactly one of `arrays` (uint8 (N, H, W) or (N, H, W, 3)) and `paths` is set."""

    name: str
    labels: np.ndarray  # int64 (N,)
    class_names: list[str]
    arrays: np.ndarray | None = None
    paths: list[str] | None = None
    strict: bool = False  # an image that fails to decode while loading is fatal (--strict), not skipped

    def __len__(self) -> int:
        return len(self.labels)

    def describe(self, i: int) -> str:
        return self.paths[i] if self.paths is not None else f"{self.name}[{i}]"

    def encoded(self, i: int) -> Any:
        """What Image.open reads for file-backed image i (a path here, the bytes for shards): for header-only
        probes that must not decode."""
        return self.paths[i]

    def image_size(self, i: int) -> tuple[int, int]:
        """(height, width) of file-backed image i, from its header (nothing decoded)."""
        with open_image(self.encoded(i)) as img:
            return img.height, img.width

    def load(self, i: int, min_size: int | None = None) -> Image.Image:
        """The i-th image; grayscale arrays stay 'L', files become 'RGB'. `min_size` allows JPEG draft
        decoding down to that short side. Raises one of DECODE_ERRORS for unreadable files."""
        if self.arrays is not None:
            return Image.fromarray(self.arrays[i])
        return decode_rgb(self.encoded(i), min_size)  # a path here, bytes for shards and Arrow rows

    def storage_blocks(self) -> np.ndarray | None:
        """Lengths of the runs of consecutive samples stored together (tar shards, Arrow files), in index order,
        summing to len(self); None when any sample is as cheap to reach as any other (arrays, image files).
        With blocks, training reads them as streams (`StreamOrder`): whole blocks in a seeded order, locally
        shuffled, instead of a permutation that jumps across the whole dataset at every sample."""
        return None

    def holdout(self, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(keep, held_out) indices for --val-fraction: a stratified share of each class by default."""
        return stratified_holdout(self.labels, fraction, seed)

    def describe_holdout(self, fraction: float, seed: int = 0) -> str:
        """`holdout` in words, for result files (without the closing parenthesis: callers may add a reason)."""
        return f"{100 * fraction:g}% of each class held out from the train split (stratified, seed {seed}"

    def subset(self, indices: np.ndarray, name: str) -> ImageSplit:
        arrays = self.arrays[indices] if self.arrays is not None else None
        paths = [self.paths[i] for i in indices] if self.paths is not None else None
        return ImageSplit(name, self.labels[indices], self.class_names, arrays, paths, self.strict)


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(keep, held_out) index arrays: `fraction` of each class held out (at least one image of every class
    that has two or more). The seed is fixed by default so a split is the same for every training seed."""
    rng = np.random.RandomState(seed)
    keep, held = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        n = int(round(fraction * len(idx)))
        if fraction > 0 and len(idx) >= 2:
            n = min(max(n, 1), len(idx) - 1)
        held.append(idx[:n])
        keep.append(idx[n:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(held))


def run_lengths(values: np.ndarray) -> np.ndarray:
    """Lengths of the runs of equal consecutive values: the storage blocks of samples that record their block."""
    if not len(values):
        return np.zeros(0, np.int64)
    return np.diff(np.concatenate([[0], np.flatnonzero(np.diff(values)) + 1, [len(values)]]))


def relabel_by_name(labels: np.ndarray, recorded: list[str] | None, wanted: list[str] | None,
                    where: str) -> np.ndarray:
    """Labels in the order of `wanted` (the training split's or a model's classes), matched by class name as
    the folder reader does; labels without recorded names keep their indices. DataError naming `where` for
    classes outside `wanted`."""
    if wanted is None or recorded is None or list(recorded) == list(wanted):
        return labels
    unknown = sorted(set(recorded) - set(wanted))
    if unknown:
        raise DataError(f"{where} has classes unknown to the {len(wanted)} training classes: "
                        f"{', '.join(unknown[:5])}; use data with the same classes")
    return np.array([list(wanted).index(c) for c in recorded], dtype=np.int64)[labels]

"""Stroke glyphs: pen strokes drawn by a formula, close to handwriting, so pre-training data of any size grows on a
CPU without a download. `--data strokes:C:N[:SEED]`: C classes, N training and max(1, N // 10) validation images
per class, seed 0 unless given (the grammar and rules of `fractal:C:N[:SEED]`, data/synthetic.py).

- A class is a glyph of MIN_STROKES to MAX_STROKES pen strokes, each a cubic Bézier curve whose four control
  points are a random walk that turns by at most TURN between legs of STEP of the frame; a stroke starts where
  the previous one ended with probability JOINED (a pen that is not lifted), else anywhere. The glyph's control
  points are then scaled into the middle BOX of the frame (aspect kept; a Bézier curve stays inside the hull of
  its control points, so the strokes do too). The class also draws its pen width in WIDTH px. Class c comes
  from a generator seeded by (seed, c): strokes:4:N's classes are the first four of strokes:8:N's.
- An instance moves every control point by Gaussian noise of POINT_NOISE of the frame, then applies one small
  random affine map about the centre (rotation within ROTATION, scale in SCALE, anisotropy in ASPECT, shear in
  SHEAR, shift within SHIFT) and multiplies the pen width by a draw in WIDTH_JITTER. Instance i is row i of
  draws from streams seeded by (seed, c, split): train and val never share an image, and strokes:C:16's images
  are the first 16 of strokes:C:32's.
- Rendering (vectorised numpy, many images at once): points at most SPACING px apart along each curve; every
  pixel centre closer than the pen radius + 0.5 px to a point takes the coverage clip(radius + 0.5 - distance,
  0, 1) (a linear ramp across the pixel: anti-aliasing), and a pixel keeps the largest coverage of any point (a
  pen draws the union of its discs: overlaps do not add up). White strokes on black, one grey channel as MNIST
  (ImageSplit keeps grey arrays as mode 'L'; the transforms make the 3 channels at the end): a third of the
  memory of RGB.

RENDER_SIZE is 32: the size the pre-training candidates train at (32x32 ViT/BiT models), so no resize blurs the
strokes; a 2 px pen at 32 px is MNIST's stroke-to-frame ratio (about 2.5 px at 28 px). 64 px would cost four
times the memory (strokes:64:2048 is 144k images: 148 MB at 32 px, 590 MB at 64 px) for detail a 32 px model
does not see.

Rendering is fast next to fractal.py's, but a large split still takes tens of seconds and every torchrun rank
and every `vitlab eval` would render it again, so rendered splits are cached (compressed .npz, loaded in a
fraction of the time; the figures: BENCHMARKS.md "Synthetic generators", measured by `benchmarks/generators.py`)
under <vitlab cache>/strokes/, keyed by everything that decides the pixels (GENERATOR_VERSION, RENDER_SIZE, seed, C,
N), as fractal.py does.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from vitlab.data import synthetic
from vitlab.data.errors import log
from vitlab.data.sources import ImageSplit
from vitlab.data.synthetic import SyntheticSpec

RENDER_SIZE = 32  # px (see the module docstring)
PREFIX = "strokes:"
MIN_STROKES, MAX_STROKES = 2, 5
STEP = (0.18, 0.4)  # length of each leg of a stroke's control polygon, in frames
TURN = np.pi * 0.6  # largest change of direction between legs: bends and hooks, not zig-zags
JOINED = 0.4  # probability that a stroke starts where the previous one ended
BOX = (0.14, 0.86)  # the part of the frame a class's glyph is scaled into
WIDTH = (1.6, 2.6)  # a class's pen width in px at RENDER_SIZE (MNIST: about 2.5 px at 28 px)
POINT_NOISE = 0.04  # std of each control point's offset, in frames
ROTATION = np.radians(15)
SCALE = (0.8, 1.15)
ASPECT = 0.1  # log of the largest ratio between the two axes' scale
SHEAR = 0.2
SHIFT = 0.08  # in frames
WIDTH_JITTER = (0.8, 1.25)
SPACING = 0.5  # px between the points a curve is drawn with: a pixel's distance to the curve is off by < 0.03 px
BATCH_POINTS = 16_384  # curve points per call of splat: its temporaries (~2 MB) stay in the CPU's cache
GENERATOR_VERSION = 1  # part of the cache key: bump when anything above or below changes the pixels
_SOURCE = 0x5354  # keeps these generators' streams apart from other sources'
Glyph = list[np.ndarray]  # one (4, 2) array of control points per stroke, (x, y) in frames, y down


def is_strokes_source(data: str) -> bool:
    return synthetic.is_source(data, PREFIX)


def parse_spec(data: str) -> SyntheticSpec:
    """`strokes:C:N[:SEED]` -> SyntheticSpec; DataError naming the fix for anything else or too large."""
    return synthetic.parse_spec(data, PREFIX, RENDER_SIZE**2)


# ---- classes and instances -------------------------------------------------------------------------------------


def sample_glyph(rng: np.random.Generator) -> tuple[Glyph, float]:
    """A class: its strokes' control points, scaled into BOX, and its pen width in px at RENDER_SIZE."""
    strokes, end = [], None
    for _ in range(int(rng.integers(MIN_STROKES, MAX_STROKES + 1))):
        start = end if end is not None and rng.random() < JOINED else rng.uniform(0.2, 0.8, 2)
        heading, points = rng.uniform(0, 2 * np.pi), [start]
        for _ in range(3):
            step = rng.uniform(*STEP) * np.array([np.cos(heading), np.sin(heading)])
            points.append(np.clip(points[-1] + step, 0.0, 1.0))
            heading += rng.uniform(-TURN, TURN)
        strokes.append(np.array(points))
        end = points[-1]
    return fit_box(strokes), float(rng.uniform(*WIDTH))


def fit_box(strokes: Glyph) -> Glyph:
    """The strokes scaled (aspect kept) and centred into BOX."""
    points = np.concatenate(strokes)
    lo, hi = points.min(axis=0), points.max(axis=0)
    scale = (BOX[1] - BOX[0]) / max(float((hi - lo).max()), 1e-6)
    return [(s - (lo + hi) / 2) * scale + 0.5 for s in strokes]


def jitter(glyph: Glyph, width: float, uniform: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n instances of a class from their draws: uniform (n, 7) in [0, 1), noise (n, strokes * 8) standard normal.
    Each instance's control points get noise of POINT_NOISE, then one affine map about the centre: (n, strokes,
    4, 2) control points and (n,) pen widths."""
    lerp = synthetic.lerp
    angle, scale = lerp(uniform[:, 0], -ROTATION, ROTATION), lerp(uniform[:, 1], *SCALE)
    aspect, shear = np.exp(lerp(uniform[:, 2], -ASPECT, ASPECT)), lerp(uniform[:, 3], -SHEAR, SHEAR)
    cos, sin = np.cos(angle), np.sin(angle)
    # rotate @ [[1, shear], [0, 1]] @ diag(scale * aspect, scale / aspect), one (2, 2) matrix per instance
    sx, sy = scale * aspect, scale / aspect
    affine = np.stack([np.stack([cos * sx, (cos * shear - sin) * sy], -1),
                       np.stack([sin * sx, (sin * shear + cos) * sy], -1)], -2)  # (n, 2, 2)
    shift = lerp(uniform[:, 4:6], -SHIFT, SHIFT)  # (n, 2)
    points = np.stack(glyph)[None] + POINT_NOISE * noise.reshape(len(noise), len(glyph), 4, 2)  # (n, S, 4, 2)
    moved = np.einsum("nij,nskj->nski", affine, points - 0.5) + 0.5 + shift[:, None, None]
    return moved, width * lerp(uniform[:, 6], *WIDTH_JITTER)


def draw_classes(seed: int, count: int) -> list[tuple[Glyph, float]]:
    """The first `count` classes of `seed`."""
    return [sample_glyph(synthetic.class_generator(_SOURCE, seed, c)) for c in range(count)]


def draw_instances(seed: int, c: int, split: str, glyph: Glyph, width: float,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """Instances 0..n-1 of class c in a split. Instance i is row i of two streams seeded by (seed, c, split) (a
    generator per instance costs more than drawing it), and row i does not depend on n: strokes:C:16's instances
    are the first 16 of strokes:C:32's."""
    uniform = synthetic.split_generator(_SOURCE, seed, c, split, 0).random((n, 7))
    noise = synthetic.split_generator(_SOURCE, seed, c, split, 1).standard_normal((n, 8 * len(glyph)))
    return jitter(glyph, width, uniform, noise)


# ---- the pixels --------------------------------------------------------------------------------------------------


def curve_points(strokes: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points along cubic Bézier curves, strokes (M, 4, 2) control points in px: (P, 2) points at most SPACING px
    apart and (P,) owner of each. Points are evenly spaced in t; the curve's speed |B'(t)| is at most 3 times its
    longest control leg (B' is a Bézier curve of the legs times 3, inside their hull), which sets their count."""
    speed = 3 * np.linalg.norm(np.diff(strokes, axis=1), axis=2).max(axis=1)  # (M,) px per unit of t
    n = np.maximum(2, np.ceil(speed / SPACING).astype(np.int64) + 1)
    first = np.cumsum(n) - n  # index of each stroke's first point
    t = (np.arange(n.sum()) - np.repeat(first, n)).astype(np.float32) / np.repeat(n - 1, n).astype(np.float32)
    p0, p1, p2, p3 = strokes.astype(np.float32).transpose(1, 0, 2)  # each (M, 2)
    # the curve in powers of t (Horner's rule), coefficients repeated per point: fewer operations than Bernstein's
    coefficients = (p3 - p0 + 3 * (p1 - p2), 3 * (p0 - 2 * p1 + p2), 3 * (p1 - p0), p0)
    t = t[:, None]
    xy = np.repeat(coefficients[0], n, axis=0)
    for a in coefficients[1:]:
        xy *= t
        xy += np.repeat(a, n, axis=0)
    return xy, np.repeat(owner, n)


def splat(xy: np.ndarray, image: np.ndarray, radius: np.ndarray, images: int, size: int) -> np.ndarray:
    """(images, size, size) float32 coverage in [0, 1]: point k (xy (P, 2) px) of image[k] draws a pen disc of
    radius[k] px; each pixel keeps its largest coverage clip(radius + 0.5 - distance, 0, 1) over the points."""
    out = np.zeros(images * size * size, np.float32)
    if not len(xy):
        return out.reshape(images, size, size)
    reach = int(np.ceil(radius.max()))  # pixel centres farther than radius + 0.5 in x or y get no coverage
    offsets = np.arange(-reach, reach + 1, dtype=np.int32)
    xy = xy.astype(np.float32)
    col = np.floor(xy[:, 0]).astype(np.int32)[:, None] + offsets  # (P, K)
    row = np.floor(xy[:, 1]).astype(np.int32)[:, None] + offsets
    # float32 throughout (int32 + float32 is float64): a float64 value makes np.maximum.at many times slower
    dx2 = np.square(col.astype(np.float32) + np.float32(0.5) - xy[:, :1])  # (P, K)
    dy2 = np.square(row.astype(np.float32) + np.float32(0.5) - xy[:, 1:])
    dx2[(col < 0) | (col >= size)] = np.inf  # outside the frame: no coverage, and folded onto its edge below
    dy2[(row < 0) | (row >= size)] = np.inf
    cover = (radius.astype(np.float32) + np.float32(0.5))[:, None, None] - np.sqrt(dx2[:, None, :] + dy2[:, :, None])
    np.clip(cover, 0.0, 1.0, out=cover)  # (P, K, K)
    np.clip(row, 0, size - 1, out=row)
    np.clip(col, 0, size - 1, out=col)
    flat = (image.astype(np.int32) * size * size)[:, None, None] + (row * size)[:, :, None] + col[:, None, :]
    np.maximum.at(out, flat.ravel(), cover.ravel())
    return out.reshape(images, size, size)


def render(strokes: np.ndarray, owner: np.ndarray, widths: np.ndarray, size: int = RENDER_SIZE) -> np.ndarray:
    """(B, size, size) uint8 images (white on black) of B = len(widths) glyphs: strokes (M, 4, 2) control points
    in frames, owner (M,) the image of each stroke (non-decreasing), widths (B,) in px at RENDER_SIZE. Images are
    rendered BATCH_POINTS curve points at a time; each image's pixels do not depend on the batches."""
    images = np.empty((len(widths), size, size), np.uint8)
    xy, point_owner = curve_points(strokes * size, owner)
    radius = np.asarray(widths, float) * (size / RENDER_SIZE) / 2
    ends = np.searchsorted(point_owner, np.arange(len(widths) + 1))  # image b's points: ends[b]:ends[b + 1]
    start = 0
    while start < len(widths):
        stop = max(start + 1, int(np.searchsorted(ends, ends[start] + BATCH_POINTS, side="right")) - 1)
        stop = min(stop, len(widths))
        a, b = ends[start], ends[stop]
        cover = splat(xy[a:b], point_owner[a:b] - start, radius[point_owner[a:b]], stop - start, size)
        images[start:stop] = np.rint(255 * cover)
        start = stop
    return images


def render_glyphs(glyphs: list[np.ndarray], widths: np.ndarray, size: int = RENDER_SIZE) -> np.ndarray:
    """(B, size, size) uint8 images of B glyphs, each (S_b, 4, 2) control points in frames."""
    owner = np.repeat(np.arange(len(glyphs)), [len(g) for g in glyphs])
    return render(np.concatenate(glyphs) if glyphs else np.zeros((0, 4, 2)), owner, np.asarray(widths), size)


# ---- splits ------------------------------------------------------------------------------------------------------


def render_split(spec: SyntheticSpec, split: str, classes: list[tuple[Glyph, float]],
                 size: int = RENDER_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(images (C * n, size, size) uint8, labels (C * n,) int64), class-major, of one split."""
    n, strokes, owner, widths = spec.count(split), [], [], []
    for c, (glyph, width) in enumerate(classes):
        moved, w = draw_instances(spec.seed, c, split, glyph, width, n)  # (n, S, 4, 2), (n,)
        strokes.append(moved.reshape(-1, 4, 2))
        owner.append(np.repeat(np.arange(c * n, (c + 1) * n), len(glyph)))
        widths.append(w)
    images = render(np.concatenate(strokes), np.concatenate(owner), np.concatenate(widths), size)
    return images, np.repeat(np.arange(spec.classes, dtype=np.int64), n)


def strokes_splits(data: str) -> tuple[ImageSplit, ImageSplit]:
    """(train, val) of `strokes:C:N[:SEED]`: rendered once and kept in the cache."""
    return _splits(parse_spec(data))


@lru_cache(maxsize=2)  # loading a large spec takes a while; the arrays are never modified
def _splits(spec: SyntheticSpec) -> tuple[ImageSplit, ImageSplit]:
    arrays = synthetic.cached_splits(spec, cache_path(spec), (RENDER_SIZE, RENDER_SIZE), lambda: _render_all(spec))
    names = synthetic.class_names("strokes", spec.classes)
    return (ImageSplit("train", arrays["train_labels"], names, arrays=arrays["train_images"]),
            ImageSplit("val", arrays["val_labels"], names, arrays=arrays["val_images"]))


def cache_path(spec: SyntheticSpec) -> Path:
    return synthetic.cache_path(spec, GENERATOR_VERSION, RENDER_SIZE)


def _render_all(spec: SyntheticSpec) -> dict[str, np.ndarray]:
    if spec.images > 20_000:
        log.info("rendering %s (%d images)", spec.name, spec.images)
    classes, out = draw_classes(spec.seed, spec.classes), {}
    for split in synthetic.SPLITS:
        out[f"{split}_images"], out[f"{split}_labels"] = render_split(spec, split, classes)
    return out


__all__ = ["GENERATOR_VERSION", "PREFIX", "RENDER_SIZE", "cache_path", "draw_classes", "draw_instances",
           "is_strokes_source", "jitter", "parse_spec", "render", "render_glyphs", "render_split", "sample_glyph",
           "strokes_splits"]

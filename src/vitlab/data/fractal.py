"""FractalDB: images drawn by a formula, so pre-training data grows on a CPU without a download (Kataoka et al.,
"Pre-training without Natural Images", ACCV 2020). `--data fractal:C:N[:SEED]`: C categories, N training and
max(1, N // 10) validation images per category, seed 0 unless given.

- A category is an iterated function system (IFS): 2 to 8 affine maps w_j(x) = A_j x + b_j whose six
  parameters are uniform in [-1, 1]; the chaos game applies map j with probability proportional to |det A_j|.
  As in the paper, a system is kept only if its fractal fills enough of the image (the filling-rate filter,
  here FILL_THRESHOLD of the RENDER_SIZE frame: it rejects systems that collapse to a point or a line or
  diverge); in addition at most MAX_STRAY of the filled pixels may hold a single point, which rejects the
  heavy-tailed systems that draw a dense dot in a cloud of stray points (noise that the filling rate counts as
  filled). Category c is drawn from its own generator, seeded by (seed, c): fractal:4:N's categories are the
  first four of fractal:8:N's.
- An instance (the paper's intra-category augmentation) multiplies one parameter of one map by a weight drawn
  uniformly in WEIGHTS (the paper uses a few fixed weights around 1; continuous here, so no two coincide),
  flips the image (none, left-right, up-down, both) and gives each map a random hue, so colour says nothing
  about the category. It is seeded by (seed, c, split, i): train and val never share an image, and fractal:C:16's
  images are the first 16 of fractal:C:32's. An instance the weight spoils (it fails the filters) is drawn again.
- Rendering: the chaos game on many independent chains at once (the first BURN_IN points of each discarded),
  the points' box (less TRIM of the points at each end of each axis: one far stray point would shrink the rest
  to a dot) scaled into the frame with its aspect kept; each pixel takes the hit-weighted mean hue of the maps
  that reached it and a brightness growing with log(1 + hits). The paper draws coloured points too; its 3x3
  patches would blur a 64 px image, so points stay single pixels here.

Rendered splits are cached (compressed .npz) under <vitlab cache>/fractal/, keyed by everything that decides the
pixels, so DataLoader workers, other ranks and later runs load them instead of rendering again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.data import synthetic
from vitlab.data.errors import log
from vitlab.data.sources import ImageSplit
from vitlab.data.synthetic import SyntheticSpec
from vitlab.progress import progress

RENDER_SIZE = 64  # px: ViTs on small machines train at 32-64 px, and the train transforms resize anyway
POINTS = 20_480  # chaos-game points per image at RENDER_SIZE: about 5 per pixel of a frame the fractal fills
FILL_THRESHOLD = 0.12  # share of the RENDER_SIZE frame a fractal must fill (the paper: 0.2 at its larger size)
WEIGHTS = (0.8, 1.2)  # the range of an instance's parameter weight
MIN_MAPS, MAX_MAPS = 2, 8
STEPS = 128  # points kept per chain: chains = points / STEPS run side by side
BURN_IN = 24  # points discarded per chain while it converges onto the attractor
MARGIN = 0.03  # share of the frame left empty on each side
TRIM = 0.001  # share of points on each side left out of the frame: one far stray point would shrink the rest
MAX_STRAY = 0.3  # largest share of a fractal's filled pixels that may hold a single point (passes_filter)
MAX_ROUNDS = 1000  # candidates drawn per IFS before giving up
CHUNK = 4096  # images rendered per call of draw_filled
GENERATOR_VERSION = 1  # part of the cache key: bump when anything above or below changes the pixels
PREFIX = "fractal:"
_CATEGORY, _INSTANCE = 1, 2  # first seed word: category and instance generators never share a stream
Candidate = tuple[np.ndarray, np.ndarray, int]  # an IFS to render: parameters (n, 6), a hue per map, flip 0-3


class FractalSpec(SyntheticSpec):
    """`fractal:C:N[:SEED]`: the drawn sources' spec (data/synthetic.py) whose classes are FractalDB's categories."""

    def __init__(self, categories: int, per_class: int, seed: int = 0):
        super().__init__(PREFIX, categories, per_class, seed)


def is_fractal_source(data: str) -> bool:
    return synthetic.is_source(data, PREFIX)


def parse_spec(data: str) -> FractalSpec:
    """`fractal:C:N[:SEED]` -> FractalSpec; DataError naming the fix for anything else or too large."""
    spec = synthetic.parse_spec(data, PREFIX, RENDER_SIZE**2 * 3)
    return FractalSpec(spec.classes, spec.per_class, spec.seed)


# ---- the IFS and its instances ---------------------------------------------------------------------------------


def sample_ifs(rng: np.random.Generator) -> np.ndarray:
    """(n, 6) parameters (a, b, c, d, e, f) of n in [2, 8] maps: A = [[a, b], [c, d]], b = (e, f)."""
    n = int(rng.integers(MIN_MAPS, MAX_MAPS + 1))
    return rng.uniform(-1.0, 1.0, (n, 6))


def map_probabilities(params: np.ndarray) -> np.ndarray:
    """Each map's probability in the chaos game: |det A_j|, normalised (equal if every map is singular)."""
    det = np.abs(params[:, 0] * params[:, 3] - params[:, 1] * params[:, 2])
    return det / det.sum() if det.sum() > 0 else np.full(len(det), 1 / len(det))


def category_generator(seed: int, c: int) -> np.random.Generator:
    return np.random.default_rng([_CATEGORY, seed, c])


def instance_generator(seed: int, c: int, split: str, i: int) -> np.random.Generator:
    return np.random.default_rng([_INSTANCE, seed, c, synthetic.SPLITS[split], i])


def perturb(base: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """An instance of a category: (parameters with one of them weighted, a hue per map, flip code 0-3)."""
    params = base.copy()
    params[rng.integers(len(params)), rng.integers(6)] *= rng.uniform(*WEIGHTS)
    return params, rng.random(len(params)), int(rng.integers(4))


# ---- the chaos game and the pixels ---------------------------------------------------------------------------


def chaos_game(
    systems: list[np.ndarray], rngs: list[np.random.Generator], points: int
) -> tuple[np.ndarray, np.ndarray]:
    """Points of several IFS at once: (B, 2, points) coordinates and (B, points) the map that drew each.

    Each system runs ceil(points / STEPS) chains from uniform starts in [-1, 1]^2; every random draw of system b
    comes from rngs[b], so a system's points do not depend on the others in the batch."""
    n, chains = len(systems), -(-points // STEPS)
    table = np.zeros((6, n * MAX_MAPS))  # column b * MAX_MAPS + j: map j of system b; padding is never drawn
    pick = np.empty((BURN_IN + STEPS, n, chains), np.int64)  # the column each chain applies at each step
    x, y = np.empty((n, chains)), np.empty((n, chains))
    for b, (params, rng) in enumerate(zip(systems, rngs, strict=True)):
        table[:, b * MAX_MAPS: b * MAX_MAPS + len(params)] = params.T
        x[b], y[b] = rng.uniform(-1.0, 1.0, (2, chains))
        cdf = np.cumsum(map_probabilities(params))[:-1]  # map j where cdf[j-1] <= u < cdf[j]
        pick[:, b] = b * MAX_MAPS + np.searchsorted(cdf, rng.random((BURN_IN + STEPS, chains)), side="right")
    kept = np.empty((n, 2, STEPS, chains))
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging system overflows; it renders empty
        for s in range(BURN_IN + STEPS):
            a, b_, c, d, e, f = np.take(table, pick[s], axis=1)  # each (n, chains); take: faster than []
            x, y = a * x + b_ * y + e, c * x + d * y + f
            if s >= BURN_IN:
                kept[:, 0, s - BURN_IN], kept[:, 1, s - BURN_IN] = x, y
    maps = (pick[BURN_IN:] % MAX_MAPS).transpose(1, 0, 2).reshape(n, -1)[:, :points]
    return kept.reshape(n, 2, -1)[..., :points], maps


def hit_counts(xy: np.ndarray, maps: np.ndarray, size: int) -> np.ndarray:
    """(B, MAX_MAPS, size, size) hits per map and pixel: the points' bounding box scaled into the frame with its
    aspect kept (row 0 at the top: y points up). A system with a non-finite or zero-size box has no hits."""
    shape = (len(xy), MAX_MAPS, size, size)
    with np.errstate(invalid="ignore"):
        ok = np.flatnonzero(np.isfinite(xy.max(axis=(1, 2)) - xy.min(axis=(1, 2))))  # NaN/inf: it diverged
    if len(ok) < len(xy):
        xy, maps = xy[ok], maps[ok]
    k = int(TRIM * xy.shape[2])
    ends = np.partition(xy, (k, -1 - k), axis=2)  # each axis's k-th smallest and largest value in place
    lo, hi = ends[..., k], ends[..., -1 - k]  # (B', 2)
    span = (hi - lo).max(axis=1)
    keep = span > 0  # a system collapsed to one point has no hits
    ok, xy, maps, lo, hi, span = ok[keep], xy[keep], maps[keep], lo[keep], hi[keep], span[keep]
    scale, centre = (size * (1 - 2 * MARGIN) / span)[:, None], (lo + hi) / 2
    col = (xy[:, 0] - centre[:, :1]) * scale + size / 2  # (B', P)
    row = (centre[:, 1:] - xy[:, 1]) * scale + size / 2  # y points up, rows down
    inside = (col >= 0) & (col < size) & (row >= 0) & (row < size)  # the trimmed points fall outside
    flat = (ok[:, None] * MAX_MAPS + maps) * (size * size) + row.astype(np.int64) * size + col.astype(np.int64)
    return np.bincount(flat[inside], minlength=int(np.prod(shape))).reshape(shape)


def passes_filter(counts: np.ndarray) -> np.ndarray:
    """(B,) bool: the fractal fills at least FILL_THRESHOLD of the frame, and at most MAX_STRAY of the pixels
    it fills hold a single point (more is a heavy-tailed cloud of stray points around a dense core: noise)."""
    total = counts.sum(axis=1)
    filled, stray = (total > 0).sum(axis=(1, 2)), (total == 1).sum(axis=(1, 2))
    return (filled >= FILL_THRESHOLD * total[0].size) & (stray <= MAX_STRAY * filled)


def hue_rgb(hue: np.ndarray) -> np.ndarray:
    """(..., 3) RGB of fully saturated, full-value hues in [0, 1)."""
    h = 6.0 * hue[..., None]
    return np.clip(np.abs(h - np.array([3.0, 2.0, 4.0])) * np.array([1, -1, -1]) + np.array([-1, 2, 2]), 0, 1)


def colourise(counts: np.ndarray, hues: np.ndarray, flips: np.ndarray) -> np.ndarray:
    """(B, H, W, 3) uint8: a pixel's colour is the hit-weighted mean of its maps' hues, its brightness
    0.25 + 0.75 log(1 + hits) / log(1 + most hits), black where no point fell; then the flips."""
    n, maps, h, w = counts.shape
    hits = counts.reshape(n, maps, h * w).astype(np.float64)
    total = hits.sum(axis=1)  # (B, H*W)
    peak = np.log1p(total.max(axis=1, keepdims=True))
    level = np.where(total > 0, 0.25 + 0.75 * np.log1p(total) / np.maximum(peak, 1e-12), 0.0)
    mix = np.matmul(hue_rgb(hues).transpose(0, 2, 1), hits)  # (B, 3, H*W): hit-weighted sum of the hues
    pixels = mix * (255 * level / np.maximum(total, 1))[:, None]
    images = np.rint(pixels).astype(np.uint8).transpose(0, 2, 1).reshape(n, h, w, 3)
    for b, flip in enumerate(flips):
        images[b] = images[b, :: -1 if flip & 2 else 1, :: -1 if flip & 1 else 1]
    return images


def render(systems: list[np.ndarray], rngs: list[np.random.Generator], size: int = RENDER_SIZE,
           points: int | None = None, hues: np.ndarray | None = None, flips: np.ndarray | None = None) -> np.ndarray:
    """(B, size, size, 3) uint8 images of the systems (hues (B, MAX_MAPS) in [0, 1), flips (B,) codes 0-3)."""
    points = points or round(POINTS * (size / RENDER_SIZE) ** 2)
    counts = hit_counts(*chaos_game(systems, rngs, points), size)
    hues = np.zeros((len(systems), MAX_MAPS)) if hues is None else hues
    return colourise(counts, hues, np.zeros(len(systems), int) if flips is None else flips)


def _batch(points: int, size: int) -> int:
    """Systems per chaos-game batch: a few tens of MB of points and hit counts at a time."""
    return max(1, min(64, 2**21 // max(points, MAX_MAPS * size * size // 4)))


# ---- categories, splits and the cache ------------------------------------------------------------------------


def draw_filled(rngs: list[np.random.Generator], draw: Callable[[int, np.random.Generator], Candidate],
                bar: Any = None) -> tuple[list[Candidate], np.ndarray, int]:
    """For each generator k, candidates draw(k, rngs[k]) = (parameters, hues, flip) until one renders past
    `passes_filter`: (the chosen candidates, their (K, RENDER_SIZE, RENDER_SIZE, 3) images, candidates tried).
    Each generator's draws are its own, so the result for k does not depend on the others."""
    chosen: list[Candidate | None] = [None] * len(rngs)
    images = np.empty((len(rngs), RENDER_SIZE, RENDER_SIZE, 3), np.uint8)
    pending, tried, step = list(range(len(rngs))), 0, _batch(POINTS, RENDER_SIZE)
    for _ in range(MAX_ROUNDS):
        if not pending:
            break
        for start in range(0, len(pending), step):
            group = pending[start: start + step]
            batch = [draw(k, rngs[k]) for k in group]
            hues = np.zeros((len(group), MAX_MAPS))
            for row, (_, hue, _) in enumerate(batch):
                hues[row, : len(hue)] = hue
            counts = hit_counts(*chaos_game([b[0] for b in batch], [rngs[k] for k in group], POINTS), RENDER_SIZE)
            ok = passes_filter(counts)
            pics = colourise(counts, hues, np.array([b[2] for b in batch]))
            for row in np.flatnonzero(ok):
                chosen[group[row]], images[group[row]] = batch[row], pics[row]
            if bar is not None:
                bar.update(int(ok.sum()))
        tried += len(pending)
        pending = [k for k in pending if chosen[k] is None]
    if pending:  # most random IFS and instances pass the filters: this does not happen
        raise RuntimeError(f"{len(pending)} IFS drew no candidate that passes the filters in {MAX_ROUNDS} tries")
    return chosen, images, tried  # type: ignore[return-value]


def draw_categories(seed: int, count: int) -> tuple[list[np.ndarray], int]:
    """The parameters of the first `count` categories of `seed`, and how many random IFS were drawn for them."""
    rngs = [category_generator(seed, c) for c in range(count)]
    chosen, _, tried = draw_filled(rngs, lambda c, rng: (sample_ifs(rng), np.zeros(0), 0))
    return [params for params, _, _ in chosen], tried


def render_split(spec: FractalSpec, split: str, systems: list[np.ndarray],
                 bar: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (C * n, RENDER_SIZE, RENDER_SIZE, 3) uint8, labels (C * n,) int64), category-major, of one split.
    An instance whose weighted parameter spoils the fractal (fails the filter) is drawn again."""
    per = spec.count(split)
    images = np.empty((spec.classes * per, RENDER_SIZE, RENDER_SIZE, 3), np.uint8)
    for start in range(0, len(images), CHUNK):  # a chunk's generators and candidates at a time, not a million
        jobs = range(start, min(start + CHUNK, len(images)))  # image j: instance j % per of category j // per
        rngs = [instance_generator(spec.seed, j // per, split, j % per) for j in jobs]
        _, images[jobs.start: jobs.stop], _ = draw_filled(
            rngs, lambda k, rng, first=start: perturb(systems[(first + k) // per], rng), bar)
    return images, np.repeat(np.arange(spec.classes, dtype=np.int64), per)


def cache_path(spec: FractalSpec) -> Path:
    return synthetic.cache_path(spec, GENERATOR_VERSION, RENDER_SIZE)


def class_names(categories: int) -> list[str]:
    return synthetic.class_names("fractal", categories)


def fractal_splits(data: str) -> tuple[ImageSplit, ImageSplit]:
    """(train, val) of `fractal:C:N[:SEED]`: rendered once per process and kept in the cache."""
    return _splits(parse_spec(data))


@lru_cache(maxsize=2)  # rendering or even loading a large spec takes a while; the arrays are never modified
def _splits(spec: FractalSpec) -> tuple[ImageSplit, ImageSplit]:
    shape = (RENDER_SIZE, RENDER_SIZE, 3)
    arrays = synthetic.cached_splits(spec, cache_path(spec), shape, lambda: _render_all(spec))
    names = class_names(spec.classes)
    return (ImageSplit("train", arrays["train_labels"], names, arrays=arrays["train_images"]),
            ImageSplit("val", arrays["val_labels"], names, arrays=arrays["val_images"]))


def _render_all(spec: FractalSpec) -> dict[str, np.ndarray]:
    systems, tried = draw_categories(spec.seed, spec.classes)
    log.info("%s: %d categories from %d random IFS (%.0f%% pass the filling-rate filter)", spec.name,
             spec.classes, tried, 100 * spec.classes / tried)
    out = {}
    with progress(total=spec.images, desc=f"rendering {spec.name}", unit="img") as bar:
        for split in synthetic.SPLITS:
            out[f"{split}_images"], out[f"{split}_labels"] = render_split(spec, split, systems, bar)
    return out


__all__ = ["FILL_THRESHOLD", "GENERATOR_VERSION", "RENDER_SIZE", "FractalSpec", "cache_path", "draw_categories",
           "fractal_splits", "is_fractal_source", "parse_spec", "render", "render_split"]

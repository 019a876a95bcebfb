"""What the drawn sources share (`strokes:C:N[:SEED]`, `fonts:C:N[:SEED]`): the spec grammar with its one-line
errors, the per-class and per-split random streams, the class names and the cache of rendered splits.

The grammar and its rules are those of `fractal:C:N[:SEED]` (data/fractal.py): C classes, N training and
max(1, N // 10) validation images per class, seed 0 unless given; class c is drawn from a generator seeded by
(seed, c) and instance i of a split is row i of draws from streams seeded by (seed, c, split), so a smaller
spec's classes and images are prefixes of a larger one's and train and val never share a draw.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitlab.data.errors import log
from vitlab.errors import DataError
from vitlab.files.cache import cache_dir, file_lock
from vitlab.files.outputs import atomic_write

SPLITS = {"train": 0, "val": 1}
_CLASS, _INSTANCE = 1, 2  # first seed word: class and instance generators never share a stream


@dataclass(frozen=True)
class SyntheticSpec:
    prefix: str  # "strokes:", "fonts:"
    classes: int
    per_class: int  # training images per class
    seed: int = 0

    @property
    def val_per_class(self) -> int:
        return max(1, self.per_class // 10)

    @property
    def name(self) -> str:
        return f"{self.prefix}{self.classes}:{self.per_class}:{self.seed}"

    @property
    def images(self) -> int:
        return self.classes * (self.per_class + self.val_per_class)

    def count(self, split: str) -> int:
        return self.per_class if split == "train" else self.val_per_class


def is_source(data: str, prefix: str) -> bool:
    """`prefix` is "kind:": the bare kind also counts, so `--data strokes` gets the usage line."""
    return data.startswith(prefix) or data == prefix[:-1]


def parse_spec(data: str, prefix: str, image_bytes: int, max_classes: int | None = None,
               what: str = "") -> SyntheticSpec:
    """`KIND:C:N[:SEED]` -> SyntheticSpec; a one-line DataError naming the fix for anything else, for more
    classes than `max_classes`, or for more pixels (`image_bytes` per image) than half this machine's memory."""
    kind = prefix[:-1]
    usage = f"use {kind}:C:N[:SEED] (C classes, N training images each), e.g. {kind}:10:100"
    fields = data.split(":")[1:]
    if not 2 <= len(fields) <= 3 or not all(re.fullmatch(r"\d+", f) for f in fields):
        raise DataError(f"bad {kind} dataset {data!r}: {usage}")
    spec = SyntheticSpec(prefix, *(int(f) for f in fields))
    if spec.classes < 1 or spec.per_class < 1:
        raise DataError(f"bad {kind} dataset {data!r}: C and N must be at least 1; {usage}")
    if spec.seed >= 2**63:
        raise DataError(f"bad {kind} dataset {data!r}: the seed must be below 2**63")
    if max_classes is not None and spec.classes > max_classes:
        raise DataError(f"bad {kind} dataset {data!r}: at most {max_classes} classes ({what}); use C <= "
                        f"{max_classes}")
    need, limit = spec.images * image_bytes, memory_limit()
    if need > limit:
        raise DataError(f"{data} is {spec.images:,} images of {image_bytes:,} bytes, {need / 2**30:.1f} GiB in "
                        f"memory, more than the {limit / 2**30:.1f} GiB allowed (half this machine's memory): use "
                        "fewer classes or images per class")
    return spec


def memory_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows)
        return 8 * 2**30


def class_generator(source: int, seed: int, c: int) -> np.random.Generator:
    """Class c's stream; `source` (a constant per generator module) keeps the sources' streams apart."""
    return np.random.default_rng([source, _CLASS, seed, c])


def split_generator(source: int, seed: int, c: int, split: str, stream: int = 0) -> np.random.Generator:
    """A stream of class c's instances in a split: instance i is row i of a fixed-width draw from it, so it does
    not depend on how many instances are drawn (one generator per instance would cost more than the drawing);
    `stream` numbers several streams of the same instances."""
    return np.random.default_rng([source, _INSTANCE, seed, c, SPLITS[split], stream])


def lerp(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Uniform draws u in [0, 1) mapped onto [lo, hi)."""
    return lo + (hi - lo) * u


def class_names(kind: str, classes: int) -> list[str]:
    width = max(4, len(str(classes - 1)))
    return [f"{kind}_{c:0{width}d}" for c in range(classes)]


# ---- the cache of rendered splits ------------------------------------------------------------------------------


def cache_path(spec: SyntheticSpec, version: int | str, size: int) -> Path:
    """Where a spec's rendered splits are kept: <vitlab cache>/<kind>/, named by everything that decides the
    pixels (the generator's version and whatever else it depends on, its render size, the seed, C and N)."""
    name = f"v{version}-{size}px-seed{spec.seed}-c{spec.classes}-n{spec.per_class}.npz"
    return cache_dir() / spec.prefix[:-1] / name


def cached_splits(spec: SyntheticSpec, path: Path, image_shape: tuple[int, ...],
                  render: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """{train,val}_{images,labels} of a spec: loaded from `path`, else rendered and written there (atomically,
    under a lock, so torchrun ranks and concurrent runs render once). A cache folder that cannot be written
    costs only the rendering: the splits are returned with a warning."""
    arrays = _load(path, spec, image_shape)
    if arrays is not None:
        return arrays
    try:
        with file_lock(path, lambda: log.info("waiting for another process to render %s", spec.name)):
            arrays = _load(path, spec, image_shape)  # the first process renders, the others wait and load
            if arrays is None:
                arrays = render()
                atomic_write(path, lambda tmp: _save(tmp, arrays))
                log.info("cached %s in %s", spec.name, path)
    except OSError as err:  # a full disk, a read-only cache (VITLAB_CACHE naming a file is CacheDirError: fatal)
        log.warning("could not cache %s in %s (%s); keeping it in memory", spec.name, path, err)
        arrays = arrays if arrays is not None else render()
    return arrays


def _save(tmp: str, arrays: dict[str, np.ndarray]) -> None:
    with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to the temporary's name
        np.savez_compressed(f, **arrays)  # mostly black images: a fraction of the size


def _load(path: Path, spec: SyntheticSpec, image_shape: tuple[int, ...]) -> dict[str, np.ndarray] | None:
    """The cached splits, or None when absent or not what the spec renders (then they are rendered again)."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as f:  # allow_pickle stays False: arrays only
            arrays = {k: f[k] for k in f.files}
        for split in SPLITS:
            n = spec.classes * spec.count(split)
            images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
            if images.shape != (n, *image_shape) or images.dtype != np.uint8 or labels.shape != (n,):
                raise ValueError(f"{split} shapes {images.shape}, {labels.shape}")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:  # BadZipFile: a cut-short file
        log.warning("ignoring the unreadable cache %s (%s); rendering again", path, err)
        return None
    return arrays


__all__ = ["SPLITS", "SyntheticSpec", "cache_path", "cached_splits", "class_generator", "class_names", "is_source",
           "lerp", "memory_limit", "parse_spec", "split_generator"]

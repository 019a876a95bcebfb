"""Few-shot evaluation of saved weights on a vitlab dataset: the library side of `vitlab fewshot`.

Images are pre-processed as big_vision's few-shot evaluators do (configs/common_fewshot.py: resize to 256×256
ignoring the aspect ratio, central crop 224; round(S·8/7) then S at other input sizes S), or with one of the
evaluation resizes if asked. Features of each split are computed once and reused for every shot count, seed and
L2 value.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from torch import nn

from ..data import EvalTransform, ShardSampler, TransformedSplit, load_split, make_loader, normalize
from ..data.transforms import FEWSHOT_RESIZE, as_size
from .fewshot_lsr import DEFAULT_L2, FewshotResult, fewshot_on_features, representations


def split_features(
    model: nn.Module, data: str, split: str, batch_size: int = 256, workers: int = 0, resize: str = FEWSHOT_RESIZE
) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, D) float64, labels (N,)) of one split: the frozen `pre_logits` representation of images
    pre-processed with `resize` (FEWSHOT_RESIZE or one of the evaluation resizes) at the model's input size."""
    device = next(model.parameters()).device
    images = load_split(data, split)
    loader = make_loader(TransformedSplit(images, EvalTransform(as_size(model.config.image_size), resize)),
                         ShardSampler(len(images), batch_size), workers, device)

    def batches():  # normalised, without the padding entries of the evaluation shard
        for batch in loader:
            valid = batch["valid"]
            x = normalize(batch["images"][valid].to(device), model.config.mean, model.config.std)
            yield x, batch["labels"][valid]

    return representations(model, batches())


def fewshot_weights(
    model: nn.Module,
    data: str,
    shots: tuple[int | str, ...] = (1, 5, 10, 25),
    seeds: int = 3,
    l2_reg: float = DEFAULT_L2,
    l2_sweep: list[float] | None = None,
    batch_size: int = 256,
    workers: int = 0,
    resize: str = FEWSHOT_RESIZE,
) -> FewshotResult:
    """Few-shot draws from the `train` split, accuracy on the `val` split (embedded sets: their test split)."""
    train = split_features(model, data, "train", batch_size, workers, resize)
    test = split_features(model, data, "val", batch_size, workers, resize)
    return fewshot_on_features(train, test, shots, seeds, l2_reg, l2_sweep)


def write_json(result: FewshotResult, path: str | Path, extra: dict | None = None) -> None:
    from ..weights.io import atomic_write

    text = json.dumps({**(extra or {}), **result.to_dict()}, indent=2)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))

"""Few-shot evaluation of saved weights on a vitlab dataset: the library side of `vitlab fewshot`.

Images are pre-processed as big_vision's few-shot evaluators do (configs/common_fewshot.py: resize to 256×256
ignoring the aspect ratio, central crop 224; round(S·8/7) then S at other input sizes S), or with one of the
evaluation resizes if asked. Features of each split are computed once and reused for every shot count, seed and
L2 value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitlab.data import EvalTransform, ImageSplit, ShardSampler, TransformedSplit, load_split, make_loader, normalize
from vitlab.data.datasets import EvaluationSplits, evaluation_splits
from vitlab.data.loader import UnreadableImages
from vitlab.data.transforms import FEWSHOT_RESIZE, as_size
from vitlab.errors import DataError
from vitlab.eval.fewshot_lsr import DEFAULT_L2, FewshotResult, fewshot_on_features, representations
from vitlab.files.outputs import JSON, WRITTEN_BY, Kind
from vitlab.files.outputs import write_json as write_json_file
from vitlab.models import build_model
from vitlab.progress import progress as progress_bar
from vitlab.runtime.session import compile_session, open_session

FEWSHOT_KIND = Kind("vitlab fewshot", JSON)  # the accuracy table: replaced by the next few-shot run


def split_features(
    model: nn.Module, data: str, split: str, batch_size: int = 256, workers: int = 0, resize: str = FEWSHOT_RESIZE,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, D) float64, labels (N,)) of one split: the frozen `pre_logits` representation of images
    pre-processed with `resize` (FEWSHOT_RESIZE or one of the evaluation resizes) at the model's input size."""
    return features_of(model, load_split(data, split), batch_size, workers, resize, progress)


def features_of(
    model: nn.Module, images: ImageSplit, batch_size: int = 256, workers: int = 0, resize: str = FEWSHOT_RESIZE,
    progress: bool = False, representation: str = "pre_logits",
) -> tuple[np.ndarray, np.ndarray]:
    """`split_features` of a split already loaded. Undecodable images are left out (one warning line naming
    them); a representation with NaN or inf values is an error, since every accuracy computed from it would be
    meaningless."""
    device = next(model.parameters()).device
    loader = make_loader(TransformedSplit(images, EvalTransform(as_size(model.config.image_size), resize)),
                         ShardSampler(len(images), batch_size), workers, device)
    unreadable = UnreadableImages(loader)

    def batches():  # normalised, without the padding entries of the evaluation shard nor unreadable images
        for batch in progress_bar(loader, desc=f"features ({images.name})", unit="batch", enabled=progress):
            unreadable.add(batch["bad"])
            valid = batch["valid"]
            x = normalize(batch["images"][valid].to(device), model.config.mean, model.config.std)
            yield x, batch["labels"][valid]

    feats, labels = representations(model, batches(), representation)
    unreadable.report()
    if not len(labels):
        raise DataError(f"no readable image in the {images.name} split of {len(images)}; check the data")
    if not np.isfinite(feats).all():
        raise ValueError(f"the model's representation of the {images.name} split has NaN or inf values; "
                         "check the weights (a diverged run?) and the input normalisation")
    return feats, labels


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
    progress: bool = False,
    val_fraction: float | None = None,
    representation: str = "pre_logits",
    splits: EvaluationSplits | None = None,
) -> FewshotResult:
    """Few-shot draws from the train split, accuracy on a test split that shares no image with it (see
    `vitlab.data.evaluation_splits`: embedded sets' test split, a folder's val/, else a stratified held-out
    share of train, `val_fraction` or 20%). `progress`: a bar while features are computed (on a terminal).
    `splits`: `data`'s, already read."""
    splits = splits or evaluation_splits(data, val_fraction)
    train = features_of(model, splits.train, batch_size, workers, resize, progress, representation)
    test = features_of(model, splits.test, batch_size, workers, resize, progress, representation)
    result = fewshot_on_features(train, test, shots, seeds, l2_reg, l2_sweep)
    result.splits = {**splits.record(), "train_images": len(train[1]), "test_images": len(test[1])}  # as read
    return result


def fewshot_from_weights(
    weights: str | Path, data: str, shots: tuple[int | str, ...] = (1, 5, 10, 25), seeds: int = 3,
    l2_reg: float = DEFAULT_L2, l2_sweep: list[float] | None = None, batch_size: int = 256, *,
    resize: str = FEWSHOT_RESIZE, val_fraction: float | None = None, device: str = "auto", precision: str = "auto",
    random_init: bool = False, progress: bool = False, compile: bool | str = "auto",
) -> FewshotResult:
    """`vitlab fewshot`: `fewshot_weights` of saved weights (anything `vitlab.load` reads), the features computed in
    `precision` (the result's `.precision`) under autocast with float32 weights. `random_init`: a freshly
    initialised model of the weights' architecture instead (seed 0), the baseline the representation is set
    against. `compile`: auto, on or off (True / False): the features' path (`forward_features`) compiled with
    frozen weights, auto deciding from the number of images embedded (`compile_session`; the choice in the result's
    `.compiled`)."""
    session = open_session(weights, device=device, precision=precision, cast_weights=False, compile="auto")
    if random_init:
        torch.manual_seed(0)
        session = open_session(build_model(session.model.config), device=session.device, precision=precision,
                               cast_weights=False, compile="auto")
    splits = evaluation_splits(data, val_fraction)
    session = compile_session(session, compile, len(splits.train) + len(splits.test), method="forward_features")
    with session.autocast():
        result = fewshot_weights(session.model, data, shots, seeds, l2_reg, l2_sweep, batch_size, resize=resize,
                                 progress=progress, val_fraction=val_fraction, splits=splits)
    result.precision, result.compiled = session.precision, session.compiled
    return result


def write_fewshot_json(result: FewshotResult, path: str | Path, extra: dict | None = None, force: bool = False,
               inputs: tuple[str | Path, ...] = ()) -> None:
    """The table as JSON, marked as vitlab's (its first key) so that a later run may replace it; an existing file
    that is not an earlier table is replaced only with `force`, and `inputs` never (outputs.check_output)."""
    write_json_file(path, {WRITTEN_BY: FEWSHOT_KIND.writer, **(extra or {}), **result.to_dict()}, indent=2,
                    user_named=True, force=force, inputs=inputs)

"""Classification evaluation: loss, top-1 and top-5 over a loader (the trainer's validation) and of saved weights
on a dataset split with its confusion matrix (the library side of `vitlab eval`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vitlab.data import EvalTransform, ShardSampler, TransformedSplit, load_split, make_loader, normalize
from vitlab.data.loader import UnreadableImages
from vitlab.data.sources import ImageSplit
from vitlab.errors import DataError
from vitlab.eval.metrics import ClassificationMeter, plot_confusion_matrix, require_finite
from vitlab.losses import per_image_loss
from vitlab.models.timm_compat import eval_resize_of
from vitlab.progress import progress as progress_bar
from vitlab.runtime.device import all_reduce
from vitlab.runtime.precision import Precision, autocast_for
from vitlab.runtime.session import InferenceSession, compile_session, open_session

if TYPE_CHECKING:
    from vitlab.runtime.compiling import CompileChoice


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Any, device: torch.device, mean: tuple, std: tuple, num_classes: int,
    loss_kind: str = "softmax", confusion: bool = False, progress_desc: str | None = None,
    precision: Precision | str = "fp32", predictions: list[torch.Tensor] | None = None,
) -> ClassificationMeter:
    """Loss, top-1, top-5 (and the confusion matrix) over a loader; sums are reduced over processes.
    `progress_desc`: show a progress bar with this label (on a terminal; see vitlab.progress). `precision`:
    the resolved one (vitlab.runtime.precision), computed under its autocast (`autocast_for`). `predictions`: a
    list that receives, per batch, a (N, 3) float64 CPU tensor of each slot's predicted class, its softmax
    probability and whether the slot counts (padding and unreadable images do not), in the loader's order."""
    was_training = model.training
    model.eval()
    meter = ClassificationMeter(num_classes, device, confusion)
    batches = loader if progress_desc is None else progress_bar(loader, desc=progress_desc, unit="batch")
    unreadable = UnreadableImages(loader)  # left out, not counted; fatal under --strict
    for batch in batches:
        unreadable.add(batch["bad"])
        x = normalize(batch["images"].to(device, non_blocking=True), mean, std)
        y = batch["labels"].to(device, non_blocking=True)
        valid = batch["valid"].to(device)
        with autocast_for(device, precision):
            logits = model(x)
        logits = logits.float()
        meter.update(logits[valid], y[valid], per_image_loss(logits, y, loss_kind)[valid])
        if predictions is not None:
            confidence, predicted = logits.softmax(-1).max(-1)
            predictions.append(torch.stack([predicted.double(), confidence.double(), valid.double()], -1).cpu())
    unreadable.report()
    all_reduce(meter.totals)
    if meter.confusion is not None:
        all_reduce(meter.confusion)
    model.train(was_training)
    return meter


@dataclass
class EvalResult:
    metrics: dict[str, float]  # loss, top1, top5 (fractions in [0, 1]), count
    confusion: torch.Tensor  # (K, K) rows: true class
    class_names: list[str]
    confusion_png: Path | None
    eval_resize: str = "official"  # the pre-processing used (data.transforms.EVAL_RESIZES)
    precision: Precision | None = None  # what it computed in, and why
    compiled: CompileChoice | None = None  # whether the model was compiled, and why
    misclassified: list[dict[str, Any]] | None = None  # with errors=True: image, true, predicted, confidence


def confusion_name(data: str, split: str) -> str:
    """'confusion-photos-val.png': the figure's name says which data it shows (a path's last part, `.` and `..` the
    folder they stand for; a named set as written; letters of any alphabet kept), so that evaluating the same run on
    another dataset or split adds a figure beside the earlier one rather than replacing it."""
    text = str(data).rstrip("/")
    if "/" in text or text in (".", ".."):
        text = Path(os.path.abspath(text)).name  # 'photos/', '../photos', '.' inside photos: 'photos'
    slug = _slug(text)[:60].encode()[:_SLUG_BYTES].decode(errors="ignore") or "data"
    return f"confusion-{slug}-{_slug(split)}.png"


_SLUG_BYTES = 120  # the data's part of the name in UTF-8: with the rest, well within any file system's 255 bytes


def _slug(text: str) -> str:
    """Letters and digits of any alphabet, '.', '_' and '-'; any other run of characters one '_'."""
    return re.sub(r"[^\w.-]+", "_", text).strip("._")


def confusion_destination(confusion: str | Path | None, out: str | Path | None, data: str | None = None,
                          split: str = "val") -> Path | None:
    """Where `vitlab eval` writes its confusion-matrix figure: --confusion PATH if given, else beside its metrics,
    DIR/NAME for --out DIR; None (no figure) otherwise. Never unasked into the working directory or into the run
    the weights come from: a run's folder holds what its training wrote. NAME is `confusion_name(data, split)`
    (confusion.png without `data`)."""
    if confusion:
        return Path(confusion)
    if out:
        return Path(out) / (confusion_name(data, split) if data else "confusion.png")
    return None


def misclassified(split: ImageSplit, predictions: torch.Tensor, names: list[str]) -> list[dict[str, Any]]:
    """The images of `split` whose predicted class (row i of `predictions`, `evaluate`'s (N, 3) in the split's
    order: one process reads every image in order) is not their label: image (path, or NAME[i] for an embedded
    set), true and predicted class names, and the softmax probability of the prediction. Unreadable images, left
    out of the metrics, are left out here too."""
    if len(predictions) != len(split):
        raise RuntimeError(f"{len(predictions)} predictions for {len(split)} images: the evaluation's order is lost")
    rows = []
    for i, ((predicted, confidence, valid), label) in enumerate(zip(predictions.tolist(), split.labels.tolist(),
                                                                     strict=True)):
        if valid and int(predicted) != label:
            rows.append({"image": split.describe(i), "true": names[label], "predicted": names[int(predicted)],
                         "confidence": confidence})
    return rows


def per_class_metrics(confusion: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
    """Per class (rows of `confusion`: the true class): precision = correct / predicted as the class (None if never
    predicted), recall = correct / images of the class (None if it has none), and the image count."""
    c = confusion.to(torch.float64).cpu()
    correct, predicted, support = c.diagonal().tolist(), c.sum(0).tolist(), c.sum(1).tolist()
    return [{"class": name, "precision": correct[k] / predicted[k] if predicted[k] else None,
             "recall": correct[k] / support[k] if support[k] else None, "images": int(support[k])}
            for k, name in enumerate(class_names)]


def per_class_lines(rows: list[dict[str, Any]], limit: int = 30) -> list[str]:
    """A table for the terminal: every class up to `limit`, else the `limit` with the lowest recall."""
    shown = rows
    if len(rows) > limit:
        shown = sorted(rows, key=lambda r: (r["recall"] is None, r["recall"] or 0.0))[:limit]
    width = max(12, *(len(r["class"]) for r in shown))

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    head = f"{'class':<{width}}  precision  recall  images"
    if len(rows) > limit:
        head += f"   ({limit} of {len(rows)} classes, lowest recall first; all in --json and --out)"
    return [head] + [f"{r['class']:<{width}}  {pct(r['precision']):>9}  {pct(r['recall']):>6}  {r['images']:>6,}"
                     for r in shown]


def write_confusion(result: EvalResult, path: str | Path, title: str = "Confusion matrix", *, user_named: bool = True,
                    force: bool = False, inputs: tuple[str | Path, ...] = ()) -> Path:
    """The row-normalised confusion matrix as a PNG (atomic); sets result.confusion_png. OSError if the
    destination cannot be written, OutputRefused (an OSError) if it holds what vitlab may not replace (see
    plot_confusion_matrix)."""
    result.confusion_png = plot_confusion_matrix(result.confusion, result.class_names, path, title,
                                                 user_named=user_named, force=force, inputs=inputs)
    return result.confusion_png


def evaluate_weights(
    weights: str | Path, data: str, split: str = "val", batch_size: int = 256, workers: int = 0,
    device: str = "auto", confusion_png: str | Path | None = None, strict: bool = False,
    eval_resize: str | None = None, progress: bool = True, precision: str = "auto", compile: bool | str = "auto",
    errors: bool = False, session: InferenceSession | None = None,
) -> EvalResult:
    """`vitlab eval`: top-1/top-5/loss of saved weights on a dataset split, and (with `confusion_png`) a
    confusion-matrix PNG. `eval_resize` None: the resize the weights were evaluated with in training (recorded
    in vitlab weights), else "official". `progress`: a bar on a terminal. `precision`: auto, fp32, bf16 or int8
    (vitlab.runtime.precision; the choice is in the result). `compile`: auto, on or off (True / False): the
    model compiled with frozen weights, auto deciding from the split's image count (`compile_session`; the choice
    is in the result).
    `errors`: list the misclassified images in the result. `session`: one already open on `weights` (an ONNX
    file's, `deploy.onnx_serve`), used instead of opening one; `weights` then only names it."""
    session = session or open_session(weights, device=device, precision=precision, compile=compile)
    model, dev, chosen, names = session.model, session.device, session.precision, list(session.class_names)
    has_names = getattr(model, "class_names", None) is not None
    if getattr(model, "unnamed_classes", False):  # weights without class names (a timm training checkpoint)
        data_split: ImageSplit = load_split(data, split, None, strict)  # class i: the i-th sorted, as timm's folders
        if set(data_split.class_names) == set(names) and list(data_split.class_names) != names:
            data_split = load_split(data, split, names, strict)  # folders named by the indices: matched by name
        names = list(data_split.class_names)
    else:
        data_split = load_split(data, split, names if has_names else None, strict)
    if len(data_split.class_names) != model.config.num_classes:
        raise DataError(
            f"num_classes mismatch: the weights have {model.config.num_classes} classes, {data} has "
            f"{len(data_split.class_names)}; evaluate on the dataset the model was trained for"
        )
    if has_names and list(data_split.class_names) != names:
        raise DataError(f"class names of {data} differ from the weights' ({', '.join(names[:5])}, …)")
    session = compile_session(session, compile, len(data_split))
    model = session.model
    resize = eval_resize or eval_resize_of(model)
    transform = EvalTransform(model.config.image_size, resize)
    loader = make_loader(TransformedSplit(data_split, transform), ShardSampler(len(data_split), batch_size),
                         workers, dev)
    predictions: list[torch.Tensor] | None = [] if errors else None
    meter = evaluate(model, loader, dev, model.config.mean, model.config.std, model.config.num_classes,
                     confusion=True, progress_desc=f"eval {split}" if progress else None, precision=chosen,
                     predictions=predictions)
    metrics = require_finite(meter.result(), f"evaluation of {weights} on {data} {split}")
    result = EvalResult(metrics, meter.confusion.cpu(), names, None, resize, chosen, session.compiled)
    if predictions is not None:
        result.misclassified = misclassified(data_split, torch.cat(predictions), names)
    if confusion_png:
        write_confusion(result, confusion_png)
    return result

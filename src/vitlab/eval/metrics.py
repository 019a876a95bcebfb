"""Classification metrics: loss, top-1, top-5 and the confusion matrix, accumulated over batches.

The meter keeps plain sums in tensors so that a distributed evaluation adds them over processes with one
all-reduce (`meter.totals`, `meter.confusion`) before `result()`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vitlab.files.outputs import PNG, Kind, atomic_write, mark

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CONFUSION_KIND = Kind("vitlab eval", PNG)  # a confusion-matrix figure: replaced by the next evaluation


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list[torch.Tensor]:
    """Per k, a bool (N,) tensor: is the label among the k highest logits? k is capped at the class count."""
    kmax = min(max(ks), logits.shape[-1])
    top = logits.topk(kmax, dim=-1).indices  # (N, kmax)
    hit = top == labels[:, None]  # (N, kmax)
    return [hit[:, : min(k, kmax)].any(dim=-1) for k in ks]


def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(K, K) int64 counts, rows = true class, columns = predicted class."""
    flat = labels.long() * num_classes + preds.long()
    return torch.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


class ClassificationMeter:
    """Sums of per-image loss, top-1 and top-5 hits, and the confusion matrix (optional: K² memory)."""

    def __init__(self, num_classes: int, device: torch.device | str = "cpu", confusion: bool = False):
        self.num_classes = num_classes
        self.totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, count, top-1, top-5
        self.confusion = (
            torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device) if confusion else None
        )

    @torch.no_grad()
    def update(self, logits: torch.Tensor, labels: torch.Tensor, losses: torch.Tensor) -> None:
        """logits (N, K), labels (N,), losses (N,) per-image loss."""
        top1, top5 = topk_correct(logits, labels, (1, 5))
        batch = torch.stack([losses.double().sum(), torch.tensor(float(len(labels)), device=losses.device),
                             top1.double().sum(), top5.double().sum()])
        self.totals += batch.to(self.totals.device)
        if self.confusion is not None:
            preds = logits.argmax(dim=-1)
            self.confusion += confusion_matrix(preds, labels, self.num_classes).to(self.confusion.device)

    def result(self) -> dict[str, float]:
        loss, count, top1, top5 = self.totals.tolist()
        n = max(count, 1.0)
        return {"loss": loss / n, "top1": top1 / n, "top5": top5 / n, "count": int(count)}


def informative_metrics(metrics: dict[str, float], num_classes: int) -> dict[str, float]:
    """`metrics` without top5 for a model of 5 classes or fewer: every image's label is then among its top 5, so
    top-5 accuracy is 100% by construction and says nothing about the model."""
    return metrics if num_classes > 5 else {k: v for k, v in metrics.items() if k != "top5"}


def require_finite(metrics: dict[str, float], what: str) -> dict[str, float]:
    """`metrics` if it is a result; ValueError (one line) when no image was evaluated or a value is NaN/inf:
    a command must not report such numbers as if they were one."""
    if metrics.get("count", 1) == 0:
        raise ValueError(f"{what}: no image was evaluated; check the data and --batch-size")
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what}: {', '.join(bad)} is not finite (NaN or inf); the model's outputs overflow: "
                         "check the weights and the input normalisation")
    return metrics


def per_class_accuracy(confusion: torch.Tensor) -> torch.Tensor:
    """Recall of each class (diagonal over row sums); NaN for classes without images."""
    rows = confusion.sum(dim=1).double()
    return confusion.diagonal().double() / rows.where(rows > 0, torch.tensor(float("nan"), dtype=torch.float64))


def plot_confusion_matrix(
    confusion: torch.Tensor, class_names: list[str], path: str | Path, title: str = "Confusion matrix", *,
    user_named: bool = True, force: bool = False, inputs: tuple[str | Path, ...] = (),
) -> Path:
    """A PNG of the row-normalised matrix (each true class's row sums to 100%); counts are written in the cells
    when there are few classes. Written atomically: a failed write leaves no partial file (OSError is raised).
    A `user_named` path is held to the output rule (outputs.check_output, kind `CONFUSION_KIND`: never one of
    `inputs` or a run's files; an existing file must be an earlier confusion matrix, or `force`); the PNG carries
    vitlab's mark so that the next evaluation may replace it."""
    fig = confusion_figure(confusion, class_names, title)
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png", metadata=mark(CONFUSION_KIND.writer)),
                 user_named=user_named, force=force, kind=CONFUSION_KIND, inputs=inputs)
    return path


_TICK_CHARS = 24  # longer class names are shortened with "…" on the axes


def confusion_figure(confusion: torch.Tensor, class_names: list[str], title: str = "Confusion matrix") -> Figure:
    """The matplotlib Figure of `plot_confusion_matrix`. The title wraps to the figure's width (a weights path or
    a dataset name can be long) and long class names are shortened on the axes, so nothing is cut off."""
    import textwrap

    from matplotlib.figure import Figure  # the object API: no pyplot global state, no display backend

    cm = confusion.cpu().double()
    k = cm.shape[0]
    norm = cm / cm.sum(dim=1, keepdim=True).clamp(min=1)
    size = min(4 + 0.4 * k, 24)
    fig = Figure(figsize=(size, size), layout="constrained")
    ax = fig.subplots()
    ax.imshow(norm.numpy(), cmap="Blues", vmin=0, vmax=1)
    if k <= 50:  # beyond that, tick labels and numbers are unreadable
        names = [n if len(n) <= _TICK_CHARS else n[: _TICK_CHARS - 1] + "…" for n in map(str, class_names)]
        ax.set_xticks(range(k), names, rotation=90)
        ax.set_yticks(range(k), names)
    if k <= 20:
        for i in range(k):
            for j in range(k):
                color = "white" if norm[i, j] > 0.5 else "black"
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", color=color, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    # ~7 characters of the 12-point title per inch of figure, less the margins
    width = max(20, int(7 * size) - 6)
    ax.set_title("\n".join(textwrap.wrap(title, width, break_on_hyphens=False)) or title)
    return fig

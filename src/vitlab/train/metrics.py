"""A run's metrics.jsonl (one JSON object per step record) and curves.png drawn from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitlab.files.outputs import atomic_write
from vitlab.files.reading import read_text_regular
from vitlab.train.console import log


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_text_regular(path).splitlines() if line.strip()]


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step`: a resumed run rewrites the steps the killed run logged after its
    last checkpoint, and the file must describe one run, not two overlapping ones."""
    if not path.exists():
        return
    lines = [line for line in read_text_regular(path).splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append((json.loads(line)["step"], line))
        except (json.JSONDecodeError, KeyError, TypeError):
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not a metrics record; the file is damaged (move it "
                                 "aside to resume without the run's earlier metrics)") from None
            log.warning("%s: dropped a torn last line (the run was killed while writing it)", path)
    kept = [line for step, line in records if step <= last_step]
    text = "".join(line + "\n" for line in kept)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


FEW_POINTS = 50  # logged steps up to which curves.png marks each point


def plot_curves(metrics_path: Path, out: Path) -> Path | None:
    """curves.png: loss (train and val), accuracy (val top-1, and top-5 above 5 classes) and learning rate against
    step."""
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(15, 4))
    dots = "o" if len(train) <= FEW_POINTS else None  # a short run's few points (or one) stay visible
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1, marker=dots, ms=3)
    ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="val")
    ax_loss.set_yscale("log")
    for key in ("top1", "top5"):  # top-5 only where the run logged it: more than 5 classes (informative_metrics)
        if any(key not in r for r in val):
            continue
        ax_acc.plot([r["step"] for r in val], [r[key] for r in val], "o-", label=f"val {key}")
    fewshot = [r for r in records if r["split"] == "fewshot"]
    if fewshot:  # the paper's progress signal during pre-training
        ax_acc.plot([r["step"] for r in fewshot], [r["5shot"] for r in fewshot], "s--", label="5-shot linear")
    ax_lr.plot([r["step"] for r in train], [r["lr"] for r in train], marker=dots, ms=3)
    for ax, title in ((ax_loss, "loss"), (ax_acc, "accuracy"), (ax_lr, "learning rate")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_loss.legend()
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out

"""The paper's figures as PNG files (Fig. 7 left, centre, right; Fig. 6-style attention overlays).

Uses matplotlib's object API (`Figure`, no pyplot): no global state, no display backend, safe in threads.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from matplotlib.figure import Figure

from vitlab.analysis.embeddings import EmbeddingFilters
from vitlab.files.outputs import atomic_write, mark

MAX_DRAWN_IMAGES = 8  # more rows stop being readable; all images still count in the numbers
MAX_DRAWN_HEADS = 16


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, bbox_inches="tight", format="png",
                                               metadata=mark("vitlab analyze")))  # replaceable by the next run
    return path


def _rescale(a: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1]; a constant array becomes mid-grey instead of dividing by zero."""
    lo, hi = float(a.min()), float(a.max())
    return np.full_like(a, 0.5) if hi - lo < 1e-12 else (a - lo) / (hi - lo)


def _show_image(ax, img: np.ndarray) -> None:
    """img (H, W, C) in [0, 1]; one channel is drawn in grey."""
    if img.shape[-1] == 1:
        ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(img)
    ax.set_xticks([])
    ax.set_yticks([])


def _upsample(heat: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) -> (H, W) bilinear, so the map lies over the pixels its patches cover."""
    return F.interpolate(heat[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0].numpy()


def _overlay(ax, img: np.ndarray, heat: np.ndarray):
    _show_image(ax, img)
    return ax.imshow(heat, cmap="jet", alpha=0.5, vmin=0.0, vmax=1.0)


def plot_embedding_filters(
    filters: EmbeddingFilters, path: str | Path, cols: int = 7, notes: Sequence[str] = ()
) -> Path:
    """Fig. 7 left: principal components of the patch-embedding filters as image patches (each min-max
    scaled, as their sign and scale are arbitrary), labelled with the variance each explains. `notes` (e.g.
    "these filters look untrained") are printed under the components."""
    comps = filters.components.permute(0, 2, 3, 1).numpy()  # (k, P, P, C)
    k = comps.shape[0]
    rows = math.ceil(k / cols)
    fig = Figure(figsize=(1.3 * cols, 1.5 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < k:
            _show_image(ax, _rescale(comps[i]))
            ax.set_title(f"PC {i + 1}\n{float(filters.explained_variance_ratio[i]):.1%}", fontsize=8)
    kind = "RGB" if comps.shape[-1] == 3 else "Grey-level"
    fig.suptitle(f"{kind} embedding filters (first {k} principal components, % of variance)")
    if notes:
        text = "\n".join(textwrap.fill(note, width=max(60, 16 * cols)) for note in notes)
        fig.supxlabel(text, fontsize=9, color="firebrick", ha="center")
    return _save(fig, path)


def _tick_step(n: int) -> int:
    return 1 if n <= 16 else math.ceil(n / 12)


def plot_position_similarity(similarity: torch.Tensor, path: str | Path) -> Path:
    """Fig. 7 centre: a grid of grids. Tile (r, c) shows the cosine similarity of patch (r, c)'s position
    embedding with every patch's; tiles are separated by one blank (white) pixel."""
    gh, gw = similarity.shape[:2]
    canvas = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for r in range(gh):
        for c in range(gw):
            canvas[r * (gh + 1) : r * (gh + 1) + gh, c * (gw + 1) : c * (gw + 1) + gw] = similarity[r, c].numpy()
    fig = Figure(figsize=(6.5 * max(gw / gh, 0.6), 6.0 * max(gh / gw, 0.6)), layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["viridis"].with_extremes(bad="white")  # the NaN gaps between tiles
    im = ax.imshow(canvas, cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    xs, ys = range(0, gw, _tick_step(gw)), range(0, gh, _tick_step(gh))
    ax.set_xticks([c * (gw + 1) + (gw - 1) / 2 for c in xs], [str(c + 1) for c in xs])
    ax.set_yticks([r * (gh + 1) + (gh - 1) / 2 for r in ys], [str(r + 1) for r in ys])
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title(f"Position embedding similarity ({gh}×{gw} patches)")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Cosine similarity")
    return _save(fig, path)


def plot_attention_distance(
    distance: torch.Tensor, path: str | Path, image_size: tuple[int, int], uniform_px: float | None = None
) -> Path:
    """Fig. 7 right: mean attention distance (pixels) of every head against depth, one colour per head; the
    dashed line is the distance uniform attention over the patches would give at this input size."""
    layers, heads = distance.shape
    depth = np.arange(1, layers + 1)
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for h in range(heads):
        ax.scatter(depth, distance[:, h].numpy(), s=18, label=f"Head {h + 1}")
    if uniform_px is not None:
        ax.axhline(uniform_px, color="grey", linestyle="--", linewidth=1, label="uniform attention")
    top = max(float(distance.max()), uniform_px or 0.0)
    ax.set_ylim(0, top * 1.1 + 1e-6)
    ax.set_xlim(0.5, layers + 0.5)
    ax.set_xticks(depth[:: _tick_step(layers)])
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_title(f"Mean attention distance per head, {image_size[0]}×{image_size[1]} input")
    if heads <= MAX_DRAWN_HEADS:
        ax.legend(fontsize=7, ncol=2 if heads > 6 else 1, loc="best")
    ax.grid(alpha=0.3)
    return _save(fig, path)


@dataclass(frozen=True)
class RowLabel:
    """What a figure says about one input image: where it came from, its class, the model's answer."""

    file: str
    true_class: str | None = None
    predicted: str | None = None  # "circle 97%"
    correct: bool | None = None  # None: the true class is unknown

    def lines(self) -> list[str]:
        parts = [short_name(self.file)]
        if self.true_class is not None:
            parts.append(f"true: {self.true_class}")
        if self.predicted is not None:
            parts.append(f"pred: {self.predicted}")
        return parts

    @property
    def color(self) -> str:
        return {True: "darkgreen", False: "firebrick"}.get(self.correct, "black")


def short_name(file: str) -> str:
    """The last two parts of a path (class folder and file name); dataset references stay whole."""
    parts = Path(file).parts
    return "/".join(parts[-2:]) if len(parts) > 1 else file


def _grid_shape(n: int) -> tuple[int, int]:
    """(rows, columns) of images for a grid about as wide as tall: 8 images -> 3 × 3."""
    cols = math.ceil(math.sqrt(n))
    return math.ceil(n / cols), cols


def plot_rollout(images: np.ndarray, maps: torch.Tensor, path: str | Path, title: str,
                 labels: Sequence[RowLabel] = ()) -> Path:
    """A grid of cells, one per image: the input beside its attention-rollout map (N, gh, gw) laid over it,
    under the image's label; each map is scaled by its own maximum."""
    n = min(len(images), MAX_DRAWN_IMAGES)
    size = images.shape[1:3]
    aspect = size[0] / size[1]
    rows, cols = _grid_shape(n)
    fig = Figure(figsize=(3.6 * cols, (1.8 * aspect + 0.55) * rows + 0.6), layout="constrained")
    cells = fig.subfigures(rows, cols, squeeze=False, wspace=0.04, hspace=0.04)
    for i, cell in enumerate(cells.flat):
        if i >= n:
            continue
        ax_in, ax_map = cell.subplots(1, 2)
        _show_image(ax_in, images[i])
        heat = _upsample(maps[i], size)
        _overlay(ax_map, images[i], heat / max(float(heat.max()), 1e-12))
        ax_in.set_xlabel("input", fontsize=7)
        ax_map.set_xlabel("rollout", fontsize=7)
        if i < len(labels):
            cell.suptitle("\n".join(labels[i].lines()), fontsize=8, color=labels[i].color)
    fig.suptitle(f"{title}\nEach map scaled to its own maximum (jet: blue 0 → red maximum)")
    return _save(fig, path)


def plot_head_maps(images: np.ndarray, maps: torch.Tensor, path: str | Path, title: str,
                   labels: Sequence[RowLabel] = ()) -> Path:
    """Per-head class-token attention (N, H, gh, gw) of one layer laid over each input, one row per image
    labelled on the left; one colour scale per image (its largest weight over all heads), so heads of one
    image compare directly."""
    n = min(len(images), MAX_DRAWN_IMAGES)
    heads = min(maps.shape[1], MAX_DRAWN_HEADS)
    size = images.shape[1:3]
    aspect = size[0] / size[1]
    fig = Figure(figsize=(1.9 * (heads + 1) + 2.4, 1.9 * aspect * n + 0.7), layout="constrained")
    axes = fig.subplots(n, heads + 1, squeeze=False)
    mappable = None
    for i in range(n):
        _show_image(axes[i, 0], images[i])
        if i < len(labels):
            axes[i, 0].set_ylabel("\n".join(labels[i].lines()), fontsize=8, color=labels[i].color, rotation=0,
                                  ha="right", va="center")
        scale = max(float(maps[i].max()), 1e-12)
        for h in range(heads):
            mappable = _overlay(axes[i, h + 1], images[i], _upsample(maps[i, h], size) / scale)
            if i == 0:
                axes[i, h + 1].set_title(f"Head {h + 1}", fontsize=9)
    axes[0, 0].set_title("Input", fontsize=9)
    fig.suptitle(title)
    fig.colorbar(mappable, ax=axes, fraction=0.02, pad=0.02, label="Attention weight / image maximum")
    return _save(fig, path)

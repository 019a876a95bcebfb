"""The experiments' figures: small PNGs (dpi 100) drawing the mean over seeds and its spread (± one standard
deviation as a band or error bars; with one seed there is no spread to draw)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.files import atomic_write

COLORS = {"ViT": "tab:blue", "BiT": "tab:red", "hybrid": "tab:green"}
DPI = 100


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    _pyplot().close(fig)
    return path


def _color(label: str, i: int) -> str:
    return COLORS.get(label.split(" ")[0], f"C{i}")


def line_panels(path: Path, panels: Sequence[tuple[str, dict[str, tuple[list[float], list[dict]]]]],
                xlabel: str, ylabel: str = "accuracy (%)", log_x: bool = True, title: str = "",
                references: Sequence[dict[str, dict]] | None = None) -> Path:
    """One panel per metric; in each, one line per series: x values and a stat ({"mean", "std"}) per x.
    `references`: per panel, a stat per series drawn as a dashed horizontal line in the series' colour (a
    baseline that does not depend on x)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(2.4 * len(panels), 2.5), squeeze=False)
    for p, (ax, (caption, series)) in enumerate(zip(axes[0], panels, strict=True)):
        for i, (label, ref) in enumerate((references[p] if references else {}).items()):
            ax.axhline(ref["mean"], ls="--", lw=1, color=_color(label, i), alpha=0.8)
        for i, (label, (xs, stats)) in enumerate(series.items()):
            mean = [s["mean"] for s in stats]
            std = [s["std"] for s in stats]
            color = _color(label, i)
            ax.plot(xs, mean, "o-", color=color, label=label, ms=4)
            ax.fill_between(xs, [m - s for m, s in zip(mean, std, strict=True)],
                            [m + s for m, s in zip(mean, std, strict=True)], color=color, alpha=0.2, lw=0)
        if log_x:
            _log_ticks(ax, sorted({x for xs, _ in series.values() for x in xs}))
        ax.set_title(caption, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def _log_ticks(ax: Any, xs: list[float]) -> None:
    """A log axis labelled at the data's own x values (1,024 4,096 …) when they are few, at powers of ten
    otherwise; no minor labels."""
    from matplotlib.ticker import NullFormatter  # matplotlib stays unimported until a figure is drawn (start-up)

    ax.set_xscale("log")
    if len(xs) > 5:  # 1, 2 and 5 times the powers of ten in the data's range
        low, high = min(xs), max(xs)
        decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        xs = [m * 10.0**k for k in decades for m in (1, 2, 5) if low / 1.3 <= m * 10.0**k <= high * 1.3]
    ax.set_xticks(xs, [f"{x:,.0f}" if x < 1e6 else f"{x:.2g}" for x in xs])
    ax.xaxis.set_minor_formatter(NullFormatter())


def bar_panels(path: Path, panels: Sequence[tuple[str, dict[str, dict]]], title: str = "") -> Path:
    """One panel per metric; one bar per variant with ± one standard deviation and the seeds as dots."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 3.0), squeeze=False)
    every = list(dict.fromkeys(n for _, bars in panels for n in bars))  # one colour per variant in all panels
    for ax, (caption, bars) in zip(axes[0], panels, strict=True):
        names = list(bars)
        means = [bars[n]["mean"] for n in names]
        ax.bar(range(len(names)), means, yerr=[bars[n]["std"] for n in names],
               color=[f"C{every.index(n)}" for n in names], alpha=0.7, capsize=3)
        for i, n in enumerate(names):
            ax.plot([i] * len(bars[n]["values"]), bars[n]["values"], "k.", ms=3)
        low = min(min(b["values"]) for b in bars.values())
        high = max(max(b["values"]) for b in bars.values())
        pad = max(1.0, 0.15 * (high - low))
        ax.set_ylim(max(0.0, low - 3 * pad), min(100.0, high + pad))
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.set_title(caption, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("accuracy (%)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def attention_panels(path: Path, panels: Sequence[tuple[str, list[list[list[float]]], float]]) -> Path:
    """Mean attention distance per head against depth (paper Fig. 7 right): one panel per model, each head of
    each seed a dot, the mean over heads and seeds a line with the seeds' spread of the layer mean as a band,
    and the distance uniform attention would give as a dashed line."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False, sharey=True)
    for ax, (caption, per_seed, uniform) in zip(axes[0], panels, strict=True):
        d = np.asarray(per_seed)  # (seeds, L, H)
        layers = np.arange(1, d.shape[1] + 1)
        for s in range(d.shape[0]):
            for h in range(d.shape[2]):
                ax.plot(layers + 0.08 * (h - d.shape[2] / 2), d[s, :, h], ".", color="tab:blue", alpha=0.35, ms=4)
        layer_means = d.mean(axis=2)  # (seeds, L)
        mean, std = layer_means.mean(axis=0), layer_means.std(axis=0, ddof=1) if d.shape[0] > 1 else 0 * layers
        ax.plot(layers, mean, "-", color="black", lw=1.2, label="mean over heads")
        ax.fill_between(layers, mean - std, mean + std, color="black", alpha=0.15, lw=0)
        ax.axhline(uniform, ls="--", color="grey", lw=1, label="uniform attention")
        ax.set_title(caption, fontsize=9)
        ax.set_xlabel("network depth (layer)", fontsize=8)
        ax.set_xticks(layers)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean attention distance (px)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)

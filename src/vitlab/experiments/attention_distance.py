"""Experiment attention-distance (paper Section 4.5, Fig. 7 right, Appendix D.7, Fig. 11): mean attention distance
per head against depth of the ViT pre-trained on the largest fractal set (data-scaling's run), beside the same
ViT trained only on digits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import plots
from .plans import pretrain, tuned_pretrain_lr
from .runner import Context

NAME = "attention-distance"
TITLE = "Mean attention distance"
PAPER = "Section 4.5, Fig. 7 (right), Appendix D.7, Fig. 11"
FINDING = ("Some heads attend to most of the image already in the lowest layers, others attend locally; the "
           "attention distance increases with network depth.")
SETUP = ("The data-scaling ViT (size M: 6 layers, 2 heads, 8×8 patches of 4 px) pre-trained on the largest fractal "
         "set, and the same ViT trained on digits alone with the same recipe, steps and learning rate; distances "
         "in input pixels between patch centres weighted by attention, over {attention_images} held-out images "
         "of each model's own training data (fractal validation images, digits test images).")


def plan(ctx: Context) -> dict[str, Any]:
    scale = ctx.scale
    lr = tuned_pretrain_lr(ctx, "ViT")
    fractal, digits = {}, {}
    for seed in ctx.seeds:
        fractal[seed] = ctx.run(pretrain(scale, "ViT", "M", scale.largest, lr, seed),
                                [f"attention/{scale.largest}", "attention/digits"])
        digits[seed] = ctx.run(pretrain(scale, "ViT", "M", "digits", lr, seed), ["attention/digits"])
    return {"lr": lr, "fractal": fractal, "digits": digits}


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale = ctx.scale
    models = {
        f"pre-trained on {scale.largest}": [planned["fractal"][s].evaluation(f"attention/{scale.largest}")
                                            for s in ctx.seeds],
        "trained on digits only": [planned["digits"][s].evaluation("attention/digits") for s in ctx.seeds],
        f"pre-trained on {scale.largest}, on digits images": [planned["fractal"][s].evaluation("attention/digits")
                                                                for s in ctx.seeds],
    }
    names = list(models)
    panels = [(name, [e["distance_px"] for e in models[name]], models[name][0]["uniform_px"]) for name in names[:2]]
    figure = plots.attention_panels(out / "attention_distance.png", panels)
    summaries = {name: _summary(evals) for name, evals in models.items()}
    rows = [[name, *(f"{v:.1f}" for v in s["layer_mean"]), f"{s['first_layer_max']:.1f}", f"{s['uniform']:.1f}"]
            for name, s in summaries.items()]
    depth = len(next(iter(summaries.values()))["layer_mean"])
    measured = [f"{name}: mean distance {s['layer_mean'][0]:.1f} px in layer 1 → {s['layer_mean'][-1]:.1f} px in "
                f"layer {depth}; farthest head of layer 1 {s['first_layer_max']:.1f} px (uniform attention: "
                f"{s['uniform']:.1f} px)" for name, s in summaries.items()]
    return {
        "tables": [{"title": "Mean attention distance (px) per layer, mean over heads and seeds",
                    "columns": ["model", *(f"layer {i + 1}" for i in range(depth)), "layer 1 farthest head",
                                "uniform attention"], "rows": rows}],
        "figures": [{"file": figure.name, "caption": "Mean attention distance of every head (dots; all seeds) "
                     "against depth; line: mean over heads, band ± one standard deviation over seeds of that "
                     "mean; dashed: uniform attention."}],
        "measured": measured,
        "check": _check(summaries[names[0]]),
        "choices": {"pretrain_lr": planned["lr"]},
        "data": {name: [e["distance_px"] for e in evals] for name, evals in models.items()},
    }


def _summary(evals: list[dict]) -> dict[str, Any]:
    d = np.asarray([e["distance_px"] for e in evals])  # (seeds, L, H)
    return {"layer_mean": [float(v) for v in d.mean(axis=(0, 2))], "first_layer_max": float(d[:, 0].max(axis=1).mean()),
            "uniform": float(evals[0]["uniform_px"])}


def _check(s: dict[str, Any]) -> dict[str, Any]:
    grows = s["layer_mean"][-1] > s["layer_mean"][0]
    far = s["first_layer_max"] >= 0.8 * s["uniform"]
    return {"holds": grows and far, "rule": "for the fractal-pre-trained ViT, the last layer's mean distance above "
            "the first layer's, and the farthest head of layer 1 (mean over seeds) at 80 % or more of the uniform-"
            "attention distance", "details": [
                f"layer-mean distance, layer 1 → last: {s['layer_mean'][0]:.1f} → {s['layer_mean'][-1]:.1f} px",
                f"farthest head of layer 1: {s['first_layer_max']:.1f} px = "
                f"{100 * s['first_layer_max'] / s['uniform']:.0f} % of uniform attention"]}

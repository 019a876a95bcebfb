"""Experiment attention-distance (paper Section 4.5, Fig. 7 right, Appendix D.7, Fig. 11): mean attention distance
per head against depth of the ViT pre-trained on the largest set of the pilot's source (data-scaling's run), beside
the same ViT trained only on digits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from reproduction.design import Check, Design, Verdict, revisions
from reproduction.measures import grid_checks, stat, top1
from reproduction.plans import pretrain, tuned_pretrain_lr
from reproduction.preconditions import LEARNS_TOP1, learns
from reproduction.report import plots
from reproduction.report.audit import audit, climbing, plateau
from reproduction.report.sections import brief
from reproduction.runner import Context

NAME = "attention-distance"
TITLE = "Mean attention distance"
PAPER = "Section 4.5, Fig. 7 (right), Appendix D.7, Fig. 11"
FINDING = ("Some heads attend to most of the image already in the lowest layers, others attend locally; the "
           "attention distance increases with network depth.")
SETUP = ("The data-scaling ViT (size M: 6 layers, 2 heads, 8×8 patches of 4 px) pre-trained on the largest {source} "
         "set, and the same ViT trained on digits alone with the same recipe, steps and learning rate; distances "
         "in input pixels between patch centres weighted by attention, over {attention_images} held-out images "
         "of each model's own training data ({source} validation images, digits test images).")


LOCAL, FAR = 0.5, 0.8  # fractions of the uniform-attention distance: a local head, one attending to most of it
PAPER_HEADS = 12  # ViT-B/16's heads per layer, the model of the paper's Fig. 7
TRIVIAL = 0.1  # every head within this fraction of uniform: attention no more local than averaging

REVISIONS = revisions(NAME)  # attention_distance.design.json: the design's version and its changes
DESIGN = Design(
    version=REVISIONS.version,
    question=("After pre-training that learnt its task, are some heads of the first layer local while others in "
              "it attend to most of the image, and does the mean attention distance grow with depth (paper Fig. 7 "
              "right, Fig. 11)?"),
    primary=("mean attention distance per layer and head of the pre-trained ViT on held-out images of its own "
             "pre-training set, against the distance uniform attention gives"),
    rule=(f"holds if, for every seed, (i) layer 1 has a head below {LOCAL:g} × the uniform-attention distance and "
          f"a head above {FAR:g} × it, and (ii) the Spearman correlation of the per-layer mean distance with depth "
          f"is positive; if every head of every layer is within {100 * TRIVIAL:g} % of uniform, it holds "
          "trivially at most (attention no more local than averaging)"),
    preconditions={"a": f"every seed's pre-training upstream top-1 >= {LEARNS_TOP1:g} %",
                   "c": "the tuned pre-training learning rate inside its grid"},
    changes=REVISIONS.changes,
)


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
    learnt = [learns(f"seed {s}", top1(planned["fractal"][s])) for s in ctx.seeds]
    verdict = judge([e["distance_px"] for e in models[names[0]]], models[names[0]][0]["uniform_px"],
                    learnt + grid_checks(ctx))
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
        "verdict": verdict.to_dict(),
        "check": {"holds": verdict.finding_holds, "rule": DESIGN.rule, "details": [verdict.result]},
        "choices": {"pretrain_lr": planned["lr"]},
        "data": {name: [e["distance_px"] for e in evals] for name, evals in models.items()},
        "audit": audit_of([planned["fractal"][s] for s in ctx.seeds], verdict),
    }


def audit_of(records: list, verdict: Verdict) -> dict[str, Any]:
    """The post-hoc audit (experiments.audit): the paper's claim is about many heads in trained models; these have
    two heads per layer and (a′) says whether their pre-training had finished."""
    args = records[0].spec.settings.get("model_args", {})
    heads = args.get("num_heads")
    p = plateau(f"ViT-M pre-trained on {records[0].spec.settings.get('data')}", records)
    few = f"{heads} heads per layer (the paper's ViT-B/16: {PAPER_HEADS})" if heads and heads < PAPER_HEADS else ""
    late = f"models {climbing([p])}" if p["holds"] is False else ""
    reasons = f"{few} in {late}" if few and late else few or late
    label = (f"not testable at this budget: {reasons}" if reasons else
             f"testable at this budget: {verdict.state} stands")
    return audit(label, [p], measured=brief(verdict.result))


def _summary(evals: list[dict]) -> dict[str, Any]:
    d = np.asarray([e["distance_px"] for e in evals])  # (seeds, L, H)
    return {"layer_mean": [float(v) for v in d.mean(axis=(0, 2))], "first_layer_max": float(d[:, 0].max(axis=1).mean()),
            "uniform": float(evals[0]["uniform_px"])}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank): the Pearson correlation of the ranks."""
    rx, ry = _ranks(xs), _ranks(ys)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = float(np.sqrt((rx**2).sum() * (ry**2).sum()))
    return float((rx * ry).sum()) / denominator if denominator else 0.0


def _ranks(values: list[float]) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    order = v.argsort(kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    for value in np.unique(v):  # ties: their mean rank
        ranks[v == value] = ranks[v == value].mean()
    return ranks


def judge(per_seed: list[list[list[float]]], uniform: float, checks: list[Check]) -> Verdict:
    """The verdict from each seed's (layers, heads) mean attention distances and the uniform-attention distance."""
    d = np.asarray(per_seed, dtype=float)  # (seeds, L, H)
    first = d[:, 0, :] / uniform  # layer 1's heads as fractions of uniform
    mixed = [bool(f.min() < LOCAL and f.max() > FAR) for f in first]
    rho = [spearman(list(range(d.shape[1])), list(layer_means)) for layer_means in d.mean(axis=2)]
    grows = [r > 0 for r in rho]
    near = float(np.abs(d / uniform - 1).max())
    trivial = (f"every head is within {100 * near:.0f} % of the uniform-attention distance ({uniform:.1f} px): "
               "attention is no more local than averaging" if near <= TRIVIAL else "")
    rhos = stat(rho)
    result = (f"layer 1's heads at {100 * first.min():.0f}-{100 * first.max():.0f} % of uniform attention "
              f"({sum(mixed)} of {len(mixed)} seeds with a local head below {100 * LOCAL:g} % and a far one above "
              f"{100 * FAR:g} %); Spearman of layer-mean distance with depth {rhos['mean']:+.2f} (min "
              f"{min(rho):+.2f}, positive in {sum(grows)} of {len(grows)} seeds)")
    return Verdict(all(mixed) and all(grows), result, checks, trivial)

"""Experiment data-scaling (paper Section 4.2, Figs. 3 and 4): transfer of ViT, BiT and hybrid pre-trained on
fractal sets of increasing size, each family at its own tuned learning rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import plots
from .families import FAMILIES, model_table
from .measures import metric_names, show, stat, transfer
from .plans import TUNING_SEED, finetune, pretrain, transfer_evals, tuned_finetune_lr, tuned_pretrain_lr, untrained
from .runner import Context

NAME = "data-scaling"
TITLE = "Pre-training data size"
PAPER = "Section 4.2, Figs. 3 and 4"
FINDING = ("With little pre-training data the ResNets (BiT) transfer better than ViTs of comparable size and "
           "compute; as the pre-training set grows the ViTs catch up and overtake them (\"large scale training "
           "trumps inductive bias\").")
SETUP = ("ViT, BiT ResNetV2 and hybrid of matched size (M in the model table) pre-trained on fractal sets of "
         "{categories} categories × {per_class} images (the same number of steps for every size, so smaller sets "
         "are seen for more epochs, as in Fig. 4), then evaluated by few-shot linear regression on "
         "{fewshot_data} and by fine-tuning on each. References without pre-training: the few-shot accuracy of "
         "each model's initial weights, and each model trained on the target alone with the fine-tuning recipe.")


def plan(ctx: Context) -> dict[str, Any]:
    scale = ctx.scale
    lr = {f: tuned_pretrain_lr(ctx, f) for f in FAMILIES}
    # a fine-tuning lr per family and target, chosen from the largest set's seed-0 pre-training (Appendix B.1.1)
    ft_lr = {d: {f: tuned_finetune_lr(ctx, pretrain(scale, f, "M", scale.largest, lr[f], TUNING_SEED), data=d)
                 for f in FAMILIES} for d in scale.finetune_data}
    runs = {}
    for f in FAMILIES:
        for n in scale.per_class:
            for seed in ctx.seeds:
                pre = pretrain(scale, f, "M", scale.dataset(n), lr[f], seed)
                record = ctx.run(pre, transfer_evals(scale))
                runs[(f, n, seed)] = (record, {d: ctx.run(finetune(scale, pre, ft_lr[d][f], seed, data=d))
                                               for d in scale.finetune_data})
    # references: the same model untrained (few-shot) and trained on the target alone at its own tuned lr
    scratch_lr = {d: {f: tuned_finetune_lr(ctx, None, scratch=(f, "M"), data=d) for f in FAMILIES}
                  for d in scale.finetune_data}
    for f in FAMILIES:
        for seed in ctx.seeds:
            runs[("untrained", f, seed)] = (
                ctx.run(untrained(scale, f, "M", seed), transfer_evals(scale)),
                {d: ctx.run(finetune(scale, None, scratch_lr[d][f], seed, scratch=(f, "M"), data=d))
                 for d in scale.finetune_data})
    return {"lr": lr, "finetune_lr": ft_lr, "scratch_lr": scratch_lr, "runs": runs}


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale = ctx.scale
    metrics = metric_names(scale, scale.finetune_data)
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for f in FAMILIES:
        for n in scale.per_class:
            per_seed = [transfer(scale, *planned["runs"][(f, n, s)]) for s in ctx.seeds]
            cells[(f, n)] = {key: stat([v[key] for v in per_seed]) for key, _ in metrics}
    for f in FAMILIES:  # no pre-training: few-shot of the untrained model, fine-tuned = trained on the target only
        per_seed = [transfer(scale, *planned["runs"][("untrained", f, s)]) for s in ctx.seeds]
        cells[(f, 0)] = {key: stat([v[key] for v in per_seed]) for key, _ in metrics}
    sizes = [scale.images(n) for n in scale.per_class]
    panels = [(caption, {f: (sizes, [cells[(f, n)][key] for n in scale.per_class]) for f in FAMILIES})
              for key, caption in metrics]
    references = [{f: cells[(f, 0)][key] for f in FAMILIES} for key, _ in metrics]
    figure = plots.line_panels(out / "data_scaling.png", panels, "pre-training images (fractal)",
                               title="Transfer against pre-training set size (paper Figs. 3, 4); dashed: no "
                               "pre-training", references=references)
    columns = ["pre-training images", "family"] + [caption for _, caption in metrics]
    rows = [[f"{scale.images(n):,}" if n else "none", f] + [show(cells[(f, n)][key]) for key, _ in metrics]
            for n in (0, *scale.per_class) for f in FAMILIES]
    small, large = min(scale.per_class), max(scale.per_class)
    measured = [f"at {scale.images(n):,} images, {caption}: " + " vs ".join(
        f"{f} {show(cells[(f, n)][key])}" for f in FAMILIES) for n in (small, large) for key, caption in metrics]
    measured += [f"without pre-training, {caption}: " + " vs ".join(f"{f} {show(cells[(f, 0)][key])}"
                                                                     for f in FAMILIES) for key, caption in metrics]
    return {
        "tables": [{"title": "Transfer accuracy (mean ± std over seeds)", "columns": columns, "rows": rows},
                   _models_table(scale)],
        "figures": [{"file": figure.name, "caption": "Few-shot and fine-tuned accuracy against the number of "
                     "pre-training images; mean over seeds, band ± one standard deviation. Dashed lines: the same "
                     "model without pre-training (few-shot: its initial weights; fine-tuned: trained on the "
                     "target alone with the fine-tuning recipe at its own tuned learning rate)."}],
        "measured": measured,
        "check": _check(scale, cells, metrics, small, large),
        "choices": {"pretrain_lr": planned["lr"],
                    **{f"{d}_finetune_lr": planned["finetune_lr"][d] for d in scale.finetune_data},
                    **{f"{d}_from_scratch_lr": planned["scratch_lr"][d] for d in scale.finetune_data}},
        "data": {f"{f}/{scale.images(n)}": cells[(f, n)] for f in FAMILIES for n in (0, *scale.per_class)},
    }


def _check(scale: Any, cells: dict, metrics: list, small: int, large: int) -> dict[str, Any]:
    """The paper's ordering, per metric: BiT ahead of ViT on the smallest set, and the ViT's deficit smaller (or
    a lead) on the largest set."""
    holds, lines = [], []
    for key, caption in metrics:
        gap_small = cells[("ViT", small)][key]["mean"] - cells[("BiT", small)][key]["mean"]
        gap_large = cells[("ViT", large)][key]["mean"] - cells[("BiT", large)][key]["mean"]
        ok = gap_small < 0 and gap_large > gap_small
        holds.append(ok)
        lines.append(f"{caption}: ViT − BiT {gap_small:+.1f} points at {scale.images(small):,} images, "
                     f"{gap_large:+.1f} at {scale.images(large):,}")
    return {"holds": all(holds), "rule": "BiT ahead of ViT on the smallest set and the ViT − BiT difference "
            "larger on the largest set, for every metric", "details": lines}


def _models_table(scale: Any) -> dict[str, Any]:
    rows = [[r["family"], r["size"], r["architecture"], f"{r['params']:,}", f"{r['macs'] / 1e6:.1f} M"]
            for r in model_table(scale, scale.categories)]
    return {"title": f"Models at {scale.image_size}×{scale.image_size} px (vitlab's counters; multiply-adds per "
            "image, forward)", "columns": ["family", "size", "architecture", "parameters", "multiply-adds"],
            "rows": rows}

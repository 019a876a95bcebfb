"""Experiment compute (paper Section 4.4, Fig. 5): transfer against pre-training compute for the three families
at three sizes each, pre-trained on the largest fractal set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import plots
from .families import FAMILIES, MODELS, SIZES, model_table
from .measures import metric_names, show, stat, transfer
from .plans import TUNING_SEED, finetune, pretrain, transfer_evals, tuned_finetune_lr, tuned_pretrain_lr
from .runner import Context

NAME = "compute"
TITLE = "Performance against pre-training compute"
PAPER = "Section 4.4, Fig. 5"
FINDING = ("Vision Transformers dominate ResNets on the performance/compute trade-off: a ViT needs about 2-4× "
           "less pre-training compute for the same transfer performance. Hybrids slightly outperform ViTs at "
           "small computational budgets, and the difference vanishes for larger models.")
SETUP = ("ViT, BiT ResNetV2 and hybrid at three sizes each (S, M, L in the model table) pre-trained for "
         "{steps} steps of {batch_size} images on the largest fractal set; compute is vitlab's count of training "
         "multiply-adds (3× the forward pass less the first layer's input gradient) times the images seen. "
         "Learning rates are the ones chosen for size M (data-scaling's), per family.")


def plan(ctx: Context) -> dict[str, Any]:
    scale = ctx.scale
    lr = {f: tuned_pretrain_lr(ctx, f) for f in FAMILIES}
    ft_lr = {f: tuned_finetune_lr(ctx, pretrain(scale, f, "M", scale.largest, lr[f], TUNING_SEED)) for f in FAMILIES}
    runs = {}
    for f in FAMILIES:
        for size in SIZES:
            for seed in ctx.seeds:
                pre = pretrain(scale, f, size, scale.largest, lr[f], seed)
                record = ctx.run(pre, transfer_evals(scale))
                runs[(f, size, seed)] = (record, {"digits": ctx.run(finetune(scale, pre, ft_lr[f], seed))})
    return {"lr": lr, "finetune_lr": ft_lr, "runs": runs}


def pretraining_macs(scale: Any) -> dict[tuple[str, str], float]:
    """Training multiply-adds of one pre-training run, per family and size."""
    seen = scale.steps * scale.batch_size
    return {(r["family"], r["size"]): r["train_macs"] * seen for r in model_table(scale, scale.categories)}


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale = ctx.scale
    metrics = metric_names(scale)
    compute = pretraining_macs(scale)
    cells = {}
    for f in FAMILIES:
        for size in SIZES:
            per_seed = [transfer(scale, *planned["runs"][(f, size, s)]) for s in ctx.seeds]
            cells[(f, size)] = {key: stat([v[key] for v in per_seed]) for key, _ in metrics}
    panels = [(caption, {f: ([compute[(f, s)] for s in SIZES], [cells[(f, s)][key] for s in SIZES])
                         for f in FAMILIES}) for key, caption in metrics]
    figure = plots.line_panels(out / "compute.png", panels, "pre-training multiply-adds",
                               title="Transfer against pre-training compute (paper Fig. 5)")
    columns = ["family", "size", "pre-training multiply-adds"] + [caption for _, caption in metrics]
    rows = [[f, s, f"{compute[(f, s)]:.3g}"] + [show(cells[(f, s)][key]) for key, _ in metrics]
            for f in FAMILIES for s in SIZES]
    measured = [f"{caption}, size M (matched compute): " + " vs ".join(
        f"{f} {show(cells[(f, 'M')][key])} at {compute[(f, 'M')]:.3g}" for f in FAMILIES) for key, caption in metrics]
    return {
        "tables": [{"title": "Transfer accuracy by pre-training compute (mean ± std over seeds)", "columns": columns,
                    "rows": rows}],
        "figures": [{"file": figure.name, "caption": "Transfer accuracy against the multiply-adds of pre-training; "
                     "mean over seeds, band ± one standard deviation; points are sizes S, M, L."}],
        "measured": measured,
        "check": _check(cells, metrics),
        "choices": {"pretrain_lr": planned["lr"], "finetune_lr": planned["finetune_lr"]},
        "data": {f"{f}/{s}": {"compute": compute[(f, s)], "architecture": MODELS[(f, s)][0], **cells[(f, s)]}
                 for f in FAMILIES for s in SIZES},
    }


def _check(cells: dict, metrics: list) -> dict[str, Any]:
    """ViT ahead of BiT at matched compute (size M), and the hybrid's lead over the ViT larger at S than at L."""
    holds, details = [], []
    for key, caption in metrics:
        vit_bit = cells[("ViT", "M")][key]["mean"] - cells[("BiT", "M")][key]["mean"]
        lead_s = cells[("hybrid", "S")][key]["mean"] - cells[("ViT", "S")][key]["mean"]
        lead_l = cells[("hybrid", "L")][key]["mean"] - cells[("ViT", "L")][key]["mean"]
        holds.append(vit_bit > 0 and lead_s > 0 and lead_l < lead_s)
        details.append(f"{caption}: ViT − BiT at M {vit_bit:+.1f} points; hybrid − ViT {lead_s:+.1f} at S, "
                       f"{lead_l:+.1f} at L")
    return {"holds": all(holds), "rule": "for every metric, ViT ahead of BiT at matched compute (size M), and the "
            "hybrid ahead of the ViT at size S by more than at size L", "details": details}

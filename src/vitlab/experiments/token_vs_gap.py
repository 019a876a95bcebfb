"""Experiment token-vs-gap (paper Appendix D.3, Fig. 9): a class token against global average pooling, each at
the learning rate chosen for it, with the transfer curve over pre-training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import plots
from .measures import fewshot, show, stat, top1
from .plans import TUNING_SEED, pretrain, transfer_evals, tuned_pretrain_lr
from .runner import Context

NAME = "token-vs-gap"
TITLE = "Class token against global average pooling"
PAPER = "Appendix D.3, Fig. 9"
FINDING = ("A class token and global average pooling (GAP) of the patch tokens work equally well, provided each "
           "gets its own learning rate: GAP at the class token's learning rate does poorly.")
SETUP = ("ViT (size M) with a class token or with GAP (no class token), pre-trained on the largest fractal set; "
         "each classifier's learning rate chosen from {lrs} on the pre-training validation split (seed "
         f"{TUNING_SEED}); 5-shot {{curve_data}} accuracy of the checkpoints kept during pre-training.")
SEEDS = (0, 1, 2, 3, 4)  # the paper finds no difference: seeds tell a difference from noise


def spec(ctx: Context, gap: bool, lr: float, seed: int) -> Any:
    extra = {"classifier": "gap"} if gap else {}
    return pretrain(ctx.scale, "ViT", "M", ctx.scale.largest, lr, seed, tag="-gap" if gap else "", **extra)


def plan(ctx: Context) -> dict[str, Any]:
    lr_token = tuned_pretrain_lr(ctx, "ViT")
    lr_gap = tuned_pretrain_lr(ctx, "ViT", tag="-gap", classifier="gap")
    settings = {f"token, lr {lr_token:g}": (False, lr_token), f"GAP, lr {lr_gap:g}": (True, lr_gap)}
    if ctx.dry and lr_gap == lr_token:  # before the choice, count the runs a differing choice needs
        lr_token = next((lr for lr in ctx.scale.lrs if lr != lr_gap), lr_token)
    if lr_gap != lr_token:
        settings[f"GAP, lr {lr_token:g} (token's)"] = (True, lr_token)
    evals = [*transfer_evals(ctx.scale), f"curve/{ctx.scale.curve_data}"]
    runs = {(name, seed): ctx.run(spec(ctx, gap, lr, seed), evals)
            for name, (gap, lr) in settings.items() for seed in ctx.seeds}
    grid = {(gap, lr): ctx.run(spec(ctx, gap, lr, TUNING_SEED)) for gap in (False, True) for lr in ctx.scale.lrs}
    return {"lr_token": lr_token, "lr_gap": lr_gap, "settings": list(settings), "runs": runs, "grid": grid}


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale, seeds, names = ctx.scale, ctx.seeds, planned["settings"]
    curves = {}
    for name in names:
        points = [planned["runs"][(name, s)].evaluation(f"curve/{scale.curve_data}")["points"] for s in seeds]
        steps = [p[0] for p in points[0]]
        curves[name] = (steps, [stat([100 * run[i][1] for run in points]) for i in range(len(steps))])
    figure = plots.line_panels(out / "token_vs_gap.png", [(f"{scale.curve_data} 5-shot during pre-training",
                                                            curves)], "pre-training step", log_x=False,
                               title="Class token vs GAP (paper Fig. 9)")
    finals = {name: _finals(scale, [planned["runs"][(name, s)] for s in seeds]) for name in names}
    # whether each classifier learnt the pre-training task at all: a few-shot tie means little if one did not
    learnt = plots.bar_panels(out / "token_vs_gap_pretraining.png", [
        (f"pre-training val top-1\n(chance {100 / scale.categories:.1f} %)",
         {name: finals[name]["pre-training val top-1"] for name in names})], title="Class token vs GAP")
    keys = list(next(iter(finals.values())))
    rows = [[name] + [show(finals[name][k]) for k in keys] for name in names]
    grid_rows = [["GAP" if gap else "token", f"{lr:g}", f"{top1(r):.1f} %"]
                 for (gap, lr), r in planned["grid"].items()]
    token, gap_own = names[0], names[1]
    measured = [f"{k}: " + " vs ".join(f"{n} {show(finals[n][k])}" for n in names) for k in keys]
    return {
        "tables": [{"title": "After pre-training (mean ± std over seeds)", "columns": ["classifier"] + keys,
                    "rows": rows},
                   {"title": f"Learning-rate choice (seed {TUNING_SEED}, final top-1 on the pre-training validation "
                    "split)", "columns": ["classifier", "lr", "validation top-1"], "rows": grid_rows}],
        "figures": [{"file": figure.name, "caption": f"5-shot {scale.curve_data} accuracy of the checkpoints kept "
                     "during pre-training; mean over seeds, band ± one standard deviation."},
                    {"file": learnt.name, "caption": "Final top-1 on the pre-training validation split per classifier "
                     "and learning rate; bars the mean, dots the seeds, whiskers ± one standard deviation."}],
        "measured": measured,
        "check": _check(finals, token, gap_own, names[2] if len(names) > 2 else None, planned),
        "choices": {"lr_token": planned["lr_token"], "lr_gap": planned["lr_gap"]},
        "data": {"curves": {n: {"steps": c[0], "stats": c[1]} for n, c in curves.items()}, "finals": finals},
    }


def _finals(scale: Any, records: list) -> dict[str, dict]:
    out = {f"{k}-shot {d}": stat([fewshot(r, d, k) for r in records]) for d in scale.fewshot_data for k in scale.shots}
    out["pre-training val top-1"] = stat([top1(r) for r in records])
    return out


def _check(finals: dict, token: str, gap_own: str, gap_token_lr: str | None, planned: dict) -> dict[str, Any]:
    key = next(iter(finals[token]))
    t, g = finals[token][key], finals[gap_own][key]
    spread = 2 * max(t["std"], g["std"], 0.5)
    equal = abs(t["mean"] - g["mean"]) <= spread
    details = [f"{key}: token {show(t)} vs GAP at its own lr {show(g)} (difference {g['mean'] - t['mean']:+.1f} "
               f"points; 'equal' means within {spread:.1f}, twice the larger standard deviation, at least 1 point)"]
    worse = True
    if gap_token_lr is not None:
        w = finals[gap_token_lr][key]
        worse = w["mean"] < g["mean"]
        details.append(f"{key}: GAP at the token's lr {show(w)} vs at its own {show(g)}")
    else:
        details.append(f"both classifiers chose lr {planned['lr_token']:g}: there is no 'GAP at the token's lr' run")
    return {"holds": equal and worse, "rule": "token and GAP (each at its own lr) equal within twice the seeds' "
            "standard deviation in final 5-shot accuracy, and GAP at the token's lr lower than at its own",
            "details": details}

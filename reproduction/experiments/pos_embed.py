"""Experiment pos-embed (paper Appendix D.4, Table 8): no position embedding, 1-D, 2-D and relative, each
pre-trained with the same budget on the largest fractal set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reproduction.design import Check, Design, Verdict, revisions
from reproduction.measures import grid_checks, metric_names, show, stat, top1, transfer, within_spread
from reproduction.plans import pretrain, transfer_evals, tuned_pretrain_lr
from reproduction.preconditions import LEARNS_TOP1, SPREAD_FACTOR, beyond_spread, learns, standard_error
from reproduction.report import plots
from reproduction.report.audit import audit, climbing, paired_line, plateau
from reproduction.runner import Context

NAME = "pos-embed"
TITLE = "Position embeddings"
PAPER = "Appendix D.4, Table 8"
FINDING = ("A model without position embedding is clearly worse than one with (ImageNet 5-shot 61.4 % vs "
           "64.2 % for ViT-B/16), but which embedding is used hardly matters: 1-D 64.2 %, 2-D 64.0 %, relative "
           "64.0 %.")
SETUP = ("ViT (size M, 8×8 patches) pre-trained on the largest {source} set with each position embedding, same "
         "steps and learning rate (the one chosen for the 1-D embedding), {seeds} seeds; few-shot transfer as in "
         "the paper's Table 8 (no fine-tuning: the table reports few-shot only).")
# three seeds, as the budget allows (pos_embed.design.json); whether the differences exceed their spread is (d)
SEEDS = (0, 1, 2)
VARIANTS = {"none": "none", "1-D": "learned", "2-D": "2d", "relative": "relative"}
EMBEDDINGS = ("1-D", "2-D", "relative")
UPSTREAM = "upstream top-1"

REVISIONS = revisions(NAME)  # pos_embed.design.json: the design's version and its changes
DESIGN = Design(
    version=REVISIONS.version,
    question=("Is a ViT without position embedding worse than with one, while 1-D, 2-D and relative embeddings do "
              "about equally well (paper Table 8: none ~3 points worse, the three within ~0.5)?"),
    primary="upstream top-1: final top-1 on the largest set's validation split, per position embedding",
    rule=(f"holds if none is below 1-D by more than {SPREAD_FACTOR:g} standard errors of the difference over "
          "seeds (precondition d), and every pair of 1-D, 2-D and relative is within that spread of each other "
          "(each pair reported)"),
    preconditions={
        "a": f"every variant's upstream top-1 >= {LEARNS_TOP1:g} %",
        "c": "the tuned pre-training lr (chosen for 1-D, shared) inside its grid",
        "d": f"1-D − none beyond {SPREAD_FACTOR:g} standard errors over seeds",
    },
    changes=REVISIONS.changes,
)


def spec(ctx: Context, kind: str, lr: float, seed: int) -> Any:
    """The ViT with position embedding `kind`; the 1-D (default) one is the same run as data-scaling's."""
    extra = {} if kind == "learned" else {"pos_embed": kind}
    tag = "" if kind == "learned" else f"-pos_{kind}"
    return pretrain(ctx.scale, "ViT", "M", ctx.scale.largest, lr, seed, tag=tag, **extra)


def plan(ctx: Context) -> dict[str, Any]:
    scale = ctx.scale
    lr = tuned_pretrain_lr(ctx, "ViT")
    runs = {}
    for name, kind in VARIANTS.items():
        for seed in ctx.seeds:
            pre = spec(ctx, kind, lr, seed)
            runs[(name, seed)] = (ctx.run(pre, transfer_evals(scale)), {})
    return {"lr": lr, "runs": runs}


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale = ctx.scale
    metrics = [("upstream", UPSTREAM), *metric_names(scale, finetune_data=())]
    cells = {}
    for name in VARIANTS:
        per_seed = [{"upstream": top1(planned["runs"][(name, s)][0]), **transfer(scale, *planned["runs"][(name, s)])}
                    for s in ctx.seeds]
        cells[name] = {key: stat([v[key] for v in per_seed]) for key, _ in metrics}
    verdict, pairs = judge({name: cells[name]["upstream"] for name in VARIANTS}, grid_checks(ctx))
    panels = [(caption, {name: cells[name][key] for name in VARIANTS}) for key, caption in metrics]
    figure = plots.bar_panels(out / "pos_embed.png", panels, title="Position embeddings (paper Table 8)")
    columns = ["position embedding"] + [caption for _, caption in metrics]
    rows = [[name] + [show(cells[name][key]) for key, _ in metrics] for name in VARIANTS]
    measured = [f"{caption}: " + ", ".join(f"{name} {show(cells[name][key])}" for name in VARIANTS)
                for key, caption in metrics]
    return {
        "tables": [{"title": "Upstream and transfer accuracy by position embedding (mean ± std over seeds)",
                    "columns": columns, "rows": rows}],
        "figures": [{"file": figure.name, "caption": "Upstream and transfer accuracy by position embedding; bars "
                     "are means over seeds, error bars ± one standard deviation, dots the seeds."}],
        "measured": measured,
        "verdict": verdict.to_dict(),
        "check": {"holds": verdict.finding_holds, "rule": DESIGN.rule, "details": [verdict.result, *pairs]},
        "choices": {"pretrain_lr": planned["lr"]},
        "data": cells,
        "audit": audit_of(planned, ctx.seeds),
    }


# The pairs the audit reads, each as (higher, lower) in the paper's terms: none below 1-D, then the embeddings.
PAIRS = (("1-D", "none"), ("2-D", "1-D"), ("relative", "1-D"), ("relative", "2-D"))


def audit_of(planned: dict[str, Any], seeds: tuple[int, ...]) -> dict[str, Any]:
    """The post-hoc audit (experiments.audit): the variants share seeds (the same initial draw of every shared
    weight and the same data order), so each difference is paired; and whether pre-training had plateaued."""
    records = {name: [planned["runs"][(name, s)][0] for s in seeds] for name in VARIANTS}
    values = {name: [top1(r) for r in rs] for name, rs in records.items()}
    plateaus = [plateau(name, rs) for name, rs in records.items()]
    found = {pair: paired_line(f"{pair[0]} − {pair[1]}, upstream top-1", values[pair[0]], values[pair[1]])
             for pair in PAIRS}
    none = found[PAIRS[0]][0]
    differ = [f"{a} > {b}" for (a, b), (p, _) in found.items() if (a, b) != PAIRS[0] and p["holds"]]
    first = "none < 1-D" if none["holds"] and none["mean"] > 0 else "none vs 1-D unresolved"
    second = ", ".join(differ) if differ else "no embedding pair resolved"
    late = climbing(plateaus)
    label = (f"{'before a plateau; ' if late else ''}paired: {first}; {second}")
    means = ", ".join(f"{name} {sum(v) / len(v):.1f}" for name, v in values.items())
    return audit(label, plateaus, [line for _, line in found.values()], [f"the ViTs are {late}"] if late else [],
                 measured=f"upstream top-1: {means} %")


def judge(upstream: dict[str, dict[str, Any]], lr_checks: list[Check]) -> tuple[Verdict, list[str]]:
    """The verdict from each variant's upstream top-1 `stat`; also one sentence per pair of embeddings."""
    checks = [learns(f"position embedding {name}", s["mean"]) for name, s in upstream.items()]
    checks += [*lr_checks, beyond_spread("1-D − none, upstream top-1", upstream["1-D"], upstream["none"])]
    below = upstream["1-D"]["mean"] - upstream["none"]["mean"]
    pairs, close = [], []
    for i, a in enumerate(EMBEDDINGS):
        for b in EMBEDDINGS[i + 1:]:
            ok = within_spread(upstream[a], upstream[b])
            close.append(ok)
            pairs.append(f"{a} − {b}: {upstream[a]['mean'] - upstream[b]['mean']:+.1f} points (standard error "
                         f"{standard_error(upstream[a], upstream[b]):.1f}): " + ("within" if ok else "beyond")
                         + " the spread")
    low, high = (min(EMBEDDINGS, key=lambda n: upstream[n]["mean"]), max(EMBEDDINGS, key=lambda n: upstream[n]["mean"]))
    none_worse = below > 0 and checks[-1].holds is not False
    result = (f"upstream top-1: none {show(upstream['none'])} (none − 1-D {-below:+.1f} points); the three "
              f"embeddings span {upstream[high]['mean'] - upstream[low]['mean']:.1f} points ({low} "
              f"{show(upstream[low])} to {high} {show(upstream[high])}), {sum(close)} of {len(close)} pairs within "
              "the spread")
    return Verdict(none_worse and all(close), result, checks), pairs

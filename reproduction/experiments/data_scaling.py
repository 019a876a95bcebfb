"""Experiment data-scaling (paper Section 4.2, Figs. 3 and 4): ViT, BiT and hybrid pre-trained on nested sets of
increasing size, each family at its own tuned learning rate; scored upstream on one held-out set (the primary view)
and downstream on MNIST (few-shot on two representations, fine-tuning against training from scratch)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from reproduction.design import Check, Design, Verdict, revisions
from reproduction.families import FAMILIES, model_table
from reproduction.measures import (
    describe_trend,
    fewshot,
    grid_checks,
    nearest_shots,
    show,
    slope,
    stat,
    top1,
    trend,
    upstream,
)
from reproduction.plans import finetune, pretrain, tuned_pretrain_lr, untrained
from reproduction.preconditions import HELPS_POINTS, LEARNS_TOP1, SPREAD_FACTOR, beyond_spread, helps, learns
from reproduction.report import lineage, plots
from reproduction.report.audit import audit, climbing, needed_seeds, plateau
from reproduction.runner import Context
from reproduction.stats import describe

NAME = "data-scaling"
TITLE = "Pre-training data size"
PAPER = "Section 4.2, Figs. 3 and 4"
FINDING = ("With little pre-training data the ResNets (BiT) transfer better than ViTs of comparable size and "
           "compute; as the pre-training set grows the ViTs catch up and overtake them (\"large scale training "
           "trumps inductive bias\").")
SETUP = ("ViT, BiT ResNetV2 and hybrid of matched size (M in the model table) pre-trained on nested {source} sets "
         "of {categories} categories × {per_class} images (the same number of steps for every size, so smaller "
         "sets are seen for more epochs, as in Fig. 4), each scored by its own classifier on the largest set's "
         "validation split (one held-out set for every size), then by few-shot linear regression on the encoder "
         "output and on `pre_logits`, and by fine-tuning. References without pre-training: each model's initial "
         "weights (few-shot) and each model trained on the target alone at its own tuned learning rate.")
SEEDS = (0, 1, 2)

REVISIONS = revisions(NAME)  # data_scaling.design.json: the design's version and its changes
DESIGN = Design(
    version=REVISIONS.version,
    question=("Does BiT lead the ViT on little pre-training data, and does the ViT − BiT gap shrink (or turn) as "
              "the pre-training set grows, as in the paper's Figs. 3 and 4?"),
    primary=("upstream top-1: each pre-trained model's own classifier on the largest set's validation split, the "
             "same held-out images for every set size (the nested sets share their classes)"),
    rule=("per seed, the ViT − BiT gap g(n) of the primary metric at each set size and its least-squares slope "
          "against log2(images); the finding holds (as a trend) if the mean gap at the smallest set is negative "
          f"(BiT ahead) and the mean slope is positive by more than {SPREAD_FACTOR:g} standard errors over seeds; "
          "a positive mean gap at the largest set is reported as a crossover. The same rule on MNIST 10-shot "
          "(encoder output and `pre_logits`) and on fine-tuned MNIST gives the secondary verdicts."),
    preconditions={
        "a": f"each family's upstream top-1 at the largest set >= {LEARNS_TOP1:g} %",
        "b": (f"at the largest set each family beats its no-pre-training reference by >= {HELPS_POINTS:g} points "
              "on MNIST 10-shot on the encoder output (vs its initial weights) and on fine-tuned MNIST (vs trained "
              "from scratch); a condition of the transfer verdicts, reported beside the upstream one"),
        "c": "every family's tuned pre-training learning rate (which fine-tuning and the from-scratch reference "
             "use too) inside its grid after the grid-extension rule",
        "d": f"the mean slope of the ViT − BiT upstream gap beyond {SPREAD_FACTOR:g} standard errors over seeds",
    },
    changes=REVISIONS.changes,
)


def targets(scale: Any) -> tuple[str, str, int]:
    """(few-shot target, fine-tuning target, shots): MNIST and 10 shots at full scale."""
    return scale.fewshot_data[-1], scale.finetune_data[0], nearest_shots(scale)


def pretraining_evals(scale: Any) -> list[str]:
    fs, _, _ = targets(scale)
    return [f"upstream/{scale.largest}", f"fewshot-encoder/{fs}", f"fewshot/{fs}"]


def plan(ctx: Context) -> dict[str, Any]:
    scale = ctx.scale
    _, ft, _ = targets(scale)
    lr = {f: tuned_pretrain_lr(ctx, f) for f in FAMILIES}
    runs, references = {}, {}
    for f in FAMILIES:  # fine-tuning and the from-scratch reference at the family's lr (plans.finetune)
        for n in scale.per_class:
            for seed in ctx.seeds:
                pre = pretrain(scale, f, "M", scale.dataset(n), lr[f], seed)
                runs[(f, n, seed)] = (ctx.run(pre, pretraining_evals(scale)), ctx.run(finetune(scale, pre, seed)))
        for seed in ctx.seeds:  # no pre-training: the untrained model (few-shot), trained on the target alone
            references[(f, seed)] = (ctx.run(untrained(scale, f, "M", seed), pretraining_evals(scale)[1:]),
                                     ctx.run(finetune(scale, None, seed, scratch=(f, "M"), lr=lr[f])))
    return {"lr": lr, "runs": runs, "references": references}


def metrics(scale: Any) -> list[tuple[str, str]]:
    """(key, caption): the primary metric first."""
    fs, ft, k = targets(scale)
    return [("upstream", f"upstream top-1 (held out, {scale.largest})"), ("encoder", f"{k}-shot {fs}, encoder"),
            ("pre_logits", f"{k}-shot {fs}, pre_logits"), ("fine-tuned", f"fine-tuned {ft}")]


def values_of(scale: Any, pre: Any, tuned: Any, pretrained: bool = True) -> dict[str, float]:
    """The metrics of one seed: a pre-training run and its fine-tuning (a reference: the untrained model and the
    one trained from scratch, which have no upstream score)."""
    fs, _, k = targets(scale)
    out = {"encoder": fewshot(pre, fs, k, "encoder"), "pre_logits": fewshot(pre, fs, k), "fine-tuned": top1(tuned)}
    if pretrained:
        out["upstream"] = upstream(pre, scale.largest)
    return out


def judge(values: dict[tuple[str, int], dict[str, list[float]]], references: dict[str, dict[str, list[float]]],
          images: list[int], captions: dict[str, str], lr_checks: list[Check]) -> tuple[Verdict, list[str]]:
    """The verdict from per-seed values: values[(family, images)][metric] and references[family][metric] (lists
    over the same seeds), `images` ascending. Returns the verdict and the secondary verdict sentences."""
    largest = images[-1]
    trends = {key: trend(_per_seed_gaps(values, key, images), images) for key in captions}
    primary = trends["upstream"]
    learnt = [learns(f"{f} at {largest:,} images", stat(values[(f, largest)]["upstream"])["mean"])
              for f in FAMILIES if (f, largest) in values]
    helped = {key: [helps(f"{f} at {largest:,} images, {captions[key]} (vs {reference})",
                          stat(values[(f, largest)][key])["mean"], stat(references[f][key])["mean"])
                    for f in FAMILIES if (f, largest) in values]
              for key, reference in (("encoder", "its initial weights"), ("fine-tuned", "trained from scratch"))}
    zero = {"mean": 0.0, "std": 0.0, "n": primary["slope"]["n"]}
    spread = beyond_spread("slope of the ViT − BiT upstream gap per doubling of the images", primary["slope"], zero)
    # (b) is a condition of the transfer views (below), listed beside the upstream verdict for the reader
    beside = [replace(c, decides="the transfer verdicts")
              for pair in zip(helped["encoder"], helped["fine-tuned"], strict=True) for c in pair]
    checks = [*learnt, *beside, *lr_checks, spread]
    result = describe_trend("ViT − BiT " + captions["upstream"], primary, images)
    details = [_secondary(describe_trend("ViT − BiT " + captions[key], trends[key], images), trends[key],
                          learnt + helped[_FAIRNESS[key]] + lr_checks) for key in captions if key != "upstream"]
    return Verdict(primary["closes"], result, checks), details


# The (b) check a secondary verdict rests on: the design states (b) for few-shot on the encoder output (against the
# initial weights) and for fine-tuning (against training from scratch); few-shot on pre_logits is few-shot too.
_FAIRNESS = {"encoder": "encoder", "pre_logits": "encoder", "fine-tuned": "fine-tuned"}


def _secondary(sentence: str, t: dict[str, Any], checks: list[Check]) -> str:
    """A transfer view's verdict sentence: its trend, then holds (trend) / does not hold, or inconclusive when the
    pre-training it transfers did not learn (a), did not help that kind of transfer (b), or its lr was at an edge
    (c): a transfer trend from pre-training that does not transfer tests nothing."""
    state = Verdict(t["closes"], sentence, checks).state
    return f"{sentence}: {'holds (trend)' if state == 'holds' else state}"


def _per_seed_gaps(values: dict, key: str, images: list[int]) -> list[list[float]]:
    """ViT − BiT of `key`, one list over the set sizes per seed."""
    seeds = len(values[("ViT", images[0])][key])
    return [[values[("ViT", n)][key][s] - values[("BiT", n)][key][s] for n in images] for s in range(seeds)]


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale = ctx.scale
    names = metrics(scale)
    captions = dict(names)
    images = [scale.images(n) for n in scale.per_class]
    values = {(f, scale.images(n)): _columns([values_of(scale, *planned["runs"][(f, n, s)]) for s in ctx.seeds])
              for f in FAMILIES for n in scale.per_class}
    references = {f: _columns([values_of(scale, *planned["references"][(f, s)], pretrained=False)
                                     for s in ctx.seeds])
                  for f in FAMILIES}
    cells = {k: {m: stat(v) for m, v in per.items()} for k, per in values.items()}
    refs = {f: {m: stat(v) for m, v in per.items()} for f, per in references.items()}
    verdict, secondary = judge(values, references, images, captions, grid_checks(ctx))
    panels = [(caption, {f: (images, [cells[(f, n)][key] for n in images]) for f in FAMILIES})
              for key, caption in names]
    figure = plots.line_panels(out / "data_scaling.png", panels, f"pre-training images ({scale.source})",
                               title="Accuracy against pre-training set size (paper Figs. 3, 4); dashed: no "
                               "pre-training", references=[{}] + [{f: refs[f][key] for f in FAMILIES}
                                                                  for key, _ in names[1:]])
    again = _retrained_cells(scale, planned, ctx.seeds)
    rows = [[f"{n:,}", f] + [lineage.mark(show(cells[(f, n)][key]), again.get((f, n, key), False))
                             for key, _ in names] for n in images for f in FAMILIES]
    rows += [["none", f, "—"] + [show(refs[f][key]) for key, _ in names[1:]] for f in FAMILIES]
    measured = [f"{caption}: " + "; ".join(f"{f} {show(cells[(f, images[0])][key])} at {images[0]:,} images → "
                                           f"{show(cells[(f, images[-1])][key])} at {images[-1]:,}" for f in FAMILIES)
                for key, caption in names]
    measured += [f"without pre-training, {caption}: " + " vs ".join(f"{f} {show(refs[f][key])}" for f in FAMILIES)
                 for key, caption in names[1:]]
    return {
        "tables": [{"title": "Upstream and transfer accuracy (mean ± std over seeds)"
                    + (f"; {lineage.FOOTNOTE}" if any(again.values()) else ""),
                    "columns": ["pre-training images", "family"] + [c for _, c in names], "rows": rows},
                   _models_table(scale)],
        "figures": [{"file": figure.name, "caption": "Left: upstream top-1 of every pre-trained model on the same "
                     "held-out images (the largest set's validation split) against the number of pre-training "
                     "images; then MNIST few-shot (encoder output, pre_logits) and fine-tuned accuracy. Mean over "
                     "seeds, band ± one standard deviation; dashed: the same model without pre-training."}],
        "measured": measured,
        "verdict": verdict.to_dict(),
        "check": {"holds": verdict.finding_holds, "rule": DESIGN.rule, "details": [verdict.result, *secondary]},
        "choices": {"pretrain_lr": planned["lr"]},  # fine-tuning and the references use the same lr
        "data": {"pre-trained": {f"{f}/{n}": cells[(f, n)] for f in FAMILIES for n in images},
                 "without pre-training": refs},
        "audit": audit_of(planned, ctx.seeds, values, images, scale),
    }


def _retrained_cells(scale: Any, planned: dict[str, Any], seeds: tuple[int, ...]) -> dict[tuple, bool]:
    """(family, images, metric) -> whether a seed's value there was read from retrained weights (experiments.lineage:
    the upstream metric never is, measures.upstream reads the original run's)."""
    fs, _, _ = targets(scale)
    out = {}
    for f in FAMILIES:
        for n in scale.per_class:
            pairs = [planned["runs"][(f, n, s)] for s in seeds]
            key = (f, scale.images(n))
            out[(*key, "encoder")] = any(lineage.from_retrained(pre, f"fewshot-encoder/{fs}") for pre, _ in pairs)
            out[(*key, "pre_logits")] = any(lineage.from_retrained(pre, f"fewshot/{fs}") for pre, _ in pairs)
            out[(*key, "fine-tuned")] = any(lineage.started_from_retrained(ft, pre) for pre, ft in pairs)
    return out


def audit_of(planned: dict[str, Any], seeds: tuple[int, ...], values: dict, images: list[int],
             scale: Any) -> dict[str, Any]:
    """The post-hoc audit (experiments.audit): the primary slope per seed (ViT and BiT of one seed share its data
    order) under the paired rule, the seeds it would need, and (a′) at the largest set."""
    xs = [math.log2(n) for n in images]
    slopes = [slope(xs, g) for g in _per_seed_gaps(values, "upstream", images)]
    s, needed = needed_seeds(slopes)
    line = describe("slope of the ViT − BiT upstream gap", s, "points per doubling")
    largest = scale.per_class[-1]
    plateaus = [plateau(f"{f}-M at {images[-1]:,} images", [planned["runs"][(f, largest, seed)][0] for seed in seeds])
                for f in FAMILIES]
    if s["holds"]:
        label = "resolved by the paired rule: " + line
    else:
        count = f"about {needed}" if needed else "more than 1,000"
        label = (f"underpowered: {count} seeds would detect its slope ({s['mean']:+.2f} ± {s['sd']:.2f} points "
                 f"per doubling over {len(seeds)} seeds)")
    late = climbing([p for p in plateaus if p["what"].startswith("ViT")])
    t = trend(_per_seed_gaps(values, "upstream", images), images)
    headline = (f"ViT − BiT upstream top-1 {t['first']['mean']:+.1f} points at {images[0]:,} images, "
                f"{t['last']['mean']:+.1f} at {images[-1]:,} (slope {s['mean']:+.2f} per doubling)")
    return audit(label + ("; the ViT-M still climbing" if late else ""), plateaus, [line],
                 [f"the ViT-M is {late} at the largest set"] if late else [], measured=headline)


def _columns(per_seed: list[dict[str, float]]) -> dict[str, list[float]]:
    """[{metric: value}] over seeds -> {metric: [value per seed]}."""
    return {key: [v[key] for v in per_seed] for key in per_seed[0]}


def _models_table(scale: Any) -> dict[str, Any]:
    rows = [[r["family"], r["size"], r["architecture"], f"{r['params']:,}", f"{r['macs'] / 1e6:.1f} M"]
            for r in model_table(scale, scale.categories)]
    return {"title": f"Models at {scale.image_size}×{scale.image_size} px (vitlab's counters; multiply-adds per "
            "image, forward)", "columns": ["family", "size", "architecture", "parameters", "multiply-adds"],
            "rows": rows}

"""Experiment mpp (paper Section 4.6, Appendix B.1.2): masked patch prediction on the largest pre-training set,
then fine-tuning, against training from scratch and against supervised pre-training on the same set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reproduction.design import Check, Design, Verdict, revisions
from reproduction.measures import fewshot, grid_checks, show, stat, top1
from reproduction.plans import finetune, pretrain, transfer_evals, tuned_pretrain_lr
from reproduction.preconditions import HELPS_POINTS, LEARNS_TOP1, SPREAD_FACTOR, beyond_spread, helps, learns
from reproduction.report import lineage, plots
from reproduction.report.audit import audit, climbing, paired_line, plateau
from reproduction.runner import Context
from reproduction.spec import RunSpec

NAME = "mpp"
TITLE = "Masked patch prediction"
PAPER = "Section 4.6, Appendix B.1.2"
FINDING = ("Self-supervised pre-training by masked patch prediction helps: ViT-B/16 reaches 79.9 % on ImageNet, "
           "2 % above training from scratch but 4 % below supervised pre-training.")
SETUP = ("ViT (size M) pre-trained on the largest {source} set by masked patch prediction (50 % of the patch "
         "embeddings corrupted, 3-bit mean colour of each as the target; recipe mpp) or supervised, then "
         "fine-tuned on the target; against the same ViT trained on the target from random initialisation with the "
         "same recipe and steps. Each pre-training learning rate chosen per method; fine-tuning at the weights' "
         "pre-training lr, the from-scratch reference at the supervised one (the ViT's from-scratch lr).")
METHODS = ("from scratch", "MPP pre-training", "supervised pre-training")
# MPP against from-scratch may differ by little at this scale; three seeds, as the budget allows (the design file)
SEEDS = (0, 1, 2)
MPP_MARGIN = 10.0  # points of colour top-1 the MPP run must gain over its own untrained start

REVISIONS = revisions(NAME)  # mpp.design.json: the design's version and its changes
DESIGN = Design(
    version=REVISIONS.version,
    question=("Does masked patch prediction on the source help fine-tuning on MNIST, above training from scratch "
              "and below supervised pre-training (paper: +2 points over scratch, −4 under supervised)?"),
    primary="fine-tuned MNIST top-1 of the ViT-M from scratch, from MPP pre-training, from supervised pre-training",
    rule=(f"holds if scratch < MPP < supervised with each of the two gaps (MPP − scratch, supervised − MPP) beyond "
          f"{SPREAD_FACTOR:g} standard errors over seeds"),
    preconditions={
        "a": (f"supervised upstream top-1 >= {LEARNS_TOP1:g} %; MPP's own colour top-1 on the corrupted patches of "
              f"the validation split at least {MPP_MARGIN:g} points above the same MPP model untrained (one step at "
              "lr 0: its chance level; a constant most-frequent-colour guess is not excluded by this)"),
        "b": f"supervised pre-training beats from scratch on fine-tuned MNIST by >= {HELPS_POINTS:g} points",
        "c": "both tuned pre-training learning rates (MPP, supervised) inside their grids",
        "d": "MPP − scratch and supervised − MPP each beyond the spread",
    },
    changes=REVISIONS.changes,
)


def untrained_mpp(scale: Any, seed: int) -> RunSpec:
    """The MPP model (encoder and prediction head) as its pre-training initialises it: one step at lr 0."""
    spec = pretrain(scale, "ViT", "M", scale.largest, 0.0, seed, mpp=True)
    settings = {**spec.settings, "steps": 1, "save_every": 0, "keep_last": 1, "eval_every": 0}
    return RunSpec(f"init-mpp-ViT-M-s{seed}", "mpp", settings)


def plan(ctx: Context) -> dict[str, Any]:
    scale = ctx.scale
    target = scale.finetune_data[0]
    lr = {"mpp": tuned_pretrain_lr(ctx, "ViT", mpp=True), "sup": tuned_pretrain_lr(ctx, "ViT")}

    def pre(kind: str, seed: int) -> Any:
        return pretrain(scale, "ViT", "M", scale.largest, lr[kind], seed, mpp=kind == "mpp")

    runs, start = {}, {}
    for seed in ctx.seeds:  # fine-tuning at each weights' own pre-training lr, from scratch at the supervised one
        mpp_run, sup_run = pre("mpp", seed), pre("sup", seed)
        runs[("MPP pre-training", seed)] = (ctx.run(mpp_run, transfer_evals(scale)),
                                            ctx.run(finetune(scale, mpp_run, seed)))
        runs[("supervised pre-training", seed)] = (ctx.run(sup_run, transfer_evals(scale)),
                                                   ctx.run(finetune(scale, sup_run, seed)))
        runs[("from scratch", seed)] = (None, ctx.run(finetune(scale, None, seed, scratch=("ViT", "M"),
                                                               lr=lr["sup"])))
        start[seed] = ctx.run(untrained_mpp(scale, seed))
    return {"lr": lr, "runs": runs, "mpp_start": start, "target": target}


def judge(tuned: dict[str, dict[str, Any]], supervised_top1: dict[str, Any], colour: dict[str, Any],
          colour_start: dict[str, Any], lr_checks: list[Check], target: str = "MNIST") -> Verdict:
    """The verdict from the fine-tuned `stat`s per method, the supervised run's upstream top-1 and MPP's colour
    top-1 after pre-training and untrained."""
    scratch, mpp_, sup = (tuned[m] for m in METHODS)
    gain = colour["mean"] - colour_start["mean"]
    checks = [learns("supervised pre-training", supervised_top1["mean"]),
              Check("a", "MPP pre-training (colour top-1)", f"{colour['mean']:.1f} % vs {colour_start['mean']:.1f} % "
                    f"untrained ({gain:+.1f}; needs {MPP_MARGIN:+g})", gain >= MPP_MARGIN),
              helps(f"supervised pre-training, fine-tuned {target} (vs from scratch)", sup["mean"], scratch["mean"]),
              *lr_checks,
              beyond_spread(f"MPP − scratch, fine-tuned {target}", mpp_, scratch),
              beyond_spread(f"supervised − MPP, fine-tuned {target}", sup, mpp_)]
    ordered = scratch["mean"] < mpp_["mean"] < sup["mean"]
    result = (f"fine-tuned {target}: scratch {show(scratch)}, MPP {show(mpp_)}, supervised {show(sup)} (MPP − "
              f"scratch {mpp_['mean'] - scratch['mean']:+.1f} points, MPP − supervised "
              f"{mpp_['mean'] - sup['mean']:+.1f}; paper +2 and −4): "
              + ("scratch < MPP < supervised" if ordered else "not in the paper's order"))
    return Verdict(ordered, result, checks)


def analyze(ctx: Context, planned: dict[str, Any], out: Path) -> dict[str, Any]:
    scale, seeds, target = ctx.scale, ctx.seeds, planned["target"]
    tuned = {m: stat([top1(planned["runs"][(m, s)][1]) for s in seeds]) for m in METHODS}
    shots = {f"{k}-shot {d}": {m: stat([fewshot(planned["runs"][(m, s)][0], d, k) for s in seeds])
                               for m in METHODS[1:]} for d in scale.fewshot_data for k in scale.shots}
    upstream = {"MPP colour top-1": stat([top1(planned["runs"][("MPP pre-training", s)][0]) for s in seeds]),
                "MPP colour top-1, untrained": stat([top1(planned["mpp_start"][s]) for s in seeds]),
                "supervised top-1": stat([top1(planned["runs"][("supervised pre-training", s)][0]) for s in seeds])}
    verdict = judge(tuned, upstream["supervised top-1"], upstream["MPP colour top-1"],
                    upstream["MPP colour top-1, untrained"], grid_checks(ctx), target)
    panels = [(f"fine-tuned {target}", tuned)] + list(shots.items())
    figure = plots.bar_panels(out / "mpp.png", panels, title="Masked patch prediction (paper Section 4.6)")
    again = {m: any(lineage.started_from_retrained(planned["runs"][(m, s)][1], planned["runs"][(m, s)][0])
                    for s in seeds) for m in METHODS}
    rows = [[m, lineage.mark(show(tuned[m]), again[m])] + [show(shots[k][m]) if m in shots[k] else "—"
                                                           for k in shots] for m in METHODS]
    measured = [f"fine-tuned {target}: " + " vs ".join(f"{m} {show(tuned[m])}" for m in METHODS)]
    measured += [f"{k}: " + " vs ".join(f"{m} {show(v)}" for m, v in shots[k].items()) for k in shots]
    measured += ["upstream: " + ", ".join(f"{k} {show(v)}" for k, v in upstream.items())]
    return {
        "tables": [{"title": "Fine-tuned and few-shot accuracy (mean ± std over seeds)"
                    + (f"; {lineage.FOOTNOTE}" if any(again.values()) else ""),
                    "columns": ["method", f"fine-tuned {target}", *shots], "rows": rows}],
        "figures": [{"file": figure.name, "caption": f"Fine-tuned accuracy on {target} by initialisation, and "
                     "few-shot accuracy of the two pre-trained representations; bars are means over seeds, error "
                     "bars ± one standard deviation, dots the seeds."}],
        "measured": measured,
        "verdict": verdict.to_dict(),
        "check": {"holds": verdict.finding_holds, "rule": DESIGN.rule, "details": [verdict.result]},
        "choices": {"pretrain_lr": planned["lr"]},
        "data": {"fine-tuned": tuned, "few-shot": shots, "upstream": upstream},
        "audit": audit_of(planned, seeds, target),
    }


def audit_of(planned: dict[str, Any], seeds: tuple[int, ...], target: str) -> dict[str, Any]:
    """The post-hoc audit (experiments.audit): the three arms share seeds (the same fine-tuning data order), so
    the gaps are paired; and whether the two pre-trainings had plateaued."""
    tuned = {m: [top1(planned["runs"][(m, s)][1]) for s in seeds] for m in METHODS}
    scratch, mpp_, sup = METHODS
    short = {scratch: "scratch", mpp_: "MPP", sup: "supervised"}
    pairs = [(short[a], short[b], *paired_line(f"{short[a]} − {short[b]}, fine-tuned {target}", tuned[a], tuned[b]))
             for a, b in ((mpp_, scratch), (sup, mpp_), (sup, scratch))]
    plateaus = [plateau(m, [planned["runs"][(m, s)][0] for s in seeds]) for m in METHODS[1:]]
    held = [f"{a} − {b} {p['mean']:+.1f}" for a, b, p, _ in pairs if p["holds"]]
    open_ = [f"{a} − {b}" for a, b, p, _ in pairs if not p["holds"]]
    late = climbing(plateaus)
    slow = " and ".join(p["what"] for p in plateaus if p["holds"] is False)
    label = ("paired: " + "; ".join(filter(None, [f"{', '.join(held)} holds" if held else "",
                                                  f"{', '.join(open_)} unresolved" if open_ else ""])))
    means = ", ".join(f"{short[m]} {sum(tuned[m]) / len(tuned[m]):.1f}" for m in METHODS)
    return audit(label, plateaus, [line for *_, line in pairs], [f"{slow} {late}"] if late else [],
                 measured=f"fine-tuned {target}: {means} %")

"""What the experiments read from finished runs (few-shot, upstream and top-1 accuracy, the transfer metrics), the
statistics over seeds, and the trend of a difference against data size (data-scaling's rule)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from reproduction.design import Check
from reproduction.preconditions import SPREAD_FACTOR, inside_grid, standard_error
from reproduction.runner import Context, Record
from reproduction.scale import Scale


def fewshot(record: Record, data: str, shots: int, representation: str = "pre_logits") -> float:
    """Mean few-shot accuracy (%) of a pre-training run over the protocol's draws, at `pre_logits` or on the
    encoder output ("encoder")."""
    kind = "fewshot" if representation == "pre_logits" else "fewshot-encoder"
    return 100 * record.evaluation(f"{kind}/{data}")["accuracy"][str(shots)]["mean"]


def upstream(record: Record, data: str) -> float:
    """Top-1 (%) of a pre-trained model's own classifier on `data`'s validation split (evals `upstream/<data>`).
    A run trained on `data` is scored on its own validation split, which is its final validation top-1: that
    number, the one every other section reads, also for a run whose `upstream` evaluation was computed on weights
    retrained on another machine (experiments.lineage: one run, one number)."""
    if record.spec.settings.get("data") == data:
        return top1(record)
    return 100 * record.evaluation(f"upstream/{data}")["top1"]


def nearest_shots(scale: Scale, wanted: int = 10) -> int:
    """The scale's shot count closest to the paper's `wanted` (10-shot: the paper's headline few-shot number)."""
    return min(scale.shots, key=lambda k: (abs(k - wanted), k))


def top1(record: Record) -> float:
    return 100 * record.val["top1"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def stat(values: list[float]) -> dict[str, Any]:
    mean, std = mean_std(values)
    return {"mean": round(mean, 3), "std": round(std, 3), "n": len(values), "values": [round(v, 3) for v in values]}


def show(s: dict[str, Any]) -> str:
    """'41.2±1.3 %' (± one standard deviation over seeds)."""
    return f"{s['mean']:.1f}±{s['std']:.1f} %"


def metric_names(scale: Scale, finetune_data: tuple[str, ...] = ("digits",)) -> list[tuple[str, str]]:
    """(key, caption) of the transfer metrics reported: few-shot per dataset and shot count, fine-tuned per
    dataset."""
    names = [(f"{d}/{k}-shot", f"{k}-shot {d}") for d in scale.fewshot_data for k in scale.shots]
    return names + [(f"{d}/fine-tuned", f"fine-tuned {d}") for d in finetune_data]


def transfer(scale: Scale, pre: Record, finetuned: Mapping[str, Record]) -> dict[str, float]:
    """Every transfer metric of one pre-training run and its fine-tuning runs, by target dataset."""
    values = {f"{d}/{k}-shot": fewshot(pre, d, k) for d in scale.fewshot_data for k in scale.shots}
    for data, record in finetuned.items():
        values[f"{data}/fine-tuned"] = top1(record)
    return values


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def trend(gaps: list[list[float]], images: list[int]) -> dict[str, Any]:
    """The trend of a difference g(n) (one list per seed, one value per set size) against log2(images): the
    per-seed least-squares slopes and their mean and standard error, and the mean gap at the smallest and the
    largest set. `closes`: the gap is negative at the smallest set and the mean slope positive by more than
    SPREAD_FACTOR standard errors over seeds; `crossover`: the mean gap at the largest set is positive."""
    xs = [math.log2(n) for n in images]
    slopes = stat([slope(xs, g) for g in gaps])
    first, last = stat([g[0] for g in gaps]), stat([g[-1] for g in gaps])
    se = slopes["std"] / math.sqrt(slopes["n"]) if slopes["n"] > 1 else float("nan")
    closes = first["mean"] < 0 and slopes["n"] > 1 and slopes["mean"] > SPREAD_FACTOR * se
    return {"slope": slopes, "slope_se": round(se, 3), "first": first, "last": last, "closes": closes,
            "crossover": last["mean"] > 0}


def describe_trend(what: str, t: dict[str, Any], images: list[int]) -> str:
    """'ViT − BiT upstream top-1: −21.0 points at 1,024 images, −6.0 at 65,536 (slope +3.8 ± 0.9 per doubling):
    gap closes, no crossover'."""
    return (f"{what}: {t['first']['mean']:+.1f} points at {images[0]:,} images, {t['last']['mean']:+.1f} at "
            f"{images[-1]:,} (slope {t['slope']['mean']:+.2f} ± {t['slope_se']:.2f} per doubling): {_shape(t)}, "
            + ("crossover" if t["crossover"] else "no crossover"))


def _shape(t: dict[str, Any]) -> str:
    """What the gap did, in words a skimming reader cannot read the other way: a slope in the paper's direction
    but within the seed spread is said to be so, not 'does not close'."""
    slope, se = t["slope"]["mean"], t["slope_se"]
    if t["closes"]:
        return "gap closes"
    if t["first"]["mean"] >= 0:
        return "no gap to close (the ViT not behind at the smallest set)"
    if slope == 0:
        return "gap unchanged"
    direction = "narrows" if slope > 0 else "widens"
    if math.isnan(se):
        return f"gap {direction} (one seed: spread not measured)"
    if abs(slope) <= SPREAD_FACTOR * se:
        return f"gap {direction}, within the seed spread (under {SPREAD_FACTOR:g} standard errors)"
    return f"gap {direction}"


def within_spread(a: dict[str, Any], b: dict[str, Any], factor: float = SPREAD_FACTOR) -> bool:
    """|a − b| within `factor` standard errors of the difference of the two means (`stat` dicts)."""
    return abs(a["mean"] - b["mean"]) <= factor * standard_error(a, b)


def grid_checks(ctx: Context, names: list[str] | None = None) -> list[Check]:
    """Precondition (c) for every learning-rate choice the plan made (`ctx.grids`, filled by plans.tuned_lr), or
    for the named ones."""
    chosen = {n: v for n, v in ctx.grids.items() if names is None or n in names}
    return [inside_grid(name, best, grid) for name, (best, grid) in chosen.items()]

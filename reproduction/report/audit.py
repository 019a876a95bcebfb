"""The post-hoc audit beside each pre-registered verdict. The designs (experiments.design) were
committed before their runs, so their verdicts stay as they were, labelled as the pre-registered ones; this layer,
written after the runs, says what the runs can and cannot show:

- (a′) plateau: pre-training has stopped improving, not only crossed precondition (a)'s threshold: the mean gain of
  the final validation top-1 over the last `PLATEAU_STEPS` steps is under `PLATEAU_POINTS` points. A model still
  climbing when its budget ends is compared before it has finished learning.
- paired differences under one rule (experiments.stats.RULE) where arms share seeds.
- a label: what the experiment can say at this budget ("not testable at this budget: why", "underpowered: about N
  seeds would detect ...", a tie and its width, ...).

Everything here is computed from the records the analysis read: nothing is trained for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reproduction.stats import describe, one_sample, paired, seeds_to_detect

PLATEAU_STEPS = 600
PLATEAU_POINTS = 1.0
PLATEAU_RULE = (f"(a′) plateau: the mean gain of the final validation top-1 over the last {PLATEAU_STEPS:,} "
                f"training steps (seeds averaged) under {PLATEAU_POINTS:g} point")


def last_gain(result: dict[str, Any]) -> float | None:
    """Points of validation top-1 gained over the last PLATEAU_STEPS steps of a run (its `val_curve`: the last
    point against the latest one at least PLATEAU_STEPS before it); None without such a pair."""
    curve = result.get("train", {}).get("val_curve") or []
    if len(curve) < 2:
        return None
    last_step, last = curve[-1]
    earlier = [v for step, v in curve[:-1] if step <= last_step - PLATEAU_STEPS]
    return round(100 * (last - earlier[-1]), 2) if earlier else None


def plateau(what: str, records: Sequence[Any]) -> dict[str, Any]:
    """(a′) for the runs of one arm (runner.Records, one per seed)."""
    gains = [g for g in (last_gain(r.result) for r in records) if g is not None]
    if not gains:
        return {"what": what, "gain": None, "value": "no validation curve recorded", "holds": None}
    mean = sum(gains) / len(gains)
    seeds = " / ".join(f"{g:+.1f}" for g in gains)
    return {"what": what, "gain": round(mean, 2), "holds": mean < PLATEAU_POINTS,
            "value": f"{mean:+.1f} points in the last {PLATEAU_STEPS:,} steps (seeds {seeds}; plateau: under "
                     f"{PLATEAU_POINTS:+g})"}


def climbing(plateaus: Sequence[dict[str, Any]]) -> str:
    """'still climbing +1.0 to +2.7 points in the last 600 steps' over the arms not at a plateau ('' if none)."""
    gains = sorted(p["gain"] for p in plateaus if p["holds"] is False)
    if not gains:
        return ""
    span = f"{gains[0]:+.1f}" if len(gains) == 1 else f"{gains[0]:+.1f} to {gains[-1]:+.1f}"
    return f"still climbing {span} points in the last {PLATEAU_STEPS:,} steps"


def paired_line(what: str, a: Sequence[float], b: Sequence[float], unit: str = "points") -> tuple[dict, str]:
    """The paired difference a − b (per seed) and its sentence under the rule."""
    p = paired(a, b)
    return p, describe(what, p, unit)


def needed_seeds(values: Sequence[float]) -> tuple[dict[str, Any], int | None]:
    """The one-sample statistics of per-seed values and the seeds their mean would need (stats.SEEDS_RULE)."""
    s = one_sample(values)
    return s, seeds_to_detect(s["mean"], s["sd"])


def audit(label: str, plateaus: Sequence[dict[str, Any]], paired_lines: Sequence[str] = (),
          notes: Sequence[str] = (), measured: str = "") -> dict[str, Any]:
    """The audit entry of a results.json: the label (shown in the summary), the plateau checks, the paired
    differences, any other sentence, and `measured`: the key numbers in a line, for the summary."""
    return {"label": label, "measured": measured, "plateau": list(plateaus), "paired": list(paired_lines),
            "notes": list(notes)}

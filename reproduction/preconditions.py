"""The four preconditions of a fair test, measured the same way by every experiment.

(a) pre-training learns its task: the final upstream validation top-1 at the largest set reaches `LEARNS_TOP1`
    (the source has 64 classes: chance is 1.6 %).
(b) pre-training helps: at the largest set the transfer metric beats the same model without pre-training (its
    initial weights for few-shot, trained on the target alone for fine-tuning) by at least `HELPS_POINTS`.
(c) no chosen learning rate sits at the edge of its grid: `plans.tuned_lr` extends a grid whose best value is at
    an edge by one step of the grid's ratio, at most `plans.GRID_EXTENSIONS` times (the rule written before any
    run); a choice still at the edge after that fails (c).
(d) the effect is larger than the seed spread: the difference of two means exceeds `SPREAD_FACTOR` standard
    errors of that difference (the rule the designs registered; with three seeds, two standard errors is a
    two-sided p of about 0.18, not 0.05: the post-hoc audit judges paired differences by experiments.stats.RULE,
    a t-interval with n − 1 degrees of freedom).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reproduction.design import Check

LEARNS_TOP1 = 50.0  # % upstream validation top-1 (the pilot's threshold)
HELPS_POINTS = 2.0  # points of transfer over no pre-training
SPREAD_FACTOR = 2.0


def learns(what: str, top1: float, threshold: float = LEARNS_TOP1) -> Check:
    return Check("a", what, f"{top1:.1f} % upstream top-1 (threshold {threshold:g} %)", top1 >= threshold)


def helps(what: str, pretrained: float, reference: float, points: float = HELPS_POINTS) -> Check:
    margin = pretrained - reference
    return Check("b", what, f"{pretrained:.1f} vs {reference:.1f} % without pre-training ({margin:+.1f}; "
                 f"needs {points:+g})", margin >= points)


def inside_grid(what: str, chosen: float, grid: Sequence[float]) -> Check:
    grid = sorted(grid)
    edge = len(grid) > 1 and chosen in (grid[0], grid[-1])
    shown = ", ".join(f"{v:g}" for v in grid)
    return Check("c", what, f"lr {chosen:g} of {shown}" + (" (at the edge)" if edge else ""), not edge)


def standard_error(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Standard error of the difference of two means (`measures.stat` dicts)."""
    return math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])


def beyond_spread(what: str, a: dict[str, Any], b: dict[str, Any], factor: float = SPREAD_FACTOR) -> Check:
    """(d) for the effect a - b (both `measures.stat` dicts over seeds)."""
    effect, se = a["mean"] - b["mean"], standard_error(a, b)
    if a["n"] < 2 or b["n"] < 2:
        return Check("d", what, f"{effect:+.1f} points, one seed: spread not measured", None)
    return Check("d", what, f"{effect:+.1f} points, standard error {se:.1f} (needs {factor:g}×)",
                 abs(effect) > factor * se)

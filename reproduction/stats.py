"""Paired statistics over seeds: where two arms of an experiment share a seed (the same seed, so the same
initial draw and the same data order), their difference is taken per seed and judged by one rule, stated once in
the report (`RULE`):

    a difference holds when its paired 95 % t-interval excludes 0: |mean d| > t(0.975, n − 1) · sd(d) / √n,
    d the per-seed differences, n the seeds.

With three seeds t(0.975, 2) = 4.30: the earlier "beyond 2 standard errors" was a one-sided p of about 0.09 (a
two-sided 0.18), not 0.05. `seeds_to_detect` says how many seeds the measured effect would need under the same rule.

The quantile is computed here from the closed form of Student's t distribution for integer degrees of freedom
(Abramowitz & Stegun 26.7.3-4) and bisection; tests compare it with scipy.stats.t.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

LEVEL = 0.95
RULE = ("where two arms share seeds (the same initial draw and data order), a difference holds when its paired "
        "95 % t-interval excludes 0: |mean d| > t(0.975, n − 1) · sd(d) / √n, d the per-seed differences over n "
        "seeds (t = 4.30 for three)")
SEEDS_RULE = ("the seeds an effect needs: the smallest n at which its measured per-seed mean d̄ and sd s pass that "
              "rule (about (t · s / d̄)²; an effect of exactly that size is then found half the time)")


def t_two_sided(t: float, dof: int) -> float:
    """P(|T| <= t) for Student's t with integer `dof` >= 1 (A&S 26.7.3 for odd, 26.7.4 for even dof)."""
    if dof < 1 or int(dof) != dof:
        raise ValueError(f"degrees of freedom must be a positive integer, got {dof!r}")
    t = abs(t)
    theta = math.atan(t / math.sqrt(dof))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if dof % 2 == 0:  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ...), dof/2 terms
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if dof == 1:
        return 2 * theta / math.pi
    term, total = math.cos(theta), math.cos(theta)  # cos θ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + ...)
    for k in range(1, (dof - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + s * total)


def t_quantile(dof: int, level: float = LEVEL) -> float:
    """The t with P(|T| <= t) = `level` (the two-sided critical value: 4.303 for dof 2 at 95 %), by bisection."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    low, high = 0.0, 1.0
    while t_two_sided(high, dof) < level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided(mid, dof) < level else (low, mid)
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The paired difference a − b over seeds (a[i] and b[i] of the same seed)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one value per seed on both sides, got {len(a)} and {len(b)}")
    return one_sample([x - y for x, y in zip(a, b, strict=True)])


def one_sample(d: Sequence[float]) -> dict[str, Any]:
    """Mean, standard deviation, standard error and 95 % t-interval of per-seed values `d`; `holds`: the interval
    excludes 0 (None with one seed: no spread to judge by)."""
    n = len(d)
    if n == 0:
        raise ValueError("no values")
    mean = sum(d) / n
    if n < 2:
        return {"n": 1, "mean": mean, "sd": math.nan, "se": math.nan, "t": math.nan, "low": math.nan,
                "high": math.nan, "holds": None}
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    t = t_quantile(n - 1)
    return {"n": n, "mean": mean, "sd": sd, "se": se, "t": t, "low": mean - t * se, "high": mean + t * se,
            "holds": abs(mean) > t * se}


def seeds_to_detect(mean: float, sd: float, limit: int = 1000) -> int | None:
    """The smallest n >= 2 at which a paired effect of this mean and per-seed sd has a 95 % t-interval excluding 0
    (SEEDS_RULE); None for no effect or more than `limit` seeds."""
    if mean == 0 or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    def passes(n: int) -> bool:
        return abs(mean) > t_quantile(n - 1) * sd / math.sqrt(n)

    if not passes(limit):
        return None
    low, high = 1, limit  # t(n − 1) · sd / √n falls with n: the first n that passes, by bisection
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if passes(mid) else (mid, high)
    return high


def describe(what: str, p: dict[str, Any], unit: str = "points") -> str:
    """'MPP − scratch +3.1 points (3 seeds paired: SE 0.61, 95 % interval +0.5 to +5.7): holds'."""
    if p["holds"] is None:
        return f"{what} {p['mean']:+.1f} {unit} (one seed: no interval)"
    verdict = "holds" if p["holds"] else "not resolved (0 inside)"
    return (f"{what} {p['mean']:+.1f} {unit} ({p['n']} seeds paired: SE {p['se']:.2f}, 95 % interval "
            f"{p['low']:+.1f} to {p['high']:+.1f}): {verdict}")

"""An experiment's design as data, fixed (and committed) before its full run: the question, the primary metric,
the decision rule and the preconditions with their thresholds; and the verdict those rules give.

A verdict is `holds`, `does not hold`, or `inconclusive: precondition (x) failed (value)`: a finding is never
said not to hold when the test of it was not fair. A finding that holds for a reason other than the paper's (GAP
that never learnt, attention no more local than uniform) says so in `trivial`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PRECONDITIONS = {
    "a": "pre-training learns its task",
    "b": "pre-training helps transfer",
    "c": "no chosen learning rate at the edge of its grid",
    "d": "the effect is larger than the seed spread",
}


@dataclass(frozen=True)
class Design:
    version: int  # a stored result of another version is not reported as this design's
    question: str
    primary: str  # the primary metric
    rule: str  # how the primary metric decides the verdict
    preconditions: dict[str, str]  # key (a-d) -> the check and its threshold, in words
    changes: tuple[str, ...] = ()  # made after the design commit, each by a rule stated in advance

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Check:
    """One precondition as measured."""

    key: str  # a, b, c, d
    what: str  # which runs, e.g. "BiT at 65,536 images"
    value: str  # the measured value, e.g. "58.9 % (threshold 50 %)"
    holds: bool | None  # None: could not be measured (said so in value)
    # "": a condition of the verdict it is listed with; else the verdicts it is a condition of instead, the check
    # listed beside this one for the reader (data-scaling's (b) beside its upstream verdict)
    decides: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "name": PRECONDITIONS[self.key], "what": self.what, "value": self.value,
                "holds": self.holds, "decides": self.decides}


@dataclass
class Verdict:
    finding_holds: bool
    result: str  # what was measured, with its key number: the summary row's text
    checks: list[Check] = field(default_factory=list)
    trivial: str = ""  # why a finding that holds says little, if it does

    @property
    def state(self) -> str:
        failed = [c for c in self.checks if c.holds is False and not c.decides]
        if failed:
            first = failed[0]
            return f"inconclusive: precondition ({first.key}) failed ({first.what}: {first.value})"
        if self.finding_holds:
            return "holds trivially" if self.trivial else "holds"
        return "does not hold"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "finding_holds": self.finding_holds, "result": self.result,
                "preconditions": [c.to_dict() for c in self.checks], "trivial": self.trivial}


def describe(design: Design) -> str:
    """The design paragraph of REPRODUCTION.md."""
    checks = "; ".join(f"({k}) {PRECONDITIONS[k]}: {v}" for k, v in design.preconditions.items())
    changes = " ".join(design.changes).rstrip(".") if design.changes else "none"  # each may end a sentence
    return (f"**Design (version {design.version}, fixed before the full run).** {design.question} Primary metric: "
            f"{design.primary}. Decision rule: {design.rule} Preconditions, checked before the verdict: {checks}. "
            f"Changes since the design was committed: {changes}.")

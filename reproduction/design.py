"""An experiment's design as data, fixed (and committed) before its full run: the question, the primary metric,
the decision rule and the preconditions with their thresholds; and the verdict those rules give. The rules are
code (their thresholds are the experiment's constants); the design's version and every change made to it since its
commit, with when each was made, are the experiment's design file (`revisions`).

A verdict is `holds`, `does not hold`, or `inconclusive: precondition (x) failed (value)`: a finding is never
said not to hold when the test of it was not fair. A finding that holds for a reason other than the paper's (GAP
that never learnt, attention no more local than uniform) says so in `trivial`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from reproduction.records import read_json

PRECONDITIONS = {
    "a": "pre-training learns its task",
    "b": "pre-training helps transfer",
    "c": "no chosen learning rate at the edge of its grid",
    "d": "the effect is larger than the seed spread",
}

DESIGNS = Path(__file__).parent / "experiments"  # the design files, each named as its module (pilot.design.json)
SHARED = "shared"  # shared.design.json: revisions several designs made, each design's file naming the ones it took
MAX_DESIGN_BYTES = 1 << 20  # a design file is a few KB
DESIGN_FIX = "correct it or restore it from its commit (its format: reproduction.design.revisions)"


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


@dataclass(frozen=True)
class Revisions:
    """An experiment's design file: the design's version, the changes made to it since its commit (each by a rule
    stated in advance, with when it was made and what had been read by then), and what the design answers to when
    it is no section of the paper (`paper`; '' for the others, whose module names their section)."""

    version: int
    changes: tuple[str, ...]
    paper: str = ""


def revisions(name: str) -> Revisions:
    """Experiment `name`'s design file, checked: `DESIGNS/<module>.design.json`, beside the experiment's module
    (`data-scaling`: data_scaling.design.json). It holds
    `{"experiment": name, "version": N, "paper": "..." (optional), "changes": [change, ...]}`, each change one of

    - `{"text": "..."}`: a change by a rule of the design that made no new version (a candidate source added);
    - `{"version": V, "when": "...", "text": "..."}`: the change that made version V, `when` saying when it was made
      and what had been read by then; written `version V (when): text`;
    - `{"version": V, "shared": true, "here": "..."}`: the change of version V that several designs made, as
      `shared.design.json` has it, followed by "; here: " and `here` (optional) for what it changed in this one.

    The versions of the changes rise, and the last is the design's version. A change is one sentence or more, and
    the text of each ends its last sentence (`describe` joins them)."""
    path = DESIGNS / f"{name.replace('-', '_')}.design.json"
    content = _design_file(path, {"experiment", "version", "paper", "changes"})
    if content.get("experiment") != name:
        _refuse(path, f"is the design file of {content.get('experiment')!r}, not of {name!r}")
    version, paper = _version(path, content.get("version")), content.get("paper", "")
    if not isinstance(paper, str):
        _refuse(path, "gives a paper that is not text")
    changes = _changes(path, content)
    shared = _shared() if any("shared" in c for c in changes) else {}
    texts, made = [], []
    for change in changes:
        if change.get("shared") is True and set(change) <= {"version", "shared", "here"}:
            made.append(_version(path, change.get("version")))
            here = change.get("here", "")
            if made[-1] not in shared or not isinstance(here, str):
                _refuse(path, f"has a shared change {change} that {SHARED}.design.json does not hold, or whose "
                        "`here` is not text")
            texts.append(shared[made[-1]] + (f"; here: {here}" if here else "") + ".")
        else:
            v, text = _text(path, change)
            made += [v] if v is not None else []
            texts.append(text)
    if made and (made != sorted(set(made)) or made[-1] != version):
        _refuse(path, f"has changes of versions {made}: they must rise to the design's version, {version}")
    return Revisions(version, tuple(texts), paper)


def _shared() -> dict[int, str]:
    """Each change several designs made, written out, by the version it made (shared.design.json)."""
    path = DESIGNS / f"{SHARED}.design.json"
    found = dict(_text(path, change) for change in _changes(path, _design_file(path, {"changes"})))
    if None in found:
        _refuse(path, "has a change that made no version")
    return found


def _text(path: Path, change: dict[str, Any]) -> tuple[int | None, str]:
    """(the version it made, None if none; its text written out) of a change of the form `{"text"}` or
    `{"version", "when", "text"}`."""
    words = [change[k] for k in ("when", "text") if k in change]
    if set(change) not in ({"text"}, {"version", "when", "text"}) or not all(isinstance(w, str) and w for w in words):
        _refuse(path, f"has a change {change} that is not {{'text'}}, {{'version', 'when', 'text'}} nor a shared one")
    if "version" not in change:
        return None, change["text"]
    version = _version(path, change["version"])
    return version, f"version {version} ({change['when']}): {change['text']}"


def _design_file(path: Path, keys: set[str]) -> dict[str, Any]:
    content = read_json(path, MAX_DESIGN_BYTES, DESIGN_FIX)
    if content is None:
        raise ValueError(f"{path} is missing: every experiment's design version and its changes are read from it; "
                         "restore it from its commit")
    if not isinstance(content, dict) or set(content) - keys:
        _refuse(path, f"is not an object of the fields {sorted(keys)}")
    return content


def _changes(path: Path, content: dict[str, Any]) -> list[dict[str, Any]]:
    changes = content.get("changes", [])
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        _refuse(path, "has changes that are not a list of objects")
    return changes


def _version(path: Path, value: Any) -> int:
    if type(value) is not int or value < 1:
        _refuse(path, f"gives the version {value!r}, not a whole number from 1")
    return value


def _refuse(path: Path, what: str) -> NoReturn:
    raise ValueError(f"{path} {what}; {DESIGN_FIX}")

"""One run, one number: which weights a recorded number was computed on.

A run known only from its record is trained again when its weights are wanted (runner: a fine-tuning that starts
from it, an evaluation it lacks); the record keeps its original outcome and stores the new one as `retrained`. The
evaluations computed after that were computed on the retrained weights, which differ from the original ones (a
second machine does not repeat a run bit for bit: the ViT-M's three largest-set runs scored 0.8-1.8 points lower).
So a retrained run is two runs with one spec: the original, whose outcome is the number every section reads, and the
retrain, a separate run the report names, whose numbers are marked wherever a section reads one.

Which evaluations came after the retrain is in the record: the runner adds each measurement's seconds to
`wall_seconds` in the order it measures them (JSON keeps that order), the retrain's under `retrain`; the history of
the committed records agrees for every retrained run (reproduction/records, commits bc05ea4 and 02f24b7).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

RETRAIN = "retrain"  # the key of the retrain's seconds in a record's wall_seconds
MARK = "†"
FOOTNOTE = f"{MARK}: from weights retrained on a second machine (see 'Runs trained twice')"


def is_retrained(result: dict[str, Any]) -> bool:
    return isinstance(result.get("retrained"), dict)


def evals_after_retrain(result: dict[str, Any]) -> list[str]:
    """The evaluations of a record computed on its retrained weights (none if it was never retrained)."""
    if not is_retrained(result):
        return []
    order = list(result.get("wall_seconds", {}))
    if RETRAIN not in order:  # retrained without its seconds: nothing tells the evaluations apart, so trust none
        return list(result.get("evals", {}))
    after = order[order.index(RETRAIN) + 1:]
    return [name for name in after if name in result.get("evals", {})]


def from_retrained(record: Any, evaluation: str) -> bool:
    """Whether the evaluation `evaluation` of `record` (a runner.Record) was computed on retrained weights."""
    return evaluation in evals_after_retrain(record.result)


def started_from_retrained(finetuned: Any, parent: Any) -> bool:
    """Whether a fine-tuning run started from its parent's retrained weights. A fine-tuning is what makes the
    runner retrain a recorded run, so a fine-tuning of a retrained run is taken to start from the retrain (so it
    did for every committed record: commit bc05ea4)."""
    return parent is not None and finetuned.spec.init == parent.spec.key and is_retrained(parent.result)


def mark(text: str, retrained: bool) -> str:
    return f"{text} {MARK}" if retrained else text


def retrained_runs(records: Iterable[Any]) -> list[dict[str, Any]]:
    """Each retrained run among `records` (runner.Records): its key and label, the original and the retrained final
    top-1 (%), the evaluations read from the retrained weights and the fine-tuning runs that started from them."""
    records = list(records)
    out = []
    for r in records:
        if not is_retrained(r.result):
            continue
        children = sorted(c.spec.key for c in records if c.spec.init == r.spec.key)
        out.append({"key": r.spec.key, "label": r.spec.label,
                    "top1": round(100 * r.result["train"]["val"]["top1"], 2),
                    "retrained_top1": round(100 * r.result["retrained"]["val"]["top1"], 2),
                    "evals": evals_after_retrain(r.result), "finetuned": children})
    return out

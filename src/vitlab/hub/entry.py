"""A published checkpoint's record (`Entry`) and the catalogue document it is read from (catalogue.json beside
this file): what every hub module shares, below the name lookup (catalogue.py) and the downloads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One published checkpoint: where it is, what architecture reads it, and how its publisher used it."""

    name: str  # TAG:MODEL or hf-hub:owner/name
    tag: str
    model: str  # a vitlab.list_models() name
    format: str  # jax-npz | bit-npz | hf | timm | csv
    url: str | None = None  # plain HTTPS source (None for hub repositories)
    repo: str | None = None  # Hugging Face repository id
    pretrain: str | None = None
    finetune: str | None = None
    resolution: int | None = None
    num_classes: int | None = None
    representation: bool = False  # carries the pre_logits / pooler layer
    size: int | None = None  # bytes
    size_slack: int = 0  # bytes the stated size may be off by (its rounding)
    size_source: str = "derived"
    sha256: str | None = None  # only where a checksum is published (none is, today)
    top1: float | None = None  # ImageNet top-1 (%) as its publisher reports it
    top1_reference: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    eval_resize: str = "official"
    classes: str | None = None  # "imagenet1k": class names shipped with vitlab
    licence: str | None = None
    reference: str | None = None
    notes: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def summary(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "extra" and v is not None}
        return {**data, **self.extra}


@cache
def document() -> dict[str, Any]:
    """catalogue.json, parsed once."""
    text = resources.files(__package__).joinpath("catalogue.json").read_text(encoding="utf-8")
    return json.loads(text)


def index_entry() -> Entry:
    """The AugReg index (a CSV of every AugReg run), downloaded and cached like a checkpoint (augreg.py)."""
    index = document()["index"]
    return Entry(name=index["name"], tag="index", model="", format="csv", url=index["url"],
                 reference=index["reference"], licence="Apache-2.0")

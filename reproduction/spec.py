"""A sub-run of an experiment as data: the training settings `vitlab train` / `vitlab finetune` would be given,
and the name its run directory is found under.

A spec's key is a hash of everything that decides what the run computes (recipe, verb, settings, the key of the
run it fine-tunes), so two experiments asking for the same training find the same run directory
(`<out>/_runs/<key>-<label>`) and it is trained once. Settings that only decide how a run reports or which
machine resources it uses (loader workers, log interval, device) are left out of the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# TrainConfig fields that change neither the weights nor the results a run stores.
NOT_IN_KEY = frozenset({"workers", "log_every", "eval_batch_size", "device", "compile", "out", "resume"})
KEY_LENGTH = 12
# The designs' precision: every recorded run was trained in float32, so a run computes in it on any machine
# (passed beside the settings, not in them: no key changes).
DESIGN_PRECISION = "fp32"


@dataclass(frozen=True)
class RunSpec:
    """One training run. `settings` are TrainConfig fields as JSON values (lists, not tuples), exactly what the
    resolution step of `vitlab train` receives as flags; `init` is the key of the run whose final weights a
    fine-tuning run starts from (its path is filled in when the run starts)."""

    label: str  # readable part of the run directory's name, e.g. "pre-ViT-M-fractal:64:1024-lr0.001-s0"
    recipe: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    verb: str = "train"  # train (from scratch) or finetune (from `init`)
    init: str | None = None
    curve: bool = False  # keep the weights of its checkpoints (for a transfer curve over training)

    def __post_init__(self) -> None:
        plain = json.loads(json.dumps(dict(self.settings)))  # tuples -> lists: one spelling per value
        object.__setattr__(self, "settings", plain)
        if (self.verb == "finetune") != (self.init is not None):
            raise ValueError(f"{self.label}: a finetune spec needs init (and only it has one)")

    @property
    def key(self) -> str:
        content = {"recipe": self.recipe, "verb": self.verb, "init": self.init, "curve": self.curve,
                   "settings": {k: v for k, v in self.settings.items() if k not in NOT_IN_KEY}}
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        return digest[:KEY_LENGTH]

    @property
    def dirname(self) -> str:
        return f"{self.key}-{slug(self.label)}"

    @property
    def steps(self) -> int:
        return int(self.settings.get("steps", 0))

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "recipe": self.recipe, "verb": self.verb, "init": self.init,
                "curve": self.curve, "settings": dict(self.settings)}


def slug(text: str) -> str:
    """A label as a file name: letters, digits, '.', '-' and '_' kept, anything else '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"

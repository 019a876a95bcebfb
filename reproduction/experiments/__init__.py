"""The experiments, one module each: the pilot (the pre-training source), then the paper's findings."""

from __future__ import annotations

from reproduction import NAMES, PILOT
from reproduction.experiment import Experiment
from reproduction.experiments import (
    attention_distance,
    compute,
    data_scaling,
    mpp,
    pilot,
    pos_embed,
    token_vs_gap,
)

_MODULES = (pilot, data_scaling, compute, pos_embed, token_vs_gap, attention_distance, mpp)


def experiments() -> dict[str, Experiment]:
    """Every experiment by name, the pilot first, then in the order the paper's findings are listed."""
    found = [Experiment.from_module(m) for m in _MODULES]
    return {e.name: e for e in found}


__all__ = ["NAMES", "PILOT", "experiments"]

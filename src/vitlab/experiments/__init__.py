"""The paper's findings reproduced at small scale, one command per experiment (`vitlab experiment NAME`).

Each experiment module holds its paper reference, the finding, a plan (the runs it needs) and an analysis (tables,
figures, the measured comparison); `runner` trains and evaluates the runs, shared between experiments through a
run cache keyed by what each run computes; `report` writes REPRODUCTION.md from the results.
"""

from __future__ import annotations

from vitlab.experiments import attention_distance, compute, data_scaling, mpp, pilot, pos_embed, token_vs_gap
from vitlab.experiments.experiment import Experiment, read_results, run_experiment

_MODULES = (pilot, data_scaling, compute, pos_embed, token_vs_gap, attention_distance, mpp)


def experiments() -> dict[str, Experiment]:
    """Every experiment by name, the pilot first, then in the issue's order."""
    found = [Experiment.from_module(m) for m in _MODULES]
    return {e.name: e for e in found}


NAMES = ("data-scaling", "compute", "pos-embed", "token-vs-gap", "attention-distance", "mpp")  # `all` runs these
PILOT = "pilot"  # run before them: it chooses their pre-training source

__all__ = ["NAMES", "PILOT", "Experiment", "experiments", "read_results", "run_experiment"]

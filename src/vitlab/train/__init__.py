"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

import sys
import types
from typing import Any

from vitlab.train.recipes import RECIPES

# Names read on first use, each from its module: `vitlab --help` lists the recipes and never trains, so its start-up
# does not pay for what the rest imports (torch, torch.distributed.checkpoint, torchvision's transforms).
_LAZY = {
    "TrainConfig": "settings", "config_from_json": "config", "Resolved": "resolve", "resolve": "resolve",
    "resolve_config": "resolve", "RunResult": "trainer", "TrainingDiverged": "trainer", "run": "trainer",
    "build_run_model": "trainer", "objective_for": "trainer", "FitResult": "fit", "fit": "fit",
    "read_metrics": "metrics", "received_stops": "distributed", "build_optimizer": "optim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"vitlab.train.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """`vitlab.train.resolve` and `vitlab.train.fit` are the functions, as their modules' names are: importing the
    module of that name (which sets it as the package's attribute) must not replace the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == name:
            return  # the module stays in sys.modules under its dotted name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "RECIPES", "FitResult", "Resolved", "RunResult", "TrainConfig", "TrainingDiverged", "build_optimizer",
    "build_run_model", "config_from_json", "fit", "objective_for", "read_metrics", "received_stops", "resolve",
    "resolve_config", "run",
]

"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

from typing import Any

from vitlab.train.config import TrainConfig, config_from_json
from vitlab.train.recipes import RECIPES
from vitlab.train.resolve import Resolved, resolve, resolve_config

# Names read on first use, each from its module: `vitlab --help` reads the recipes and never trains, so its start-up
# does not pay for what the trainer imports (torch.distributed.checkpoint, torchvision's transforms).
_LAZY = {
    "RunResult": "trainer", "TrainingDiverged": "trainer", "run": "trainer", "build_run_model": "trainer",
    "objective_for": "trainer", "FitResult": "fit", "fit": "fit", "read_metrics": "runlog",
    "received_stops": "distributed", "build_optimizer": "optim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"vitlab.train.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RECIPES", "FitResult", "Resolved", "RunResult", "TrainConfig", "TrainingDiverged", "build_optimizer",
    "build_run_model", "config_from_json", "fit", "objective_for", "read_metrics", "received_stops", "resolve",
    "resolve_config", "run",
]

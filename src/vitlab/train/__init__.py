"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

from typing import Any

from .config import TrainConfig, config_from_json
from .recipes import RECIPES
from .resolve import Resolved, resolve, resolve_config

_LOOP_NAMES = ("RunResult", "TrainingDiverged", "run")


def __getattr__(name: str) -> Any:
    """The trainer (loop.py) on first use: `vitlab --help` reads the recipes and never trains, so its start-up
    does not pay for what the loop imports (torch.distributed.checkpoint, torchvision's transforms)."""
    if name in _LOOP_NAMES:
        from . import loop

        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RECIPES", "Resolved", "RunResult", "TrainConfig", "TrainingDiverged", "config_from_json", "resolve",
    "resolve_config", "run",
]

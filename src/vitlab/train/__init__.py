"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

from typing import Any

from vitlab.train.config import TrainConfig, config_from_json
from vitlab.train.recipes import RECIPES
from vitlab.train.resolve import Resolved, resolve, resolve_config

_LOOP_NAMES = ("RunResult", "TrainingDiverged", "run")
_FIT_NAMES = ("FitResult", "fit")  # training from Python (fit.py), over the loop


def __getattr__(name: str) -> Any:
    """The trainer (loop.py) on first use: `vitlab --help` reads the recipes and never trains, so its start-up
    does not pay for what the loop imports (torch.distributed.checkpoint, torchvision's transforms)."""
    if name in _LOOP_NAMES:
        import vitlab.train.trainer as loop

        return getattr(loop, name)
    if name in _FIT_NAMES:
        from vitlab.train import fit as fit_module

        return getattr(fit_module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RECIPES", "FitResult", "Resolved", "RunResult", "TrainConfig", "TrainingDiverged", "config_from_json", "fit",
    "resolve", "resolve_config", "run",
]

"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

from .config import RECIPES, TrainConfig, config_from_json
from .loop import RunResult, TrainingDiverged, run
from .resolve import Resolved, resolve, resolve_config

__all__ = [
    "RECIPES", "Resolved", "RunResult", "TrainConfig", "TrainingDiverged", "config_from_json", "resolve",
    "resolve_config", "run",
]

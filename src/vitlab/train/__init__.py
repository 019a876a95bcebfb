"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

from .config import RECIPES, TrainConfig, config_from_json, resolve_config
from .evaluate import EvalResult, evaluate_weights, predict
from .loop import RunResult, TrainingDiverged, run

__all__ = [
    "RECIPES", "EvalResult", "RunResult", "TrainConfig", "TrainingDiverged", "config_from_json",
    "evaluate_weights", "predict", "resolve_config", "run",
]

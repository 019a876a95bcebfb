"""Training and fine-tuning: `run(config) -> RunResult`, recipes as data, checkpoints that resume exactly."""

from vitlab.lazy import lazy_names
from vitlab.train.recipes import RECIPES

# Names read on first use, each from its module: `vitlab --help` lists the recipes and never trains, so its start-up
# does not pay for what the rest imports (torch, torch.distributed.checkpoint, torchvision's transforms).
_LAZY = {
    "TrainConfig": "settings", "config_from_json": "config", "Resolved": "resolution", "resolve": "resolution",
    "resolve_config": "resolution", "RunResult": "trainer", "TrainingDiverged": "trainer", "run": "trainer",
    "StepParts": "trainer", "step_parts": "trainer", "FitResult": "fitting", "fit": "fitting",
    "read_metrics": "metrics", "received_stops": "distributed",
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


# The second tier (docs/api.md): resolve settings, run them, read what a run wrote; what a supervisor of runs asks
# (the stop signals a run caught, the step a run will take). The modules' other names are internal.
__all__ = [
    "RECIPES", "FitResult", "Resolved", "RunResult", "StepParts", "TrainConfig", "TrainingDiverged",
    "config_from_json", "fit", "read_metrics", "received_stops", "resolve", "resolve_config", "run", "step_parts",
]

"""Evaluation of trained weights: classification metrics (`vitlab eval`), prediction (`vitlab predict`) and the
paper's few-shot linear evaluation (`vitlab fewshot`). Reads models, never the trainer."""

from typing import Any

# Names read on first use, each from its module: a training run validates with classify and needs neither
# prediction nor, unless it probes few-shot accuracy, the few-shot solver.
_LAZY = {
    "EvalResult": "classify", "evaluate_weights": "classify", "fewshot_from_weights": "fewshot_data",
    "fewshot_weights": "fewshot_data", "features_of": "fewshot_data", "FewshotResult": "fewshot_lsr",
    "fewshot": "fewshot_lsr",
    "fewshot_from_features": "fewshot_lsr", "fewshot_on_features": "fewshot_lsr", "representations": "fewshot_lsr",
    "predict": "prediction",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"vitlab.eval.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EvalResult", "FewshotResult", "evaluate_weights", "features_of", "fewshot", "fewshot_from_features",
           "fewshot_from_weights", "fewshot_on_features", "fewshot_weights", "predict", "representations"]

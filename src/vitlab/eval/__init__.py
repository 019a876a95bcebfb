"""Evaluation of trained weights: classification metrics (`vitlab eval`), prediction (`vitlab predict`) and the
paper's few-shot linear evaluation (`vitlab fewshot`). Reads models, never the trainer."""

from vitlab.lazy import lazy_names

# Names read on first use, each from its module: a training run validates with classify and needs neither
# prediction nor, unless it probes few-shot accuracy, the few-shot solver.
_LAZY = {
    "EvalResult": "classify", "evaluate_weights": "classify", "fewshot_from_weights": "fewshot_data",
    "fewshot_weights": "fewshot_data", "features_of": "fewshot_data", "FewshotResult": "fewshot_lsr",
    "fewshot": "fewshot_lsr",
    "fewshot_from_features": "fewshot_lsr", "fewshot_on_features": "fewshot_lsr", "representations": "fewshot_lsr",
    "predict": "prediction",
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = ["EvalResult", "FewshotResult", "evaluate_weights", "features_of", "fewshot", "fewshot_from_features",
           "fewshot_from_weights", "fewshot_on_features", "fewshot_weights", "predict", "representations"]

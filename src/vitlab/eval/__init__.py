"""Evaluation of trained weights: classification metrics (`vitlab eval`), prediction (`vitlab predict`) and the
paper's few-shot linear evaluation (`vitlab fewshot`). Reads models, never the trainer."""

from vitlab.eval.classify import EvalResult, evaluate_weights
from vitlab.eval.fewshot_data import fewshot_from_weights, fewshot_weights
from vitlab.eval.fewshot_lsr import FewshotResult, fewshot, fewshot_from_features, fewshot_on_features, representations
from vitlab.eval.prediction import predict

__all__ = ["EvalResult", "FewshotResult", "evaluate_weights", "fewshot", "fewshot_from_features",
           "fewshot_from_weights", "fewshot_on_features", "fewshot_weights", "predict", "representations"]

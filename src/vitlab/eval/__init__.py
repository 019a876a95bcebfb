"""Evaluation: classification metrics and the paper's few-shot linear evaluation."""

from .fewshot_lsr import FewshotResult, fewshot, fewshot_from_features, fewshot_on_features

__all__ = ["FewshotResult", "fewshot", "fewshot_from_features", "fewshot_on_features"]

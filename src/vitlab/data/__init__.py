"""Datasets (image folders, WebDataset tar shards, embedded digits/MNIST, rendered FractalDB), the official
pre-processing (inception crop as TF draws it, the named evaluation resizes, big_vision's few-shot resize) and
deterministic loaders."""

from .datasets import Datasets, build_datasets, load_split
from .embedded import EMBEDDED, is_embedded
from .errors import DataError
from .fractal import fractal_splits
from .loader import ShardSampler, StepSampler, TransformedSplit, make_loader
from .shards import ShardSplit
from .sources import ImageSplit
from .transforms import EVAL_RESIZES, FEWSHOT_RESIZE, TRAIN_CROPS, EvalTransform, TrainTransform, normalize

__all__ = [
    "EMBEDDED", "EVAL_RESIZES", "FEWSHOT_RESIZE", "TRAIN_CROPS", "DataError", "Datasets", "EvalTransform",
    "ImageSplit", "ShardSampler", "ShardSplit", "StepSampler", "TrainTransform", "TransformedSplit", "build_datasets",
    "fractal_splits", "is_embedded", "load_split", "make_loader", "normalize",
]

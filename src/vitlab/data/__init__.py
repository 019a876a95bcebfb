"""Datasets (image folders, embedded digits/MNIST), the official pre-processing and deterministic loaders."""

from .datasets import Datasets, build_datasets, load_split
from .embedded import EMBEDDED
from .errors import DataError
from .loader import ShardSampler, StepSampler, TransformedSplit, make_loader
from .sources import ImageSplit
from .transforms import EvalTransform, TrainTransform, normalize

__all__ = [
    "EMBEDDED", "DataError", "Datasets", "EvalTransform", "ImageSplit", "ShardSampler", "StepSampler",
    "TrainTransform", "TransformedSplit", "build_datasets", "load_split", "make_loader", "normalize",
]

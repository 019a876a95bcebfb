"""Datasets (image folders, WebDataset tar shards, embedded digits/MNIST, rendered FractalDB), the official
pre-processing (inception crop as TF draws it, the named evaluation resizes, big_vision's few-shot resize) and
deterministic loaders."""

from vitlab.data.datasets import Datasets, DrawnSource, build_datasets, describe_drawn, evaluation_splits, load_split
from vitlab.data.embedded import EMBEDDED, is_embedded
from vitlab.data.loader import ShardSampler, StepSampler, TransformedSplit, make_loader
from vitlab.data.sources import ImageSplit, decode_rgb
from vitlab.data.transforms import (
    EVAL_RESIZES,
    FEWSHOT_RESIZE,
    TRAIN_CROPS,
    EvalTransform,
    TrainTransform,
    normalize,
    tf_inception_box,
)
from vitlab.errors import DataError
from vitlab.lazy import lazy_names

# Names read on first use: a run on an embedded set or a folder imports neither the fractal renderer nor the
# shard reader.
_LAZY = {"fractal_splits": "fractal", "fingerprint": "shardindex", "ShardSplit": "shards"}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "EMBEDDED", "EVAL_RESIZES", "FEWSHOT_RESIZE", "TRAIN_CROPS", "DataError", "Datasets", "DrawnSource",
    "EvalTransform", "ImageSplit", "ShardSampler", "ShardSplit", "StepSampler", "TrainTransform", "TransformedSplit",
    "build_datasets", "decode_rgb", "describe_drawn", "evaluation_splits", "fingerprint", "fractal_splits",
    "is_embedded", "load_split", "make_loader", "normalize", "tf_inception_box",
]

"""The allowed values of every number a user gives vitlab, declared once.

A `Range` is read three ways: the command line's argparse types parse a flag with it (`vitlab.cli.types`), the
training configuration checks every setting with it however the setting arrived (flag, `--config` file,
`vitlab.fit` keyword, recorded run: `vitlab.train.config.validate`), and both say the same words when a value is
outside it. The training settings name theirs in their declarations (vitlab.train.settings); the named ranges
here serve them and the other verbs' flags. A bottom module: no vitlab import, no torch.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

# Upper bounds on counts, so that a slip of the keyboard is refused before vitlab starts 1,000 processes,
# allocates for 10^8 images or draws 10^9 augmentations per image.
MAX_COUNT = 10**9  # steps, intervals, images: beyond any run on one machine
MAX_BATCH = 65536  # images per batch (the paper's largest is 4096; SigLIP's 32k)
MAX_WORKERS = 256  # data-loading processes or jobs: more than the cores of any one machine
MAX_SEED = 2**32 - 1  # numpy's seed range
MAX_RANDAUG_OPS = 16  # operations per image (AugReg and DeiT use 2; RandAugment has 14 to pick from)
MAX_IMAGE_SIZE = 4096  # the side an image is resized to for a run: a 4096-px ViT/16 already has 65,536 tokens
# Pixels an image file may declare to be decoded (width x height, read from its header); $VITLAB_MAX_IMAGE_PIXELS
# overrides it. vitlab.data.sources.pixel_budget says why this many.
MAX_IMAGE_PIXELS = 8192 * 8192

# Upper bounds on an architecture's sizes (vitlab.models.limits checks configs by them), well above every
# published model (ViT-22B: width 6144, MLP 24576, 48 heads, depth 48; BiT-R152x4; the paper's largest input
# 518 px) and below sizes no machine can hold.
MAX_IMAGE_SIDE = 16384  # pixels per side of a model's native input size
MAX_TOKENS = 262_144  # patches of the native grid: a 8192-px ViT/16 (the position embedding is tokens × width)
MAX_WIDTH = 16384
MAX_MLP_DIM = 65536
MAX_HEADS = 1024
MAX_DEPTH = 1024  # blocks: ViT blocks, ResNet units and stages together (weights.validate checks files by it)
MAX_PATCH = 1024
MAX_CHANNELS = 64  # input channels
MAX_CLASSES = 1_000_000  # ImageNet-21k has 21,843 classes, JFT-300M 18,291
MAX_WIDTH_FACTOR = 64  # BiT's root width 64·wf (published: up to x4)


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number that is not a bool (True is an int to Python, never a setting's value)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Range:
    """An integer or a finite number between `low` and `high` (None: unbounded), each end included unless said
    open; `note` says what a special value means ("0: off")."""

    kind: type  # int or float
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def holds(self, value: Any) -> bool:
        """Whether `value` is of the kind and inside the range (an int passes for a float range, 2.0 not for an
        int one)."""
        if not is_number(value) or (self.kind is int and not is_int(value)):
            return False
        if not math.isfinite(value):
            return False
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        above = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return not (below or above)

    def allowed(self, note: bool = True) -> str:
        """The range in words, as every message about it says it: "an integer in [1, 65536]" (with its note
        unless `note` is False: a flag's help says what its special values mean)."""
        if self.kind is int:
            text = (f"an integer >= {self.low}" if self.high is None
                    else f"an integer in [{self.low}, {self.high}]")
        else:
            lo = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
            hi = "" if self.high is None else f"{'<' if self.high_open else '<='} {self.high:g}"
            text = "a number (" + ", ".join(["finite", " and ".join(s for s in (lo, hi) if s)]).rstrip(", ") + ")"
        return f"{text} ({self.note})" if self.note and note else text

    def check(self, name: str, value: Any) -> Any:
        """`value` when it holds; else the one line a Python caller gets, naming the argument `name`: TypeError for
        a value of another kind (a str, a bool, 2.5 for an integer), ValueError for one outside the range."""
        if not self.holds(value):
            kind = is_number(value) and (self.kind is float or is_int(value))
            raise (ValueError if kind else TypeError)(f"{name} must be {self.allowed()}, got {value!r}")
        return value

    def parse(self, text: str) -> int | float:
        """The value a flag's text gives; ValueError naming the range otherwise. int() refuses "nan", "inf",
        "1e30" and "2.5"; float() accepts them and the range then refuses the non-finite ones."""
        try:
            value = int(text) if self.kind is int else float(text)
        except ValueError:
            value = None
        if value is None or not self.holds(value):
            raise ValueError(f"must be {self.allowed(note=False)}, got {text!r}")
        return value


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """`value` when it is one of `choices`; else the one line a Python caller gets, naming the argument `name`
    (TypeError for a value that is not a str)."""
    if not isinstance(value, str) or value not in choices:
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def int_range(low: int, high: int | None = None, note: str = "") -> Range:
    return Range(int, low, high, note=note)


def float_range(low: float | None = None, high: float | None = None, low_open: bool = False,
                high_open: bool = False, note: str = "") -> Range:
    return Range(float, low, high, low_open, high_open, note)


POSITIVE_INT = int_range(1, MAX_COUNT)
NON_NEGATIVE_INT = int_range(0, MAX_COUNT)
BATCH_SIZE = int_range(1, MAX_BATCH)
WORKERS = int_range(0, MAX_WORKERS)
JOBS = int_range(1, MAX_WORKERS)
SEED = int_range(0, MAX_SEED)
IMAGE_SIZE = int_range(1, MAX_IMAGE_SIZE)
CLASS_COUNT = int_range(1, MAX_CLASSES)
RANDAUG_OPS = int_range(0, MAX_RANDAUG_OPS)
REPRESENTATION_SIZE = int_range(0, MAX_WIDTH)
# The architecture flags (--depth, --width, --heads, --mlp-dim) and model_args: a flag fails as the config would.
MODEL_SIZES = {"depth": int_range(1, MAX_DEPTH), "width": int_range(1, MAX_WIDTH), "num_heads": int_range(1, MAX_HEADS),
               "mlp_dim": int_range(1, MAX_MLP_DIM)}
LEARNING_RATE = float_range(0.0, 100.0)  # also weight decay and the linear decay's end value
MIX_ALPHA = float_range(0.0, 100.0)  # Beta(α, α) of MixUp / CutMix: above ~10 λ is 0.5 every time
PROBABILITY = float_range(0.0, 1.0)
FRACTION = float_range(0.0, 1.0, low_open=True, high_open=True)  # a held-out share: some, but not all
BELOW_ONE = float_range(0.0, 1.0, high_open=True)  # a rate in [0, 1): dropout, momentum, smoothing
EPOCHS = float_range(0.0, 1e6, low_open=True)
EXPORT_BATCH = int_range(1, 1024)  # the batch an ONNX export traces; its check also runs batch + 1
# The opsets an ONNX export of every vitlab model writes and ONNX Runtime checks (`vitlab.deploy`): attention
# (scaled_dot_product_attention) needs 14; 20 is the highest torch's TorchScript exporter supports (above it, it
# warns and writes opset-20 operators under a higher version). The measurement: BENCHMARKS.md "int8, ONNX and
# compile".
ONNX_OPSET = int_range(14, 20)

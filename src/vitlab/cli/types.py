"""argparse `type=` helpers that check a flag's range while parsing, so a nonsense number (`--batch-size -1`,
`--l2 nan`, `--device bogus`) is refused before anything is loaded, as one line naming the allowed range and
exit code 2. `OneLineParser` makes every argparse error one line (no usage block).

    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--workers", type=non_negative_int)
    p.add_argument("--image-size", type=int_range(1, MAX_IMAGE_SIZE))
    p.add_argument("--l2", type=positive_float)
    p.add_argument("--discard-ratio", type=float_range(0.0, 1.0, high_open=True))
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from vitlab.models.limits import MAX_CLASSES, MAX_DEPTH, MAX_HEADS, MAX_MLP_DIM, MAX_WIDTH

# Upper bounds where a typo would make vitlab allocate for it: a 4096-px ViT/16 already has 65,536 tokens.
MAX_IMAGE_SIZE = 4096


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line, `vitlab <verb>: error: <message>`, exit code 2 (argparse's own code)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] (high None: no upper bound). int() refuses "nan", "inf", "1e30" and "2.5"."""
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {allowed}, got {text!r}")
        return value

    return parse


def float_range(
    low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """A finite number between low and high (None: unbounded), each end closed unless said open."""
    lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
    allowed = "finite, " + " and ".join(s for s in (lo, hi) if s) if lo or hi else "finite"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            raise argparse.ArgumentTypeError(f"must be a number ({allowed}), got {text!r}")
        return value

    return parse


# Every count has an upper bound, so that a slip of the keyboard is refused while parsing instead of starting
# 1,000 processes, allocating for 10^8 images or drawing 10^9 augmentations per image.
MAX_COUNT = 10**9  # steps, intervals, images: beyond any run on one machine
MAX_BATCH = 65536  # images per batch (the paper's largest is 4096; SigLIP's 32k)
MAX_WORKERS = 256  # data-loading processes or jobs: more than the cores of any one machine
MAX_SEED = 2**32 - 1  # numpy's seed range
MAX_RANDAUG_OPS = 16  # operations per image (AugReg and DeiT use 2; RandAugment has 14 to pick from)

positive_int = int_range(1, MAX_COUNT)
non_negative_int = int_range(0, MAX_COUNT)
image_size = int_range(1, MAX_IMAGE_SIZE)
class_count = int_range(1, MAX_CLASSES)
batch_size = int_range(1, MAX_BATCH)
workers = int_range(0, MAX_WORKERS)
jobs = int_range(1, MAX_WORKERS)
seed = int_range(0, MAX_SEED)
randaug_ops = int_range(0, MAX_RANDAUG_OPS)
# --depth/--width/--heads/--mlp-dim: the architecture's bounds (models.limits), so a flag fails as the config would
MODEL_SIZES = {"depth": int_range(1, MAX_DEPTH), "width": int_range(1, MAX_WIDTH), "heads": int_range(1, MAX_HEADS),
               "mlp-dim": int_range(1, MAX_MLP_DIM)}
representation_size = int_range(0, MAX_WIDTH)
finite_float = float_range()
learning_rate = float_range(0.0, 100.0)  # also weight decay and the linear decay's end value
mix_alpha = float_range(0.0, 100.0)  # Beta(α, α) of MixUp / CutMix: above ~10 λ is 0.5 every time
positive_float = float_range(0.0, low_open=True)
non_negative_float = float_range(0.0)
probability = float_range(0.0, 1.0)
fraction = float_range(0.0, 1.0, low_open=True, high_open=True)  # a held-out share: some, but not all


_DEVICE = re.compile(r"(auto|cpu|cuda(:\d+)?)")


def device_name(text: str) -> str:
    """auto, cpu, cuda or cuda:N; whether that device exists is checked when it is picked."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def precision_name(int8: bool) -> Callable[[str], str]:
    """--precision: auto, fp32, bf16, and int8 where the verb only infers (eval, predict, bench)."""

    def parse(text: str) -> str:
        from vitlab.runtime.precision import check_precision

        try:
            check_precision(text, "infer" if int8 else "train")
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("--precision ")) from None
        return text

    return parse


PRECISION_HELP = ("auto (default: bf16 on CUDA and on CPUs with AMX/AVX512-BF16 for models of width >= 384, "
                  "else float32; see README 'Precision'), fp32 or bf16")


def new_or_folder(text: str) -> str:
    """An output folder: absent (it is created) or an existing folder, never an existing file."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is an existing file, not a folder; choose another path")
    return text


def new_file(text: str) -> str:
    """An output file: absent (its folder must exist) or an existing file it replaces, never a folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file path")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {path.parent} does not exist; create it first")
    return text


__all__ = [
    "MAX_CLASSES", "MAX_IMAGE_SIZE", "MODEL_SIZES", "OneLineParser", "batch_size", "class_count", "device_name",
    "finite_float", "float_range", "fraction", "image_size", "int_range", "jobs", "learning_rate", "mix_alpha",
    "new_file", "new_or_folder", "non_negative_float", "non_negative_int", "positive_float", "positive_int",
    "precision_name", "probability", "randaug_ops", "representation_size", "seed", "workers",
]


# What --data accepts, for every verb that reads data (vitlab.data.build_datasets and load_split dispatch on it).
DATA_SOURCES = ("embedded digits or mnist (NAME:K: K training images per class), "
                "fractal:C:N[:SEED] (FractalDB, C categories x N images), "
                "strokes:C:N[:SEED] (pen-stroke glyphs, C classes x N images), fonts:C:N[:SEED] (characters "
                "in matplotlib's fonts, C <= 76), an image folder "
                "root/[train|val]/<class>/, WebDataset shards (a folder with _info.json or of .tar files, or a "
                "pattern train-{000000..000099}.tar) or a Hugging Face dataset (save_to_disk folder or Parquet; "
                "append '#image=COL,label=COL' to pick columns)")

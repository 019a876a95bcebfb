"""argparse `type=` helpers that check a flag's range while parsing, so a nonsense number (`--batch-size -1`,
`--l2 nan`, `--device bogus`) is refused before anything is loaded, as one line naming the allowed range and
exit code 2. The ranges are declared in vitlab.ranges (a training flag's with its setting: vitlab.train.settings);
`OneLineParser` makes every argparse error one line (no usage block).

    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--workers", type=non_negative_int)
    p.add_argument("--image-size", type=int_range(1, 4096))
    p.add_argument("--l2", type=positive_float)
    p.add_argument("--discard-ratio", type=float_range(0.0, 1.0, high_open=True))
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from vitlab import ranges
from vitlab.constants import DATA_SOURCES, PRECISION_HELP  # noqa: F401 - the verbs' help reads them here
from vitlab.ranges import Range


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line, `vitlab <verb>: error: <message>`, exit code 2 (argparse's own code)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def flag_type(allowed: Range) -> Callable[[str], int | float]:
    """The argparse `type=` of a flag whose values are `allowed` (declared in vitlab.ranges): its parse, with a
    value outside it refused as argparse's one-line error."""

    def parse(text: str) -> int | float:
        try:
            return allowed.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] (high None: no upper bound)."""
    return flag_type(ranges.int_range(low, high))


def float_range(
    low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """A finite number between low and high (None: unbounded), each end closed unless said open."""
    return flag_type(ranges.float_range(low, high, low_open, high_open))


positive_int = flag_type(ranges.POSITIVE_INT)
non_negative_int = flag_type(ranges.NON_NEGATIVE_INT)
image_size = flag_type(ranges.IMAGE_SIZE)
class_count = flag_type(ranges.CLASS_COUNT)
batch_size = flag_type(ranges.BATCH_SIZE)
workers = flag_type(ranges.WORKERS)
jobs = flag_type(ranges.JOBS)
seed = flag_type(ranges.SEED)
randaug_ops = flag_type(ranges.RANDAUG_OPS)
representation_size = flag_type(ranges.REPRESENTATION_SIZE)
finite_float = float_range()
learning_rate = flag_type(ranges.LEARNING_RATE)
mix_alpha = flag_type(ranges.MIX_ALPHA)
positive_float = float_range(0.0, low_open=True)
non_negative_float = float_range(0.0)
probability = flag_type(ranges.PROBABILITY)
fraction = flag_type(ranges.FRACTION)


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


def add_compile_flags(p: argparse.ArgumentParser) -> None:
    """--compile / --no-compile of an inference verb: the model compiled with its weights frozen into the graph, or
    not; neither: auto (vitlab.runtime.compiling decides from the images the run will process)."""
    from vitlab.constants import COMPILE_PAYS_OFF

    least = ", ".join(f"{r['precision']} models of width >= {r['width']} from {r['images']:,} images"
                      for r in COMPILE_PAYS_OFF)
    p.add_argument("--compile", dest="compile", action="store_const", const="on", default="auto",
                   help="torch.compile the model with its weights frozen into the graph (Inductor freezing); the "
                        "first batch of each shape compiles and the time is shown. Default: compiled on a CPU only "
                        f"where the run's images repay the compile seconds ({least}; BENCHMARKS.md)")
    p.add_argument("--no-compile", dest="compile", action="store_const", const="off",
                   help="never compile, whatever the number of images")


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
    "OneLineParser", "batch_size", "class_count", "device_name", "finite_float", "flag_type",
    "float_range", "fraction", "image_size", "int_range", "jobs", "learning_rate", "mix_alpha", "new_file",
    "new_or_folder", "non_negative_float", "non_negative_int", "positive_float", "positive_int", "precision_name",
    "probability", "randaug_ops", "representation_size", "seed", "workers",
]


# What --data accepts, for every verb that reads data (vitlab.data.build_datasets and load_split dispatch on it).
def force_help(what: str) -> str:
    """The help of a verb's --force: what it lets `what` replace, and what no flag lets any output replace."""
    return (f"let {what} replace a file vitlab did not write, or an earlier output of another kind (never: a file "
            "the command reads, a run's own files, weights by anything but weights, devices, FIFOs, links)")



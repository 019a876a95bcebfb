"""Console verbosity, progress bars and durations shared by every verb.

Bars are tqdm bars on stderr, shown only when stderr is a terminal and the user did not ask for quiet
(`vitlab -q`): piped output, log files and CI logs stay free of carriage-return noise. The verbosity is one
number set once by the command line (`vitlab -q` -1, default 0, `vitlab -v` 1); library users get the default.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

_verbosity = 0


def set_verbosity(level: int) -> None:
    """-1 quiet (warnings and errors only, no bars), 0 default, 1 verbose (debug messages of vitlab's loggers).
    The `vitlab` logger's level follows; at 0 it is left unset so that whoever configured logging decides (the
    trainer shows INFO on the main process only)."""
    global _verbosity
    _verbosity = max(-1, min(1, int(level)))
    logger = logging.getLogger("vitlab")
    logger.setLevel({-1: logging.WARNING, 0: logging.NOTSET, 1: logging.DEBUG}[_verbosity])
    if _verbosity > 0 and not logging.getLogger().handlers:  # debug messages need somewhere to go
        logging.basicConfig(level=logging.WARNING, format="%(message)s")


def verbosity() -> int:
    return _verbosity


def quiet() -> bool:
    return _verbosity < 0


def bars_enabled() -> bool:
    """A bar is drawn only on a terminal and not under -q."""
    return not quiet() and sys.stderr.isatty()


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str | None = None,
             unit: str = "it", enabled: bool | None = None) -> Any:
    """A tqdm bar on stderr over `iterable` (or a manual one: `.update(n)`), or tqdm's own pass-through
    (same methods, draws nothing) when bars are off. The bar disappears when done (`leave=False`): the verb's
    result lines are what stays on screen."""
    from tqdm import tqdm

    show = bars_enabled() if enabled is None else (enabled and bars_enabled())
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False,
                disable=not show)


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `3.4 h`, `2.1 days` (negative: `0 s`): as precise as an estimate is."""
    seconds = max(float(seconds), 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def printable(text: str) -> str:
    """`text` with every character a terminal would not show as itself (newlines, tabs, escape sequences, bytes
    of a name that is not UTF-8) written as a Python escape such as `\\n`: a file name then prints on one line
    and cannot move the cursor or recolour the terminal. Printable text, accents and all, is returned as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

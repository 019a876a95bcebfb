"""Every error vitlab raises for a problem the user can fix, under one base class.

Each carries one line that names the problem and the fix; the command line prints it as
`vitlab VERB: error: <line>` with exit code 2 (cli catches VitlabError), and a library caller can catch
`vitlab.errors.VitlabError` for all of them. Each also keeps the built-in type callers caught before the base
existed (ValueError, FileExistsError, RuntimeError), so no `except` clause changes meaning. A bottom module:
every layer raises them, and words them with its two helpers: `closest` (the "did you mean" of an unknown name) and
`setting` (a setting as the caller spells it: a flag, or a Python keyword)."""

from __future__ import annotations

import difflib
import errno
import functools
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar


class VitlabError(Exception):
    """The base of vitlab's user-facing errors: the message is one line saying what is wrong and how to fix it."""


class WeightsError(VitlabError, ValueError):
    """Raised for unknown formats, corrupt files, missing/extra tensors and shape mismatches.
    The message is one line: `<file>: <what is wrong> (<tensor>); <how to fix it>`."""

    def __init__(self, path: str | Path, problem: str, fix: str = ""):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{path}: {problem}" + (f"; {fix}" if fix else ""))


class DataError(VitlabError, ValueError):
    """Bad input data found before (or, with --strict, during) training: empty class folder, missing split,
    class-count mismatch, unreadable image."""


class EnvironmentSettingError(VitlabError, RuntimeError):
    """An environment variable vitlab reads holds a value it cannot use (VITLAB_MAX_IMAGE_PIXELS not a count). Not
    a ValueError: it is raised where images are opened, and the image readers take a ValueError for a broken file."""


class CacheDirError(VitlabError, ValueError):
    """The cache folder cannot be a folder (VITLAB_CACHE names a file)."""


class OutputRefused(VitlabError, FileExistsError):
    """An output path vitlab will not write over. One line, `<path>: <what is there>; <what to do>`; an OSError
    (EEXIST), as a full disk is, for callers that handle storage errors together."""

    def __init__(self, path: str | Path, problem: str, fix: str):
        super().__init__(errno.EEXIST, f"{problem}; {fix}", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class OutputError(VitlabError, ValueError):
    """The run could not write its outputs; the checkpoints written before stay valid."""


class TrainingDiverged(VitlabError, RuntimeError):
    """The loss became NaN or infinite; the run stopped without saving the bad state."""


class PeerLost(VitlabError, RuntimeError):
    """Another process of the job stopped answering (killed, crashed, stopped or cut off): this one cannot go on."""


def closest(word: str, names: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The one of `names` that `word` most likely misspells (case ignored: `vit-t/16` finds `ViT-Ti/16`), or None
    when none is `cutoff` similar (difflib's ratio): what every "did you mean" offers, so that a model name, a
    setting and a flag are matched alike."""
    by_lower: dict[str, str] = {}
    for name in names:
        by_lower.setdefault(name.lower(), name)
    match = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[match[0]] if match else None


# How an error names a setting: as the command line's flag (`--val-fraction`), or, inside one of vitlab's Python
# functions (`keyword_errors`), as the keyword its caller passed (`val_fraction`): each caller reads its own words.
_KEYWORDS: ContextVar[bool] = ContextVar("vitlab_keyword_errors", default=False)
_F = TypeVar("_F", bound=Callable[..., Any])


def setting(name: str, flag: str | None = None, value: Any = None) -> str:
    """Setting `name` (with `value`, if given) as the caller spells it: `--name VALUE` with dashes (`--flag`, where
    the flag is named otherwise: weight_decay's --wd), or `name=VALUE` (the value's repr; an upper-case word is a
    placeholder, RANK, written as it is) for a Python caller. `value=True` is a switch: `--name`, or `name=True`."""
    if _KEYWORDS.get():
        placeholder = isinstance(value, str) and value.isupper()
        return name if value is None else f"{name}={value if placeholder else repr(value)}"
    option = "--" + (flag or name).replace("_", "-")
    if value is None or value is True:
        return option
    return f"{option} {f'{value:g}' if isinstance(value, float) else value}"


def by_surface(command_line: str, python: str) -> str:
    """Advice that differs by more than a setting's spelling (a command to run, a function to call): the command
    line's words, or, inside one of vitlab's Python functions, Python's."""
    return python if _KEYWORDS.get() else command_line


def keyword_errors(func: _F) -> _F:
    """A public Python function whose errors name settings by its keywords (`setting`), not by flags."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        token = _KEYWORDS.set(True)
        try:
            return func(*args, **kwargs)
        finally:
            _KEYWORDS.reset(token)

    return call  # type: ignore[return-value]

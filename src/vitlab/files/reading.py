"""The one way vitlab opens a file it reads (weights, configs, records, indexes, images): only a regular file,
and never in a way that can block.

Opening a FIFO for reading waits for a writer, forever if none comes, and a device or socket is no file at all.
So a path is refused before it is opened (`check_regular`, one line naming it and what it is), and where vitlab
opens the file itself it is opened without blocking and checked again on the descriptor (`open_regular`), so a
FIFO swapped in between the two cannot make the open wait. Libraries that take a path (safetensors, torch.load,
ONNX Runtime) get it after `check_regular`.

`resolved` is what a path names, as the OS resolves it: the output rule, the input check and the run-file check
compare paths through it, so no spelling (a link followed by `..`) reaches a file another spelling protects.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO


class NotRegularFile(OSError):
    """A path vitlab was asked to read is a FIFO, device, socket or folder: one line naming it (`kind`: what it is)."""

    def __init__(self, path: str | os.PathLike, mode: int):
        self.path, self.kind = os.fsdecode(path), special_kind(mode)
        super().__init__(f"{self.path} is {self.kind}, not a regular file")


def special_kind(mode: int) -> str:
    """What a file that is not regular is, in words, from its `st_mode`."""
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "a special file")


def not_regular(path: str | Path) -> str | None:
    """Why `path` cannot be read as a file (a FIFO, a device, a socket, a folder), or None for a regular file.
    Follows symbolic links, as `open` does; raises FileNotFoundError for a missing file."""
    mode = os.stat(path).st_mode
    return None if stat.S_ISREG(mode) else str(NotRegularFile(path, mode))


def check_regular(path: str | Path) -> None:
    """NotRegularFile (an OSError, one line) unless `path` is a regular file or absent (the reader reports a
    missing file in its own words). Call it before handing a path to a library that opens it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent, a name too long, a loop of links: the reader's own open reports it
        return
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)


def open_regular(path: str | Path) -> IO[bytes]:
    """The file opened for reading in binary, or NotRegularFile (an OSError) when it is not a regular file.
    Opened without blocking, then checked again on the descriptor."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file reads the same either way; later readers expect blocking
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path) -> bytes:
    """The bytes of the regular file at `path` (`open_regular`'s rule)."""
    with open_regular(path) as f:
        return f.read()


def read_text_regular(path: str | Path) -> str:
    """The UTF-8 text of the regular file at `path` (`open_regular`'s rule); UnicodeDecodeError passes through."""
    return read_regular(path).decode("utf-8")


def resolved(path: str | os.PathLike) -> Path:
    """The file `path` names, as the OS resolves it when it opens, creates or renames it: every folder on the way
    with its symbolic links followed before a `..` after it applies (`L/../x` is beside L's target, not beside L),
    the last name kept as written (a link there is what the name holds, not its target). The one comparison of
    paths vitlab makes: two spellings name the same place exactly when their `resolved` paths are equal, where
    text (`os.path.abspath`, which drops `L/..` before any link is followed) would disagree with the OS."""
    path = Path(os.fsdecode(path))
    if path.name in ("", ".", ".."):  # the last name is itself a step of the way
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(path.parent)) / path.name

"""vitlab's cache folder and the lock that lets concurrent processes fill it once.

Downloads (vitlab.hub), rendered FractalDB splits (data/fractal.py) and shard indexes of read-only folders
(data/shardindex.py) all live under one folder: `$VITLAB_CACHE`, else the platform's cache directory
(`$XDG_CACHE_HOME/vitlab`, `~/.cache/vitlab`, `~/Library/Caches/vitlab`). It is a bottom module so that the data
layer need not borrow it from the download code.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from vitlab.errors import CacheDirError


def cache_dir() -> Path:
    """$VITLAB_CACHE, else the platform cache directory (XDG on Linux, ~/Library/Caches on macOS). CacheDirError
    when that path, or a folder above it, is an existing file: nothing could be cached there."""
    if os.environ.get("VITLAB_CACHE"):
        return _usable(Path(os.environ["VITLAB_CACHE"]).expanduser(), "VITLAB_CACHE")
    return _usable(_platform_cache_dir(), "the cache folder")


def _usable(path: Path, what: str) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                raise CacheDirError(f"{what} {path} cannot be a folder: {folder} is a file; point VITLAB_CACHE at a "
                                    "folder (or unset it)")
            break
    return path


def _platform_cache_dir() -> Path:
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "vitlab"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "vitlab" / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vitlab"


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive lock on `<path>.lock` held for the block (fcntl.flock: released when the process dies)."""
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no flock; concurrent writers then each write their own temporary file
        yield
        return
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

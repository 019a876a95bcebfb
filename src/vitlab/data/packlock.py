"""One `vitlab shards` per output folder at a time: an exclusive lock (`.vitlab-shards.lock`, flock) held while
packing. Two packers into one folder would both write `train-000000.tar`, … and each other's `_info.json` (seen:
thousands of duplicated and hundreds of garbled samples, exit 0); the second is refused in one line instead. The
OS releases the lock when its process dies, so a killed pack never blocks its own re-run.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

from vitlab.errors import DataError

LOCK = ".vitlab-shards.lock"


class PackLock:
    """`with PackLock(out):` the folder is this process's to pack into, or DataError naming the holder."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK
        self.fd: int | None = None

    def __enter__(self) -> PackLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise DataError(f"{self.path.parent} is being packed by another vitlab shards (process {holder}); "
                                "wait for it to end, or pack into another folder") from None
            raise DataError(f"cannot lock {self.path} ({err.strerror}); pack into another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays (removing it would race a waiting packer)
            self.fd = None

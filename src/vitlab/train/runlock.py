"""The run directory, write side: what may be written into, by whom, and checked before step 1 (its layout, and
what marks a folder as a run, are vitlab.files.rundir's).

- `--out` must be new, empty, or a vitlab run (continued only with --resume): an export folder or any other
  non-empty folder is never written into.
- One training at a time: an exclusive lock (`.vitlab.lock`, flock) is held for the run's life. The OS releases it
  when the process dies, so a run killed with -9 never blocks its own `--resume`. The lock belongs to the training
  process alone: a forked child (a loader worker) closes its inherited copy at once, since a flock lives as long as
  any descriptor of its open file, and orphaned workers outlive a killed parent by seconds.
- The folder and its `checkpoints/` are probed for writing before step 1, so a read-only or full disk is one line
  at the start instead of a traceback after the last step.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from vitlab.files.rundir import CHECKPOINTS, holds_run

LOCK = ".vitlab.lock"
OWN_FILES = {LOCK, "console.log"}  # what a run that failed before its first record leaves behind
_HELD: set[int] = set()  # descriptors of the run locks this process holds


def _drop_inherited_locks() -> None:
    """In a forked child: close the run-lock descriptors inherited from the parent (the parent keeps its own)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


def check_out(out: Path, resume: bool) -> None:
    """ValueError (one line) unless `out` may receive this run."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose a new folder for the run")
    if not out.is_dir():
        return
    if holds_run(out):
        if not resume:
            raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES)
    if foreign:
        raise ValueError(f"--out {out} is not empty and not a vitlab run (it holds {foreign[0]!r}"
                         f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); choose a new or empty "
                         "folder")


def probe_writable(folder: Path) -> None:
    """Create `folder` if needed and write a file into it; a one-line ValueError naming the cause otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".vitlab-probe-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        raise ValueError(f"cannot write to {folder} ({err.strerror or err}); choose a writable --out") from None


class RunLock:
    """An exclusive lock on the run directory for this process's life (rank 0 of a job takes it)."""

    def __init__(self, out: Path):
        self.path = out / LOCK
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise ValueError(f"{out} is in use by another vitlab run (process {holder}); wait for it to end or "
                                 "choose another --out") from None
            raise ValueError(f"cannot lock {self.path} ({err.strerror}); choose another --out") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        _HELD.add(self.fd)

    def release(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def prepare_run_dir(out: Path, resume: bool, is_main: bool) -> RunLock | None:
    """Check, create, probe and lock the run directory: the main process does it all (the others would see its
    probe and lock files appear while they look; its refusal ends the whole job)."""
    if not is_main:
        return None
    check_out(out, resume)
    probe_writable(out)
    lock = RunLock(out)
    try:
        if (out / CHECKPOINTS).is_dir():  # a resumed run's (created later with the folder's permissions)
            probe_writable(out / CHECKPOINTS)
    except BaseException:
        lock.release()
        raise
    return lock

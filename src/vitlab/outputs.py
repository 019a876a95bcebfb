"""Output safety for every file and folder vitlab writes.

- Atomic: the content is written under a temporary name beside the destination and renamed into place, so a
  reader sees the old version or the new one, never half of one.
- Permissions follow the umask, as `open()` would give them (mkstemp/mkdtemp create 0600/0700).
- A writer killed with SIGKILL leaves its temporary file behind; the next write into the same folder removes the
  temporaries of writers on this host that are no longer running. The name carries host and process id:
  `.model.safetensors.vitlab-tmp-<host>-<pid>-<random>`.
- A write that fails because of the storage (full disk, quota, read-only file system, permissions, a name too
  long) raises an OSError naming the destination, whichever library wrote (safetensors and torch.save wrap the
  OS error in their own types); `os_error_line` turns it into the one line the command line prints.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

_TAG = "vitlab-tmp"
# Failures of the storage rather than of vitlab: what the user can fix, and how.
STORAGE_ERRNOS: dict[int, str] = {
    errno.ENOSPC: "free some space there or write elsewhere",
    errno.EDQUOT: "free some of your quota or write elsewhere",
    errno.EFBIG: "the file system cannot hold a file this large; write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "check the permissions, or write elsewhere",
    errno.EPERM: "check the permissions, or write elsewhere",
    errno.ENAMETOOLONG: "use a shorter name (most file systems allow 255 bytes per name)",
}
# How safetensors (Rust: "os error 28") and Python report the errno inside a message.
_ERRNO_IN_TEXT = re.compile(r"os error (\d+)|\[Errno (\d+)\]")
_NEARLY_FULL = 1 << 20  # bytes free beside a failed write, with its partial file still there: the disk is full
_NAME_ROOM = 120  # bytes of the destination's name kept in a temporary's name (the rest is tag, host, pid)


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (os.umask is a set-and-return)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def _temp_prefix(dest: Path) -> str:
    # The destination's name is shortened so that any name the file system allows still fits beside the tag.
    name = os.fsencode(dest.name)[:_NAME_ROOM].decode(errors="ignore")
    return f".{name}.{_TAG}-{_host()}-{os.getpid()}-"


def os_error_line(err: OSError) -> str:
    """One line for an OSError: the path, what the system said and, for storage problems, what to do."""
    where = f"{err.filename}: " if err.filename else ""
    what = err.strerror or str(err)
    fix = STORAGE_ERRNOS.get(err.errno or 0)
    return f"{where}{what}" + (f"; {fix}" if fix else "")


def _ours(name: Path, dest: Path) -> bool:
    """Whether an OSError's file is the destination, a folder above it or a temporary beside it."""
    if name == dest or name in dest.parents:
        return True
    return name.is_relative_to(dest.parent) and _TAG in str(name.relative_to(dest.parent))


def check_name_length(path: Path) -> None:
    """OSError(ENAMETOOLONG) naming `path` when its name is longer than its folder's file system allows."""
    folder = next((p for p in path.parents if p.exists()), Path("."))
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    for part in (path, *path.parents):  # every component: a long folder name fails as surely
        if len(os.fsencode(part.name)) > limit:
            raise OSError(errno.ENAMETOOLONG, f"File name too long ({len(os.fsencode(part.name))} bytes, the "
                          f"limit is {limit})", str(path))


def storage_error(err: BaseException, dest: Path, written: Path | None = None) -> OSError | None:
    """The OSError naming `dest` when a write failed because of the storage, else None. Libraries that wrap the
    OS error without its errno (torch.save: "unexpected pos …") are recognised by the space left beside the
    partial file `written`."""
    if isinstance(err, OSError) and err.filename is not None and not _ours(Path(os.fsdecode(err.filename)), dest):
        return None  # a file the writer read, not the one it wrote
    code = err.errno if isinstance(err, OSError) else None
    if code is None and (found := _ERRNO_IN_TEXT.search(str(err))):
        code = int(found.group(1) or found.group(2))
    if code is None and written is not None and isinstance(err, RuntimeError):
        try:
            if shutil.disk_usage(written.parent).free < _NEARLY_FULL:
                code = errno.ENOSPC
        except OSError:
            pass
    if code not in STORAGE_ERRNOS:
        return None
    if isinstance(err, OSError) and err.filename == str(dest):
        return err
    return OSError(code, os.strerror(code), str(dest))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove temporaries that writers on this host left when they died; returns what was removed."""
    marker = f".{_TAG}-{_host()}-"
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or marker not in name:
            continue
        pid_text = name.split(marker, 1)[1].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def atomic_write(path: str | Path, write: Callable[[str], object]) -> None:
    """Call write(tmp_path) for a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    try:
        check_name_length(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    except OSError as err:
        raise (storage_error(err, path) or err) from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as err:
        named = storage_error(err, path, Path(tmp)) if isinstance(err, Exception) else None
        Path(tmp).unlink(missing_ok=True)
        if named is not None and named is not err:
            raise named from None
        raise


def _apply_umask(folder: Path) -> None:
    """Modes as open()/mkdir() would give them: some writers (mkdtemp, safetensors) create 0600/0700."""
    mask = current_umask()
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def atomic_folder(folder: str | Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_dir) for a fresh folder beside `folder`, then swap it into place (an existing folder is
    moved aside first and restored if the swap fails). The caller decides whether `folder` may be replaced."""
    folder = Path(folder)
    try:
        check_name_length(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(folder.parent)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder), dir=folder.parent))
    except OSError as err:
        raise (storage_error(err, folder) or err) from None
    old = tmp.with_name(tmp.name + "-old")
    try:
        write(tmp)
        _apply_umask(tmp)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
    except BaseException as err:
        named = storage_error(err, folder, tmp) if isinstance(err, Exception) else None
        if old.exists() and not folder.exists():
            old.rename(folder)  # put the earlier version back
        shutil.rmtree(tmp, ignore_errors=True)
        if named is not None and named is not err:
            raise named from None
        raise
    shutil.rmtree(old, ignore_errors=True)


WRITTEN_BY = "written_by"  # the key of a verb's JSON record that names the verb: its outputs may be replaced
_LEGACY = "a vitlab version from before written_by"


def check_replaceable(folder: str | Path, record: str, verb: str, others: tuple[str, ...] = (),
                      legacy_keys: frozenset[str] = frozenset()) -> None:
    """ValueError (one line) unless the files `verb` writes into `folder` (its JSON `record` and `others`) are
    absent or its own: the record says `"written_by": verb` (or, from before the key existed, holds every one of
    `legacy_keys`). A file that a user put there is never replaced."""
    folder = Path(folder)
    present = [name for name in (record, *others) if (folder / name).exists()]
    if not present or _written_by(folder / record, legacy_keys) in (verb, _LEGACY):
        return
    raise ValueError(f"{folder / present[0]} was not written by {verb}; choose another --out (vitlab never "
                     "replaces a file it did not write)")


def _written_by(path: Path, legacy_keys: frozenset[str]) -> str | None:
    import json

    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:  # a record is a few hundred bytes
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get(WRITTEN_BY), str):
        return data[WRITTEN_BY]
    return _LEGACY if legacy_keys and legacy_keys <= data.keys() else None

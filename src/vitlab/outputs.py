"""Output safety for every file and folder vitlab writes.

- Atomic: the content is written under a temporary name beside the destination and renamed into place, so a
  reader sees the old version or the new one, never half of one.
- Permissions follow the umask, as `open()` would give them (mkstemp/mkdtemp create 0600/0700).
- A writer killed with SIGKILL leaves its temporary file behind; the next write into the same folder removes the
  temporaries of writers on this host that are no longer running. The name carries host and process id:
  `.model.safetensors.vitlab-tmp-<host>-<pid>-<random>`.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

_TAG = "vitlab-tmp"


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
    return f".{dest.name}.{_TAG}-{_host()}-{os.getpid()}-"


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
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder), dir=folder.parent))
    old = tmp.with_name(tmp.name + "-old")
    try:
        write(tmp)
        _apply_umask(tmp)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
    except BaseException:
        if old.exists() and not folder.exists():
            old.rename(folder)  # put the earlier version back
        shutil.rmtree(tmp, ignore_errors=True)
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

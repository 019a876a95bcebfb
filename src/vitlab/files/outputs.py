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
- Owned: `check_output` is the one rule for every path vitlab writes (see its docstring): what is not a regular
  file (a device, FIFO, socket, symbolic link, folder) is never renamed over, and a regular file is replaced only
  if vitlab wrote it, recognisably (the mark `written_by: vitlab…` that `mark`/`mark_zip`/`mark_text` put in
  each kind of file), or when the user forces it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from vitlab.errors import OutputRefused, setting

# The marks and kinds, re-exported: writers import the rule and the marks from one place.
from vitlab.files.marks import CSV as CSV
from vitlab.files.marks import JSON as JSON
from vitlab.files.marks import ONNX as ONNX
from vitlab.files.marks import PNG as PNG
from vitlab.files.marks import TEXT as TEXT
from vitlab.files.marks import WEIGHTS as WEIGHTS
from vitlab.files.marks import WRITTEN_BY as WRITTEN_BY
from vitlab.files.marks import Kind as Kind
from vitlab.files.marks import kind_of as kind_of
from vitlab.files.marks import mark as mark
from vitlab.files.marks import mark_text as mark_text
from vitlab.files.marks import mark_zip as mark_zip
from vitlab.files.marks import written_by as written_by
from vitlab.files.reading import read_text_regular, resolved
from vitlab.files.rundir import enclosing_run, is_run_dir, is_sweep_dir, run_dir_of, run_owning

_TAG = "vitlab-tmp"
# Failures of the storage rather than of vitlab: what the user can fix, and how.
STORAGE_ERRNOS: dict[int, str] = {
    errno.ENOSPC: "free some space there or write elsewhere",
    errno.EDQUOT: "free some of your quota or write elsewhere",
    errno.EFBIG: "the file system cannot hold a file this large; write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "check the permissions, or write elsewhere",
    errno.EPERM: "check the permissions, or write elsewhere",
    errno.ENAMETOOLONG: "use a shorter name or a shorter path",
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
    """Whether an OSError's file is the destination, a folder above it or a temporary beside it (compared as the
    OS resolves them: the temporary's name is absolute, the destination's may be relative)."""
    name, dest = resolved(name), resolved(dest)
    if name == dest or name in dest.parents:
        return True
    return name.is_relative_to(dest.parent) and _TAG in str(name.relative_to(dest.parent))


def check_name_length(path: Path) -> None:
    """OSError(ENAMETOOLONG) naming `path` when one of its names is longer than its folder's file system allows,
    or the whole path longer than the system's limit for a path (PATH_MAX): each with its own limit and advice."""
    try:
        path_limit = os.pathconf(os.sep, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        path_limit = 4096
    # The temporary beside `path` is what the system opens: its name, not the destination's, must fit.
    if len(os.fsencode(os.path.abspath(path.parent / _temp_prefix(path)))) + 8 >= path_limit:
        raise OSError(errno.ENAMETOOLONG, f"Path too long ({len(os.fsencode(os.path.abspath(path)))} bytes; a "
                      f"whole path may have {path_limit}, less room for the temporary written beside it)", str(path))
    folder = next((p for p in path.parents if os.path.exists(p)), Path("."))  # False, not OSError, on a long name
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    for part in (path, *path.parents):  # every component: a long folder name fails as surely
        if len(os.fsencode(part.name)) > limit:
            raise OSError(errno.ENAMETOOLONG, f"File name too long ({len(os.fsencode(part.name))} bytes, the "
                          f"limit is {limit} per name)", str(path))


def make_folder(folder: Path) -> None:
    """mkdir -p, with one line when a file stands where a folder of the path should be (the system says
    "File exists", which reads as if the output itself were in the way)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in (folder, *folder.parents) if os.path.lexists(p) and not p.is_dir()), folder)
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a folder; choose another path",
                                 str(blocking)) from None


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


def atomic_write(path: str | Path, write: Callable[[str], object], *, user_named: bool = False,
                 force: bool = False, kind: Kind | None = None, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Call write(tmp_path) for a temporary file beside `path`, then rename it into place. What is at `path` is
    checked before the work and again before the rename: never a special file or link (`refuse_special`); with
    `user_named` (a path the user gave) by the whole output rule, `check_output(path, force, kind=, inputs=)`."""
    path = Path(path)
    inputs = tuple(inputs)
    guard = ((lambda: check_output(path, force, kind=kind, inputs=inputs)) if user_named
             else (lambda: refuse_special(path)))
    guard()
    try:
        check_name_length(path)
        make_folder(path.parent)
        remove_stale_temporaries(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=resolved(path).parent)  # not `L/..` as text
    except OSError as err:
        raise (storage_error(err, path) or err) from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        guard()  # the path may have changed while the content was written
        os.replace(tmp, path)
    except BaseException as err:
        named = storage_error(err, path, Path(tmp)) if isinstance(err, Exception) else None
        named = named or _about_destination(err, Path(tmp), path)
        Path(tmp).unlink(missing_ok=True)
        if named is not None and named is not err:
            raise named from None
        raise


def _about_destination(err: BaseException, tmp: Path, dest: Path) -> OSError | None:
    """The OSError of a failed write or rename, naming the destination rather than vitlab's temporary beside it
    (whose name means nothing to the user); None when the error names another file."""
    if not isinstance(err, OSError) or isinstance(err, OutputRefused) or err.filename is None:
        return None
    if Path(os.fsdecode(err.filename)) not in (tmp, tmp.with_name(tmp.name + "-old")):
        return None
    return type(err)(err.errno, err.strerror, str(dest)) if err.errno else None


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
    refuse_special(folder, "folder")
    try:
        check_name_length(folder)
        make_folder(folder.parent)
        remove_stale_temporaries(folder.parent)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder), dir=resolved(folder).parent))  # not `L/..` as text
    except OSError as err:
        raise (storage_error(err, folder) or err) from None
    old = tmp.with_name(tmp.name + "-old")
    try:
        write(tmp)
        _apply_umask(tmp)
        refuse_special(folder, "folder")  # the path may have changed while the content was written
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
    except BaseException as err:
        named = storage_error(err, folder, tmp) if isinstance(err, Exception) else None
        named = named or _about_destination(err, tmp, folder)
        if old.exists() and not folder.exists():
            old.rename(folder)  # put the earlier version back
        shutil.rmtree(tmp, ignore_errors=True)
        if named is not None and named is not err:
            raise named from None
        raise
    shutil.rmtree(old, ignore_errors=True)


_LEGACY = "a vitlab version from before written_by"


def check_replaceable(folder: str | Path, record: str, verb: str, others: tuple[str, ...] = (),
                      legacy_keys: frozenset[str] = frozenset(), inputs: Iterable[str | os.PathLike] = (),
                      owner: bool = False) -> None:
    """ValueError (one line) unless the files `verb` writes into `folder` (its JSON `record` and `others`) are
    absent or its own: the record says `"written_by": verb` (or, from before the key existed, holds every one of
    `legacy_keys`), or each file present carries the verb's own mark (a run stopped before its record). A file
    that a user put there is never replaced; a device, FIFO, socket, link or folder there is refused, and so are
    the verb's `inputs`, a run's own files and a run none of `inputs` belongs to (`check_output`'s first rules),
    --force or not; `owner`: the folder is the verb's own (a sweep's records in its folder), whose files are its to
    write."""
    folder = Path(folder)  # a link to a folder is fine here: files are written into it, it is not replaced
    inputs = tuple(inputs)
    for name in (record, *others):
        refuse_input(folder / name, inputs)
        if not owner:
            refuse_run_file(folder / name)
    if not owner:
        refuse_other_run(folder / record, inputs, folder=folder)
    present = [name for name in (record, *others) if os.path.lexists(folder / name)]
    for name in present:
        refuse_special(folder / name)
    if not present or _written_by(folder / record, legacy_keys) in (verb, _LEGACY):
        return
    theirs = [name for name in present if not (written_by(folder / name) or "").startswith(verb)]
    if theirs:
        raise ValueError(f"{folder / theirs[0]} was not written by {verb}; choose another {setting('out')} "
                         "(vitlab never "
                         "replaces a file it did not write)")


def _written_by(path: Path, legacy_keys: frozenset[str]) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:  # a record is a few hundred bytes
            return None
        data = json.loads(read_text_regular(path))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get(WRITTEN_BY), str):
        return data[WRITTEN_BY]
    return _LEGACY if legacy_keys and legacy_keys <= data.keys() else None


# --- Which outputs vitlab may replace ----------------------------------------------------------------------------
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"))


def force_fix() -> str:
    """The fix of a refused output that `force` would replace, in the caller's words (`--force`, `force=True`)."""
    return f"pass {setting('force', value=True)} to replace it, or choose a new name"


def refuse_special(path: str | Path, what: str = "file") -> None:
    """OutputRefused when `path` exists and is not a regular file (or, for what="folder", not a real folder):
    renaming over a character device replaces it (run as root, /dev/null itself), over a FIFO or socket breaks
    what listens on it, and a symbolic link would be replaced by a file rather than written through."""
    try:
        st = os.lstat(path)
    except OSError:  # absent, or a path the write itself will report (a file where a folder should be)
        return
    if stat.S_ISREG(st.st_mode) if what == "file" else stat.S_ISDIR(st.st_mode):
        return
    kind = "a regular file" if stat.S_ISREG(st.st_mode) else next(k for test, k in _KINDS if test(st.st_mode))
    fix = {"a symbolic link": f"vitlab does not write through links; name the {what} itself or a new one",
           "a folder": "give a file path"}.get(kind, f"vitlab writes a new {what}; choose a new name")
    raise OutputRefused(path, f"exists and is {kind}, not a {'regular file' if what == 'file' else what}", fix)


def write_json(path: str | Path, record: object, *, indent: int = 1, end: str = "", user_named: bool = False,
               force: bool = False, inputs: Iterable[str | os.PathLike] = ()) -> str:
    """`record` as JSON (`indent`, then `end`) written atomically by `atomic_write`'s rule (`user_named`, `force`,
    `inputs` as there; the kind: a JSON file of the record's `written_by`); the text written. The one JSON writer:
    every JSON output goes through the output rule."""
    text = json.dumps(record, indent=indent) + end
    writer = record.get(WRITTEN_BY) if isinstance(record, dict) else None
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), user_named=user_named, force=force,
                 kind=Kind(writer, JSON) if writer else None, inputs=inputs)
    return text


def check_output(path: str | Path, force: bool = False, fix: str | None = None, *, kind: Kind | None = None,
                 inputs: Iterable[str | os.PathLike] = ()) -> None:
    """The rule for every file a user names as an output (checked before the work and again before the rename).
    Refused whatever `force` says:
    - one of the verb's `inputs`: the same file (by inode: links, hard links and other spellings included) or a
      path inside an input folder, existing or not (a dataset, an image folder of one, a weights folder; a run's
      or sweep's folder is held by the next rule);
    - one of a run's own files (weights, best weights, checkpoints, config.json, records, a sweep's sweep.json and
      sweep.png: `rundir.run_owning`): only the run's training writes them;
    - a path inside a run or sweep folder that none of `inputs` belongs to (`refuse_other_run`): it would be taken
      for one of that run's files;
    Every comparison takes the path as the OS resolves it (`reading.resolved`: `link/..` is beside the link's
    target).
    - what is not a regular file (a character or block device, FIFO, socket, symbolic link, folder);
    - weights (a safetensors or zip archive, whoever wrote it) when the output is not weights (`kind`).
    Otherwise an absent path is written, and an existing file is replaced when it is an earlier output of the same
    `kind` (vitlab's mark `written_by: vitlab…` and the format; for weights, any vitlab weights), or when `force`.
    Any other file is refused (OutputRefused, one line ending in `fix`). `kind` None: any file vitlab marked."""
    fix = fix or force_fix()
    refuse_input(path, inputs)
    refuse_run_file(path)
    refuse_other_run(path, inputs)
    refuse_special(path)
    if not os.path.lexists(path):
        return
    there = kind_of(path)
    if there is not None and there.format == WEIGHTS and kind is not None and kind.format != WEIGHTS:
        raise OutputRefused(path, f"holds weights (a safetensors or zip archive), which only weights replace; this "
                                  f"output is {kind}", "choose another name")
    if force:
        return
    if there is None or there.writer is None:
        raise OutputRefused(path, "exists and vitlab did not write it", fix or force_fix())
    if kind is not None and there != kind and not (kind.format == WEIGHTS == there.format):
        raise OutputRefused(path, f"is {there}, not {kind}", fix or force_fix())


def refuse_input(path: str | Path, inputs: Iterable[str | os.PathLike]) -> None:
    """OutputRefused when `path` is one of `inputs` (the same file by inode) or lies inside an input folder (a
    dataset or one of its image folders, a weights folder), existing or not: what is written there would be read
    as data, or replace what the folder holds. A run's or a sweep's folder is the exception: its own files are
    guarded by `refuse_run_file`, and a verb's record beside them (eval.json) is where it belongs. Paths are
    compared as the OS resolves them (`reading.resolved`). Inputs that do not exist as paths (published names,
    embedded datasets) hold nothing."""
    target = resolved(path)
    for given in inputs:
        if not os.path.exists(given):
            continue
        if os.path.isdir(given):
            folder = Path(os.path.realpath(given))
            if target.is_relative_to(folder) and not (is_run_dir(folder) or is_sweep_dir(folder)):
                raise OutputRefused(path, f"lies inside {os.fsdecode(given)}, which this command reads",
                                    "write the output somewhere else")
        elif os.path.exists(path) and os.path.samefile(path, given):
            raise OutputRefused(path, f"is {os.fsdecode(given)}, which this command reads", "give another output "
                                f"path ({setting('force', value=True)} does not replace an input)")


def refuse_run_file(path: str | Path) -> None:
    """OutputRefused when `path` is one of a run's own files (`rundir.run_owning`): a run's weights, best weights,
    checkpoints, config.json and records are written only by its training, so no other output may take their
    place, --force or not."""
    try:
        run = run_owning(path)
    except OSError:  # a path the system cannot look up (a name too long): the write itself reports it
        return
    if run is not None:
        owner = "sweep" if is_sweep_dir(run) else "run"
        raise OutputRefused(path, f"is one of the files of the {owner} in {run}, which only its training writes",
                            f"write the output outside the {owner}'s files ({setting('force', value=True)} does not "
                            "replace them)")


def refuse_other_run(path: str | Path, inputs: Iterable[str | os.PathLike] = (), *,
                     folder: str | Path | None = None) -> None:
    """OutputRefused when the file `path` (for an output `folder`, one of its files: `OUT/_info.json`, the
    message naming the folder) would lie inside a run or sweep folder, at any depth, that none of `inputs` belongs
    to (`rundir.run_dir_of`): it would be taken for one of that run's files, and removing the run would remove it.
    A run's own weights exported beside them stay allowed. Paths are compared as the OS resolves them
    (`reading.resolved`)."""
    try:
        run = enclosing_run(path)
        if run is None:
            return
        own = {Path(os.path.realpath(r)) for r in map(run_dir_of, inputs) if r is not None}
    except OSError:  # a path the system cannot look up (a name too long): the write itself reports it
        return
    if run not in own:
        owner = "sweep" if is_sweep_dir(run) else "run"
        raise OutputRefused(folder or path, f"lies inside the {owner} in {run}, which this command did not read",
                            f"write the output outside the {owner}")


def check_output_folder(folder: str | Path, names: tuple[str, ...], card: str, force: bool = False,
                        fix: str | None = None, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """The rule for a folder export (timm, HF): absent or empty, or an earlier export: nothing in it but `names`
    (never a special file) and its model card `card` marked as vitlab's (`force`: the card may be anyone's). A
    folder holding anything else is refused even with `force`: replacing it would delete the user's data; so is
    one that holds (or is) one of `inputs`, or lies among a run's files."""
    folder, fix = Path(folder), fix or force_fix()
    refuse_run_file(folder / card)
    for given in inputs:
        if os.path.exists(given) and Path(os.path.realpath(given)).is_relative_to(resolved(folder)):
            raise OutputRefused(folder, f"holds {os.fsdecode(given)}, which this command reads",
                                f"write the export to a new folder ({setting('force', value=True)} does not "
                                "replace an input)")
    refuse_special(folder, "folder")
    if not folder.exists():
        return
    entries = sorted(folder.iterdir())
    foreign = [e.name for e in entries if e.name not in names]
    if foreign:
        raise OutputRefused(folder, f"holds {foreign[0]!r}, which vitlab's export does not write",
                            "write to a new or empty folder")
    for entry in entries:
        refuse_special(entry)
    if entries and not force and written_by(folder / card) is None:
        raise OutputRefused(folder, f"holds files vitlab did not write ({card} has no vitlab mark)", fix or force_fix())

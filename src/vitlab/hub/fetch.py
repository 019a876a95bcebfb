"""A catalogue entry -> a local, whole file or folder: from the cache when it is there and intact, otherwise
downloaded once (under a file lock, so torchrun's ranks wait for one download), never in offline mode."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from vitlab.errors import WeightsError
from vitlab.files.cache import file_lock
from vitlab.files.digest import sha256_file
from vitlab.hub import hf
from vitlab.hub.cache import entry_path, meta_path, offline, problem, read_meta, readable, write_meta
from vitlab.hub.download import HostNotFound, download
from vitlab.hub.entry import Entry


def fetch(entry: Entry, *, force: bool = False, progress: bool = True, retry_delay: float = 1.0) -> Path:
    """The local path of `entry` (a file; a snapshot folder for hub repositories), downloading it if needed."""
    if entry.repo is not None:
        return hf.fetch_repo(entry, force=force)  # read at call time: tests stand a fake hub in
    path = entry_path(entry)
    why = problem(path)
    if why is None and not force:
        return path
    state = "not in the cache" if why == "not downloaded" else f"a broken cache entry ({why})"
    if var := offline():
        raise WeightsError(path, f"{entry.name} is {state} and {var}=1 forbids downloading", _offline_fix(entry))

    def waiting() -> None:
        print(f"vitlab: another process is downloading {entry.name}; waiting", file=sys.stderr, flush=True)

    with file_lock(path, on_wait=waiting):
        why = problem(path)  # the process we waited for may have finished it
        if why is None and not force:
            return path
        _discard(path, why, entry, fresh=force)
        part = path.with_name(path.name + ".part")
        # A published size catches a wrong file, not a corrupt one (the announced length and the zip CRCs do):
        # its rounding plus 1% keeps a stated "391 MiB" from rejecting the real file.
        published = entry.size if entry.size_source == "published" else None
        slack = entry.size_slack + (entry.size or 0) // 100
        try:
            record = download(entry.url or "", part, entry.name, size=published, size_slack=slack,
                              sha256=entry.sha256, progress=progress, retry_delay=retry_delay)
        except HostNotFound as err:  # no network: one attempt, and the line offline mode gives
            raise WeightsError(path, f"{entry.name} is {state} and {err.host} does not resolve (offline?)",
                               _offline_fix(entry)) from None
        write_meta(path, _meta(entry, record))  # first the record, then the file: no file without its record
        os.replace(part, path)
    return path


def _offline_fix(entry: Entry) -> str:
    return f"run `vitlab download {entry.name}` where the network is reachable"


def _discard(path: Path, why: str | None, entry: Entry, fresh: bool) -> None:
    """Remove a broken (or, with `fresh`, any) cache entry before downloading it again."""
    if path.exists() and why not in (None, "not downloaded"):
        print(f"vitlab: re-fetching {entry.name}: the cached file is broken ({why})", file=sys.stderr)
    if fresh or path.exists():
        path.unlink(missing_ok=True)
        meta_path(path).unlink(missing_ok=True)
    if fresh:
        path.with_name(path.name + ".part").unlink(missing_ok=True)


def _meta(entry: Entry, record: dict[str, Any]) -> dict[str, Any]:
    """What vitlab.load needs to know of the file later (class names, pre-processing) plus the provenance."""
    return {
        "name": entry.name, "url": entry.url, "size": record["size"], "sha256": record["sha256"],
        "downloaded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": entry.model,
        "classes": entry.classes, "eval_resize": entry.eval_resize,
        "mean": list(entry.mean) if entry.mean else None, "std": list(entry.std) if entry.std else None,
        "resolution": entry.resolution, "licence": entry.licence,
    }


def verify_cached(entry: Entry) -> str | None:
    """A full check of a cached file against its record (sha256 and zip CRCs); None when it is whole."""
    if entry.repo is not None:
        return None  # huggingface_hub checks its own files (etag / sha256 of LFS objects)
    path = entry_path(entry)
    if why := problem(path):
        return why
    meta = read_meta(path) or {}
    if meta.get("sha256") and sha256_file(path) != meta["sha256"]:
        return "sha256 differs from the one recorded at download"
    return readable(path, deep=True)

"""Where downloaded checkpoints live and how a cache entry is known to be whole.

Layout: the vitlab cache folder (`vitlab.files.cache.cache_dir`) / host / URL path, e.g.
`~/.cache/vitlab/storage.googleapis.com/vit_models/augreg/B_16-….npz`, with beside each file
- `<file>.vitlab.json`: what was downloaded (catalogue name, URL, size, sha256, pre-processing), written before
  the file is renamed into place, so a file without it is an interrupted download, never a cache entry;
- `<file>.part`: the download in progress (a stable name, so a later run resumes it with an HTTP Range request);
- `<file>.lock`: the lock that makes concurrent processes (torchrun ranks) download once.
Hugging Face repositories stay in huggingface_hub's own cache.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from vitlab.files.cache import cache_dir
from vitlab.files.outputs import write_json
from vitlab.files.reading import open_regular, read_text_regular
from vitlab.hub.entry import Entry

META_SUFFIX = ".vitlab.json"
_TRUE = ("1", "true", "yes", "on")


def offline() -> str | None:
    """The variable that forbids network access (VITLAB_OFFLINE or HF_HUB_OFFLINE), or None."""
    for var in ("VITLAB_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return var
    return None


def entry_path(entry: Entry) -> Path:
    """The cache file of a URL entry: host and path of its URL under the cache directory."""
    if entry.url is None:
        raise ValueError(f"{entry.name} has no URL (a hub repository lives in the Hugging Face cache)")
    parts = urlsplit(entry.url)
    host = parts.netloc.replace(":", "_")  # 127.0.0.1:8000 -> 127.0.0.1_8000, valid everywhere
    rel = [p for p in unquote(parts.path).split("/") if p not in ("", ".", "..")]
    return cache_dir().joinpath(host, *rel)


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + META_SUFFIX)


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(read_text_regular(meta_path(path)))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    write_json(meta_path(path), meta, end="\n")


def problem(path: Path) -> str | None:
    """Why the cache entry at `path` cannot be used (None: it is whole). Cheap: sizes and the zip directory, not
    a checksum pass (`vitlab download --verify` does that)."""
    if not path.is_file():
        return "not downloaded"
    meta = read_meta(path)
    if meta is None:
        return f"no {META_SUFFIX} record beside it (an interrupted or foreign file)"
    size = path.stat().st_size
    if meta.get("size") != size:
        return f"{size} bytes on disk, {meta.get('size')} downloaded"
    return readable(path, deep=False)


def readable(path: Path, deep: bool) -> str | None:
    """A format check: zip archives (.npz, torch zip) open, and with `deep` every member's CRC-32 matches."""
    with open_regular(path) as f:
        magic = f.read(4)
    if magic[:2] != b"PK":
        return None if path.suffix != ".npz" else "not a zip archive"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip() if deep else None
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"unreadable zip archive ({err})"
    return f"corrupt member {bad} (CRC-32 mismatch)" if bad else None

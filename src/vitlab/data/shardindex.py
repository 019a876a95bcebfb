"""The byte-offset index of WebDataset tar shards that carry none: built once from the tar headers (images are
not read, labels are a few bytes) and cached as `_vitlab_index.json` beside the shards, or, when that folder
cannot be written (read-only storage), in the vitlab cache (`$VITLAB_CACHE/shard-index/`).

A cached entry is used only while its shard's size, modification time, inode and content fingerprint (SHA-256 of
its size and first and last 64 KiB: `fingerprint`) are those it was built from: a shard replaced by another of the
same size, even by `cp -p` in place, is indexed again instead of training on its predecessor's labels. The
fingerprint costs two reads per shard at every start (measured: README, "What vitlab promises"); it sees any
replacement by another shard (their first samples differ), not an edit in the middle that keeps the size.

Samples are grouped as WebDataset groups them: consecutive members sharing a key (the member name up to the first
dot of its base name) form one sample, so a key that comes back later is another sample, and a member repeated
within one sample (`a.png` twice) is refused, as WebDataset refuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections import Counter
from pathlib import Path

from vitlab.data.errors import describe_paths, log
from vitlab.data.untrusted import MAX_LABEL_BYTES, check_label_range, parse_json
from vitlab.errors import DataError
from vitlab.files.cache import cache_dir
from vitlab.files.outputs import atomic_write
from vitlab.files.reading import not_regular, read_regular

INDEX_NAME = "_vitlab_index.json"
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp")
_STAMP = ("bytes", "mtime_ns", "inode")  # what a cached entry must match to be used, with its fingerprint
FINGERPRINT_BYTES = 1 << 16  # read from each end of a shard


def fingerprint(path: Path) -> str:
    """SHA-256 of the file's size and its first and last FINGERPRINT_BYTES: what tells one shard from another of
    the same size (their first keys, headers and images differ) at the cost of two small reads."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h = hashlib.sha256(f"vitlab-shard {size}\n".encode())
        h.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()


def _label_of(member_name: str, payload: bytes, where: str) -> int:
    try:
        if member_name.endswith(".cls"):
            label = int(payload.decode().strip())
        else:
            record = parse_json(payload, where)
            label = int(record["label"] if "label" in record else record["cls"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{where}: label {payload[:40]!r} is not a class index; write the index as text") from None
    check_label_range(label, label, where)
    return label


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _member_key(name: str) -> tuple[str, str]:
    """('dir/key', 'ext') of a member name: the key ends at the first dot of the base name."""
    base = name.rsplit("/", 1)[-1]
    key = name[: len(name) - len(base)] + base.split(".", 1)[0]
    return key, base.split(".", 1)[1].lower() if "." in base else ""


def _read_samples(tar: tarfile.TarFile, path: Path, size: int) -> list[tuple[str, dict]]:
    """(key, {"image": (offset, size), "label": int}) per sample, WebDataset's grouping."""
    samples: list[tuple[str, dict]] = []
    key, entry, seen = None, {}, set()
    for member in tar:
        if not member.isfile():
            continue
        name_key, ext = _member_key(member.name)
        if name_key != key:
            key, entry, seen = name_key, {}, set()
            samples.append((key, entry))
        if ext in seen:
            raise DataError(f"{path} holds {member.name} twice in sample {key} (duplicate keys); re-pack the shard "
                            "with one member per name and sample")
        seen.add(ext)
        if member.offset_data + member.size > size:
            raise DataError(f"truncated shard {path}: sample {key} runs past the end of the file; "
                            "re-copy or re-pack the shard")
        if ext in IMAGE_SUFFIXES:
            entry["image"] = (member.offset_data, member.size)
        elif ext in ("cls", "json") and "label" not in entry:
            if member.size > MAX_LABEL_BYTES:
                raise DataError(f"{path} sample {key}: label member {member.name} is {member.size:,} bytes, over "
                                f"vitlab's limit of {MAX_LABEL_BYTES:,} for a label; re-pack the shard")
            entry["label"] = _label_of(member.name, tar.extractfile(member).read(), f"{path} sample {key}")
    return samples


def scan_shard(path: Path) -> dict:
    """Index one shard from its tar headers. DataError naming the shard and sample for a truncated tar, a sample
    without an image or a label, or a member repeated within a sample."""
    why = not_regular(path)
    if why:
        raise DataError(f"{why}; shards must be regular .tar files")
    stamp = _stamp(path)
    try:
        with tarfile.open(path, "r:") as tar:
            samples = _read_samples(tar, path, stamp["bytes"])
    except (tarfile.TarError, EOFError) as err:
        raise DataError(f"truncated or corrupt shard {path}: {err}; re-copy or re-pack the shard") from None
    for key, entry in samples:
        if "image" not in entry:
            raise DataError(f"{path} sample {key} has no image (.{'/.'.join(IMAGE_SUFFIXES)}); re-pack the shard")
        if "label" not in entry:
            raise DataError(f"{path} sample {key} has no label (.cls or .json); re-pack the shard with labels")
    keys = [k for k, _ in samples]
    again = sorted(k for k, n in Counter(keys).items() if n > 1)
    if again:
        log.warning("%s: %d sample key(s) come back after other samples (%s); read as separate samples, as "
                    "WebDataset reads them", path, len(again), describe_paths(again))
    return {**stamp, "fingerprint": fingerprint(path), "keys": keys, "offsets": [e["image"][0] for _, e in samples],
            "sizes": [e["image"][1] for _, e in samples], "labels": [e["label"] for _, e in samples]}


# ---- the cache ------------------------------------------------------------------------------------------------


def fallback_index_path(folder: Path) -> Path:
    """Where the index of a folder that cannot be written goes: the vitlab cache, named by the folder's path."""
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:20]
    return cache_dir() / "shard-index" / f"{digest}.json"


def _read_cache(path: Path) -> dict[str, dict]:
    """The cached entries of one index file; nothing when it is missing, unreadable or not an index."""
    try:
        if not path.is_file():
            return {}
        shards = parse_json(read_regular(path).decode(), str(path)).get("shards", {})
    except (OSError, ValueError, AttributeError):  # DataError (too deep) and JSONDecodeError are ValueErrors
        return {}
    return shards if isinstance(shards, dict) else {}


def _fresh(entry: object, stamp: dict, path: Path) -> bool:
    return (isinstance(entry, dict) and all(entry.get(k) == stamp[k] for k in _STAMP)
            and entry.get("fingerprint") == fingerprint(path))


def _write_cache(folder: Path, cache: dict[str, dict]) -> None:
    """Beside the shards, else in the vitlab cache; read-only everywhere only costs a scan at every start."""
    text = json.dumps({"format": "vitlab-shard-index", "version": 3, "folder": str(folder.resolve()),
                       "shards": cache})
    beside = folder / INDEX_NAME
    try:
        atomic_write(beside, lambda tmp: Path(tmp).write_text(text))
        return
    except OSError as err:
        reason = err.strerror or type(err).__name__
    try:
        other = fallback_index_path(folder)
        other.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(other, lambda tmp: Path(tmp).write_text(text))
        log.info("cannot write %s (%s); the shard index is cached in %s", beside, reason, other)
    except (OSError, ValueError) as err:
        log.warning("cannot cache the shard index of %s (%s beside it; %s in the vitlab cache): the shards are "
                    "indexed again at every start", folder, reason, getattr(err, "strerror", None) or err)


def cached_index(folder: Path, names: list[str]) -> dict[str, dict]:
    """Index entries of `names` (files in `folder`), built once per shard and cached; an entry is rebuilt when its
    shard's size, modification time, inode or fingerprint changed."""
    cache = _read_cache(folder / INDEX_NAME)
    try:
        other = _read_cache(fallback_index_path(folder))
    except ValueError:  # an unusable VITLAB_CACHE: only the index beside the data
        other = {}
    changed = False
    for name in names:
        path = folder / name
        if not path.exists():
            raise DataError(f"missing shard {path}; fix the pattern or the info file")
        why = not_regular(path)
        if why:
            raise DataError(f"{why}; shards must be regular .tar files")
        stamp = _stamp(path)
        if not _fresh(cache.get(name), stamp, path):
            cache[name] = other[name] if _fresh(other.get(name), stamp, path) else scan_shard(path)
            changed = changed or cache[name] is not other.get(name)
    if changed:
        _write_cache(folder, cache)
    return {name: cache[name] for name in names}

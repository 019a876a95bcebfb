"""`pack_shards`: an image folder or a Hugging Face dataset on disk into WebDataset tar shards that vitlab (and any
WebDataset reader) streams.

Each sample is `key.<ext>` holding the original encoded bytes, unchanged, and `key.cls` holding the class
index as text; the key is the source file's `<class>/<name>` (`sample_keys`). Shards are filled in a fixed
random order of the samples (so each shard holds a mix of classes) up to a
byte budget, each written under a temporary name and renamed, and `_info.json` is rewritten after every shard: it
lists only complete shards with their sample counts and every image's byte offset, so reading needs no scan and
a re-run resumes after the last complete shard. Images that do not decode are reported and never packed.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import re
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitlab.data.datasets import scan_with_classes
from vitlab.data.errors import describe_paths, log
from vitlab.data.folder import BOMB, bomb_limit, class_folders, folder_layout, header_problem, scan_split
from vitlab.data.hf_split import hf_split, is_hf_source, open_hf
from vitlab.data.packlock import PackLock
from vitlab.data.shardindex import fingerprint
from vitlab.data.shards import INFO_NAME
from vitlab.data.sources import DECODE_ERRORS, PIXELS_ENV, ImageSplit, decode_rgb, open_image, stratified_holdout
from vitlab.data.untrusted import parse_json
from vitlab.errors import DataError, setting
from vitlab.files.outputs import STORAGE_ERRNOS, atomic_write, refuse_input, refuse_other_run
from vitlab.files.reading import read_regular
from vitlab.progress import progress

PACK_SEED = 0  # the packing order's seed: shards are written in one fixed random order
PENDING = "_pending"  # sidecars of shards completed since _info.json was last written
INFO_EVERY_S = 10.0
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """'1GB' -> 10**9, '256MiB' -> 2**28, '4096' -> 4096 bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"shard size {text!r} is not a size; write e.g. 1GB, 256MB or 512MiB")
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size <= 0:
        raise ValueError(f"shard size must be positive, got {text!r}")
    return size


@dataclass
class PackResult:
    out: Path
    counts: dict[str, int]  # samples packed per split (all shards, kept ones included)
    shards: dict[str, int]  # shards per split
    written: int  # shards written by this run (0: everything was already there)
    skipped: list[str]  # undecodable images, never packed


SHARD_FORMATS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}  # what the shard reader takes, by extension
OVER_BUDGET = "(over the image budget)"  # how a skipped image over the budget is listed


def _decodes(data: bytes) -> str | None:
    """The image format (JPEG, PNG, …) if the bytes decode, BOMB for an image over the image budget, else None."""
    try:
        with open_image(io.BytesIO(data)) as img:
            if img.format == "JPEG":
                img.draft("RGB", (64, 64))  # reduced-size decode still reads every entropy-coded byte
            img.load()
            return img.format or "unknown"
    except Image.DecompressionBombError:
        return BOMB
    except DECODE_ERRORS:
        return None


class _Row:
    """Row `index` of a Hugging Face split, packed as a file is; printed as the row's name."""

    __slots__ = ("split", "index")

    def __init__(self, split: ImageSplit, index: int):
        self.split, self.index = split, index

    def __str__(self) -> str:
        return self.split.describe(self.index)


def _payload(item: str | _Row) -> tuple[bytes | None, str]:
    """(encoded bytes, extension) of a file or row; bytes None when they do not decode (extension BOMB for an
    image over the image budget). Files keep their bytes and extension. Rows keep their bytes, named by their format; a
    format the shard reader does not take (BMP, TIFF, GIF) is stored as lossless PNG of the RGB image the loader
    would make of it."""
    if isinstance(item, str):
        try:
            data = read_regular(item)  # not a FIFO: it would block forever
        except OSError:
            return None, ""
        kind = _decodes(data)
        ext = Path(item).suffix.lower().lstrip(".")
        return (data if kind not in (None, BOMB) else None), BOMB if kind == BOMB else "jpg" if ext == "jpeg" else ext
    try:
        data = item.split.read_bytes(item.index)
    except OSError:  # a row without an image, or one that refers to a file outside the dataset
        return None, ""
    kind = _decodes(data)
    if kind in (None, BOMB) or kind in SHARD_FORMATS:
        return (data if kind not in (None, BOMB) else None), BOMB if kind == BOMB else SHARD_FORMATS.get(kind, "")
    buf = io.BytesIO()
    with decode_rgb(io.BytesIO(data)) as img:
        img.save(buf, format="PNG")
    return buf.getvalue(), "png"


def _hf_splits(src: str, val_fraction: float | None) -> tuple[list[str], dict[str, tuple], list[str]]:
    """(class names, split -> (rows, labels), []) of a Hugging Face source, in row order; a source with one
    split packs it as train."""
    hf = open_hf(src)
    train = hf_split(hf, "train", lenient=True)
    parts: dict[str, Any] = {"train": train}
    if val_fraction:
        keep, held = stratified_holdout(train.labels, val_fraction, seed=0)
        parts = {"train": train.subset(keep, "train"), "val": train.subset(held, "val")}
    elif hf.has_val and len(hf.splits) > 1:
        parts["val"] = hf_split(hf, "val", train.class_names)
    splits = {k: ([_Row(s, i) for i in range(len(s))], s.labels) for k, s in parts.items()}
    return train.class_names, splits, []


def _source_splits(src: Path, val_fraction: float | None) -> tuple[list[str], dict[str, tuple], list[str]]:
    """(class names, split -> (paths, labels), images unreadable at the header) in the folder reader's order."""
    if is_hf_source(str(src)):
        return _hf_splits(str(src), val_fraction)
    train_dir, val_dir = folder_layout(src)
    names = class_folders(train_dir)
    log.addFilter(_quiet_scan)  # the unreadable files are reported once, with the undecodable ones
    try:
        return _scan(names, train_dir, val_dir, val_fraction)
    finally:
        log.removeFilter(_quiet_scan)


def _quiet_scan(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("skipping")  # pack_shards reports them, with what fails to decode


def _scan(names: list[str], train_dir: Path, val_dir: Path | None, val_fraction: float | None) -> tuple:
    train, bad = scan_split(train_dir, names, "train", strict=False)
    splits = {"train": (train.paths, train.labels)}
    if val_fraction:
        keep, held = stratified_holdout(train.labels, val_fraction, seed=0)
        splits = {"train": ([train.paths[i] for i in keep], train.labels[keep]),
                  "val": ([train.paths[i] for i in held], train.labels[held])}
    elif val_dir is not None:
        val, bad_val = scan_with_classes(val_dir, names, "val", strict=False)
        splits["val"] = (val.paths, val.labels)
        bad += bad_val
    return names, splits, [f"{p} {OVER_BUDGET}" if header_problem(p) == BOMB else p for p in bad]


def _shuffled(paths: list[str], labels: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(paths, labels, source ids) in a seeded random order; a sample's key is its file's name (for rows: its
    id, its position in the source's order), so a packed sample is traced back to its file. A folder lists class
    after class; packed that way, every shard would hold one or two classes and a streamed batch (a few shards
    at a time) would see a handful of classes. WebDataset writers shuffle before writing for the same reason.
    The order is fixed, so a re-run resumes."""
    perm = np.random.RandomState(PACK_SEED).permutation(len(paths))
    return [paths[i] for i in perm], np.asarray(labels)[perm], perm


def _read_info(out: Path, settings: dict) -> dict:
    """The existing info with only the shards still complete on disk; a fresh one when there is none."""
    path = out / INFO_NAME
    if not path.is_file():
        return {"format": "vitlab-shards", "version": 1, **settings, "splits": {}, "index": {}}
    try:
        info = parse_json(read_regular(path).decode(), str(path))
        if not isinstance(info, dict) or not isinstance(info.get("splits"), dict):
            raise TypeError("not a mapping with 'splits'")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as err:
        raise DataError(f"{path} is not the info file of vitlab shards ({str(err).splitlines()[0]}); pack into an "
                        "empty folder or remove it") from None
    differ = [k for k in settings if info.get(k) != settings[k]]
    if differ:  # mixing them would give shards of two packings in one set (--shard-size: other boundaries)
        key = differ[0]
        raise DataError(f"{out} holds shards packed with {key} {info.get(key)!r}, this run asks for "
                        f"{settings[key]!r}; pack into an empty folder, or re-run with the same settings to resume")
    for split in info["splits"].values():
        for k, name in enumerate(split["filenames"]):
            if not _intact(out / name, info["index"].get(name)):
                for field in ("filenames", "shard_lengths", "consumed"):
                    split[field] = split[field][:k]
                break
    return info


def _intact(path: Path, entry: object) -> bool:
    """Whether the shard on disk is the one `entry` recorded: size, and content fingerprint when recorded."""
    if not isinstance(entry, dict) or not path.is_file() or path.stat().st_size != entry.get("bytes"):
        return False
    return "fingerprint" not in entry or fingerprint(path) == entry["fingerprint"]


def _write_shard(path: Path, members: list[tuple[str, bytes, int]]) -> dict:
    """Write (key.ext, bytes, label) samples as one tar; returns its index entry (image data offsets)."""
    entry: dict = {"keys": [], "offsets": [], "sizes": [], "labels": []}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data, label in members:
                key = name.split(".", 1)[0]
                for member, payload in ((name, data), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(member)
                    info.size, info.mode, info.mtime = len(payload), 0o444, 0
                    tar.addfile(info, io.BytesIO(payload))
                    if member == name:  # data starts after the header: total minus the padded payload
                        padded = -(-len(payload) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                        entry["keys"].append(key)
                        entry["offsets"].append(tar.offset - padded)
                        entry["sizes"].append(len(payload))
                        entry["labels"].append(int(label))

    atomic_write(path, write)
    entry["bytes"] = path.stat().st_size
    entry["fingerprint"] = fingerprint(path)  # a shard replaced later is told apart (data.shards checks it)
    return entry


_KEY_UNSAFE = re.compile(r"[.\\\s]")  # a key ends at its first dot (WebDataset); no separators or spaces inside
_MAX_KEY = 90  # USTAR names: 100 bytes, with room for the extension


def sample_keys(items: list, ids: np.ndarray, split: str) -> list[str]:
    """The WebDataset key of each sample: a file keeps its name, `<class folder>/<file name>` without the
    extension (dots, spaces and backslashes as `_`), so that a packed sample is traced back to its file by eye;
    a name taken twice, too long for a tar header, or a Hugging Face row gets `<split>_<source id>`."""
    width = len(str(len(items)))
    keys, taken = [], set()
    for item, source_id in zip(items, ids, strict=True):
        key = None
        if isinstance(item, str):
            path = Path(item)
            key = f"{_KEY_UNSAFE.sub('_', path.parent.name)}/{_KEY_UNSAFE.sub('_', path.stem)}"
            if key in taken or len(key.encode()) > _MAX_KEY:
                key = None
        key = key or f"{split}_{int(source_id):0{width}d}"
        taken.add(key)
        keys.append(key)
    return keys


def _pack_split(recorder: _Recorder, name: str, paths: list[str], labels: np.ndarray, ids: np.ndarray,
                shard_size: int, bar, bad: list[str]) -> int:
    """Pack one split after its complete shards; returns the number of shards written."""
    split = recorder.info["splits"].setdefault(name, {"filenames": [], "shard_lengths": [], "consumed": []})
    split.setdefault("name", name)  # timm's WebDataset reader needs it
    start = sum(split["consumed"])  # source images covered by complete shards (the packing order is fixed)
    bar.update(start)
    written, members, used = 0, [], 0
    keys = sample_keys(paths, ids, name)  # for all of the split: a resumed run names its samples alike
    for i in range(start, len(paths)):
        data, ext = _payload(paths[i])
        bar.update(1)
        if data is None:
            bad.append(f"{paths[i]} {OVER_BUDGET}" if ext == BOMB else str(paths[i]))
            continue
        members.append((f"{keys[i]}.{ext}", data, int(labels[i])))
        used += len(data) + 3 * tarfile.BLOCKSIZE  # two headers and the padding, roughly
        if used >= shard_size:
            recorder.add(name, members, i + 1 - start)
            start, members, used, written = i + 1, [], 0, written + 1
    if members:
        recorder.add(name, members, len(paths) - start)
        written += 1
    return written


class _Recorder:
    """Records complete shards: at once in a small sidecar (`_pending/<shard>.json`, what a resume trusts), and
    in `_info.json` at most every INFO_EVERY_S seconds and at the end, since rewriting the whole index after
    every shard would make packing quadratic in the number of shards."""

    def __init__(self, out: Path, info: dict):
        self.out, self.info, self.saved_at = out, info, time.monotonic()

    def add(self, name: str, members: list, consumed: int) -> None:
        """Write a shard covering `consumed` source images (bad ones left out) and record it as complete."""
        split = self.info["splits"][name]
        filename = f"{name}-{len(split['filenames']):06d}.tar"
        entry = _write_shard(self.out / filename, members)
        record = json.dumps({"entry": entry, "length": len(members), "consumed": consumed})
        atomic_write(self.out / PENDING / f"{filename}.json", lambda tmp: Path(tmp).write_text(record))
        _append(self.info, name, filename, entry, len(members), consumed)
        if time.monotonic() - self.saved_at >= INFO_EVERY_S:
            self.save()

    def save(self) -> None:
        text = json.dumps(self.info)
        atomic_write(self.out / INFO_NAME, lambda tmp: Path(tmp).write_text(text))
        self.saved_at = time.monotonic()


def _append(info: dict, name: str, filename: str, entry: dict, length: int, consumed: int) -> None:
    split = info["splits"].setdefault(name, {"name": name, "filenames": [], "shard_lengths": [], "consumed": []})
    info["index"][filename] = entry
    split["filenames"].append(filename)
    split["shard_lengths"].append(length)
    split["consumed"].append(consumed)
    split["num_samples"] = sum(split["shard_lengths"])


def _adopt_pending(out: Path, info: dict, split_names: list[str]) -> None:
    """Shards completed after the last `_info.json` write: taken in order while their sidecar and tar agree."""
    for name in split_names:
        split = info["splits"].get(name, {"filenames": []})
        while True:
            filename = f"{name}-{len(split['filenames']):06d}.tar"
            try:
                record = parse_json(read_regular(out / PENDING / f"{filename}.json").decode(), filename)
                complete = _intact(out / filename, record["entry"])
            except (OSError, ValueError, KeyError, TypeError):  # ValueError: not JSON, or too deep
                complete = False
            if not complete:
                break
            _append(info, name, filename, record["entry"], record["length"], record["consumed"])
            split = info["splits"][name]


def pack_shards(src: str | Path, out: str | Path, shard_size: int = 10**9,
                val_fraction: float | None = None) -> PackResult:
    """Pack the image folder `src` (root/<class>/ or root/train|val/<class>/) or the Hugging Face dataset `src`
    (a save_to_disk folder or Parquet, `#image=…,label=…` choosing columns) into shards in `out`."""
    if not str(src).strip() or not str(out).strip():
        raise DataError(f"{'SRC' if not str(src).strip() else 'OUT'} is empty; name the image folder or Hugging Face "
                        "dataset to pack and the folder the shards go to")
    src, out = Path(src), Path(out)
    refuse_input(out, (src,))  # shards inside the folder they pack would be read as its images next time
    refuse_other_run(out / INFO_NAME, folder=out)  # nor inside a run or sweep (its checkpoints/, the run itself)
    if val_fraction is not None and not 0.0 < val_fraction < 1.0:
        raise DataError(f"{setting('val_fraction')} must be in (0, 1), got {val_fraction}")
    names, splits, bad = _source_splits(src, val_fraction)
    try:
        return _pack(src, out, names, splits, bad, shard_size, val_fraction)
    except OSError as err:  # full disk, read-only or vanished target: every shard written so far is complete
        fix = STORAGE_ERRNOS.get(err.errno or 0, "check that OUT's folders exist (a folder removed or a link broken "
                                 "on the way) or choose another OUT")
        raise DataError(f"cannot write the shards to {out}: {err.strerror or err} ({_errno_name(err)}); {fix}, then "
                        "re-run to resume after the last complete shard") from None


def _errno_name(err: OSError) -> str:
    return errno.errorcode.get(err.errno, type(err).__name__) if err.errno else type(err).__name__


def _pack(src: Path, out: Path, names: list[str], splits: dict, bad: list[str], shard_size: int,
          val_fraction: float | None) -> PackResult:
    splits = {k: _shuffled(paths, labels) for k, (paths, labels) in splits.items()}  # (paths, labels, ids)
    out.mkdir(parents=True, exist_ok=True)
    with PackLock(out):  # one packer per folder
        return _pack_locked(src, out, names, splits, bad, shard_size, val_fraction)


def _pack_locked(src: Path, out: Path, names: list[str], splits: dict, bad: list[str], shard_size: int,
                 val_fraction: float | None) -> PackResult:
    settings = {"source": str(src.resolve()), "shard_size": shard_size, "val_fraction": val_fraction,
                "class_names": names, "order": f"shuffled, seed {PACK_SEED}"}
    fresh = not (out / INFO_NAME).is_file()
    info = _read_info(out, settings)
    _adopt_pending(out, info, list(splits))
    recorder = _Recorder(out, info)
    if fresh:  # the settings on disk before the first shard: a re-run with others is refused, never mixed in
        recorder.save()
    total = sum(len(p) for p, _, _ in splits.values())
    written = 0
    with progress(total=total, desc="packing", unit="img") as bar:
        for name, (paths, labels, ids) in splits.items():
            written += _pack_split(recorder, name, paths, labels, ids, shard_size, bar, bad)
    recorder.save()
    shutil.rmtree(out / PENDING, ignore_errors=True)  # everything is in _info.json now
    if bad:
        bombs = sum(p.endswith(OVER_BUDGET) for p in bad)
        over = f" ({bombs} over the image budget of {bomb_limit()}: {PIXELS_ENV} raises it)" if bombs else ""
        log.warning("skipped %d undecodable image(s)%s, not packed: %s", len(bad), over, describe_paths(bad))
    return PackResult(out, {k: v["num_samples"] for k, v in info["splits"].items()},
                      {k: len(v["filenames"]) for k, v in info["splits"].items()}, written, bad)


__all__ = ["PackResult", "pack_shards", "parse_size"]

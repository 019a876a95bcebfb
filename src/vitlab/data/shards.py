"""WebDataset tar shards as a data source: a folder with `_info.json` (vitlab's `vitlab shards` output, or
timm's with split names and shard lengths), a folder of `.tar` files, or a brace pattern
`/data/train-{000000..000009}.tar`.

A sample is the tar members sharing a key (the member name up to its first dot): `key.jpg|jpeg|png|webp` holds
the encoded image and `key.cls` (or `key.json` with a `label` field) its class index. Reading sample i opens its
shard, seeks to the image's byte offset and decodes only those bytes, so start-up reads one index (JSON) and
never touches the samples. vitlab's `_info.json` carries that index; for other shards it is built once by
reading tar headers (and the few-byte labels) and cached beside the data as `_vitlab_index.json`.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..outputs import atomic_write
from .errors import DataError
from .sources import ImageSplit, relabel_by_name

INFO_NAME = "_info.json"
INFO_NAMES = (INFO_NAME, "_info.yaml", "_info.yml")  # timm's wds datasets ship either; vitlab writes JSON
INDEX_NAME = "_vitlab_index.json"
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp")
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


@dataclass
class ShardSplit(ImageSplit):
    """An ImageSplit whose images are byte ranges inside tar shards (`paths` and `arrays` stay None)."""

    shards: list[str] = field(default_factory=list)  # shard file paths
    shard_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # (N,) index into shards
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (N,) image data offset
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (N,) image data bytes
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, "U1"))  # (N,) sample keys, for messages
    # numpy, not lists: loader workers receive the split pickled, and millions of Python objects are slow to send

    def describe(self, i: int) -> str:
        return f"{self.shards[self.shard_of[i]]}:{self.keys[i]}"

    def read_bytes(self, i: int) -> bytes:
        """The encoded image of sample i, unchanged. OSError (a decode error to the loader) if the shard ends
        early: the loader then substitutes or skips it as it does an unreadable file."""
        with open(self.shards[self.shard_of[i]], "rb") as f:
            f.seek(int(self.offsets[i]))
            data = f.read(int(self.sizes[i]))
        if len(data) != self.sizes[i]:
            raise OSError(f"truncated shard: {self.describe(i)} ends {self.sizes[i] - len(data)} bytes early")
        return data

    def encoded(self, i: int) -> io.BytesIO:
        return io.BytesIO(self.read_bytes(i))

    def storage_blocks(self) -> np.ndarray:
        """Runs of consecutive samples in one shard: the shards, or what a subset kept of them."""
        if not len(self.shard_of):
            return np.zeros(0, np.int64)
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(self.shard_of)) + 1, [len(self.shard_of)]])
        return np.diff(bounds)

    def holdout(self, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Whole shards for --val-fraction (round(fraction x shards), at least one, never all), drawn with
        `seed`: training keeps streaming whole shards and the held-out split reads whole shards. `vitlab
        shards` writes samples in a shuffled order, so a shard is a random sample of the classes. Under two
        shards, a stratified share of each class instead."""
        blocks = self.storage_blocks()
        if len(blocks) < 2:
            return super().holdout(fraction, seed)
        n_held = min(max(1, round(fraction * len(blocks))), len(blocks) - 1)
        held_blocks = np.zeros(len(blocks), bool)
        held_blocks[np.random.RandomState(seed).permutation(len(blocks))[:n_held]] = True
        held = np.repeat(held_blocks, blocks)
        return np.flatnonzero(~held), np.flatnonzero(held)

    def describe_holdout(self, fraction: float, seed: int = 0) -> str:
        blocks = self.storage_blocks()
        if len(blocks) < 2:
            return super().describe_holdout(fraction, seed)
        held = len(self) - len(self.holdout(fraction, seed)[0])
        return (f"{min(max(1, round(fraction * len(blocks))), len(blocks) - 1)} of {len(blocks)} shards "
                f"({held} images) held out from the train split (whole shards, seed {seed}")

    def subset(self, indices: np.ndarray, name: str) -> ShardSplit:
        return ShardSplit(name, self.labels[indices], self.class_names, strict=self.strict, shards=self.shards,
                          shard_of=self.shard_of[indices], offsets=self.offsets[indices],
                          sizes=self.sizes[indices], keys=self.keys[indices])


def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar (zero padding kept; several ranges multiply)."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    lo, hi = int(m.group(1)), int(m.group(2))
    if hi < lo:
        raise DataError(f"empty brace range {m.group(0)} in {pattern}; write {{low..high}}")
    width = len(m.group(1))
    head, tail = pattern[: m.start()], pattern[m.end():]
    return [p for k in range(lo, hi + 1) for p in expand_braces(f"{head}{k:0{width}d}{tail}")]


def is_shard_source(data: str) -> bool:
    """A brace pattern or single .tar, a folder with _info.json, or a folder holding .tar files only."""
    if data.endswith(".tar") or _BRACE.search(data):
        return True
    root = Path(data)
    if not root.is_dir():
        return False
    if info_file(root) is not None:
        return True
    return not (root / "train").is_dir() and any(root.glob("*.tar"))


# ---- the index: per shard, its samples' keys, image offsets/sizes and labels --------------------------------


def _label_of(member_name: str, payload: bytes, where: str) -> int:
    try:
        if member_name.endswith(".cls"):
            return int(payload.decode().strip())
        record = json.loads(payload)
        return int(record["label"] if "label" in record else record["cls"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise DataError(f"{where}: label {payload[:40]!r} is not a class index; write the index as text") from None


def scan_shard(path: Path) -> dict:
    """Index one shard from its tar headers (images are not read, labels are a few bytes). DataError naming the
    shard and sample for a truncated tar or a sample without an image or a label."""
    samples: dict[str, dict] = {}
    size = path.stat().st_size
    last = "(start)"
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                key = member.name[: len(member.name) - len(base)] + base.split(".", 1)[0]
                ext = base.split(".", 1)[1].lower() if "." in base else ""
                last = key
                entry = samples.setdefault(key, {})
                if member.offset_data + member.size > size:
                    raise DataError(f"truncated shard {path}: sample {key} runs past the end of the file; "
                                    "re-copy or re-pack the shard")
                if ext in IMAGE_SUFFIXES:
                    entry["image"] = (member.offset_data, member.size)
                elif ext in ("cls", "json") and "label" not in entry:
                    entry["label"] = _label_of(base, tar.extractfile(member).read(), f"{path} sample {key}")
    except (tarfile.TarError, EOFError) as err:
        raise DataError(f"truncated or corrupt shard {path} after sample {last}: {err}; re-copy or re-pack "
                        "the shard") from None
    keys, offsets, sizes, labels = [], [], [], []
    for key, entry in samples.items():
        if "image" not in entry:
            raise DataError(f"{path} sample {key} has no image (.{'/.'.join(IMAGE_SUFFIXES)}); re-pack the shard")
        if "label" not in entry:
            raise DataError(f"{path} sample {key} has no label (.cls or .json); re-pack the shard with labels")
        keys.append(key)
        offsets.append(entry["image"][0])
        sizes.append(entry["image"][1])
        labels.append(entry["label"])
    return {"bytes": size, "keys": keys, "offsets": offsets, "sizes": sizes, "labels": labels}


def _cached_index(folder: Path, names: list[str]) -> dict[str, dict]:
    """Index entries of `names` (files in `folder`), built once per shard and cached in _vitlab_index.json; an
    entry is rebuilt when its shard's size changed."""
    cache_path = folder / INDEX_NAME
    cache: dict[str, dict] = {}
    if cache_path.is_file():
        try:
            cache = json.loads(cache_path.read_text()).get("shards", {})
        except (OSError, json.JSONDecodeError, AttributeError):
            cache = {}
    changed = False
    for name in names:
        path = folder / name
        if not path.is_file():
            raise DataError(f"missing shard {path}; fix the pattern or the info file")
        if name not in cache or cache[name].get("bytes") != path.stat().st_size:
            cache[name] = scan_shard(path)
            changed = True
    if changed:
        text = json.dumps({"format": "vitlab-shard-index", "version": 1, "shards": cache})
        atomic_write(cache_path, lambda tmp: Path(tmp).write_text(text))
    return {name: cache[name] for name in names}


# ---- shard sets: which shards make which split --------------------------------------------------------------


@dataclass
class ShardSet:
    splits: dict[str, list[Path]]  # split name -> shard paths in order
    entries: dict[Path, dict]  # shard path -> index entry
    class_names: list[str] | None  # None: numbered from the labels


def _split_of(name: str) -> str:
    """The split a shard's file name names (`train-000001.tar`, `imagenet22k-validation-0003.tar`); train when
    it names none."""
    words = set(re.split(r"[-_.]", name.lower()))
    return "val" if words & {"val", "valid", "validation", "test"} else "train"


def info_file(root: Path) -> Path | None:
    """The shard set's info file in `root` (_info.json, else timm's _info.yaml), or None."""
    return next((root / n for n in INFO_NAMES if (root / n).is_file()), None)


def _from_info(root: Path) -> ShardSet:
    try:
        path = info_file(root)
        text = path.read_text()
        info = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        raw_splits = info["splits"]
    except (OSError, json.JSONDecodeError, yaml.YAMLError, KeyError, TypeError) as err:
        raise DataError(f"{path} is not a shard info file ({str(err).splitlines()[0]}); re-run vitlab shards "
                        "or fix the file") from None
    splits: dict[str, list[Path]] = {}
    for name, split in raw_splits.items():
        files = split.get("filenames") or split.get("shards") or []
        splits[{"validation": "val", "test": "val"}.get(name, name)] = [root / f for f in files]
    index = info.get("index")
    names = [p.name for paths in splits.values() for p in paths]
    entries = index if index is not None and all(n in index for n in names) else _cached_index(root, names)
    for split in raw_splits.values():  # timm's info records shard lengths: they must agree with the data
        for f, n in zip(split.get("filenames") or [], split.get("shard_lengths") or [], strict=False):
            if len(entries[f]["keys"]) != n:
                raise DataError(f"{root / f} holds {len(entries[f]['keys'])} samples, {path.name} says {n}; "
                                "the shard is incomplete: re-copy it")
    names_info = info.get("class_names") or info.get("label_names")
    return ShardSet(splits, {root / n: entries[n] for n in names}, names_info)


def open_shard_set(data: str) -> ShardSet:
    root = Path(data)
    if root.is_dir() and info_file(root) is not None:
        return _from_info(root)
    if root.is_dir():
        files = sorted(root.glob("*.tar"))
    else:
        files = [Path(p) for p in expand_braces(data)]
    if not files:
        raise DataError(f"no .tar shards in {data}; pass a folder of shards or a pattern like train-{{000..009}}.tar")
    splits: dict[str, list[Path]] = {}
    for f in files:
        splits.setdefault(_split_of(f.name), []).append(f)
    entries: dict[Path, dict] = {}
    by_folder: dict[Path, list[str]] = {}
    for f in files:
        by_folder.setdefault(f.parent, []).append(f.name)
    class_names = None
    for folder, names in by_folder.items():
        info = _vitlab_info(folder)  # shards of a `vitlab shards` folder picked by a pattern: its index and names
        if info is not None and all(n in info["index"] for n in names):
            entries.update({folder / n: info["index"][n] for n in names})
            class_names = class_names or info.get("class_names")
        else:
            entries.update({folder / n: e for n, e in _cached_index(folder, names).items()})
    return ShardSet(splits, entries, class_names)


def _vitlab_info(folder: Path) -> dict | None:
    try:
        info = json.loads((folder / INFO_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("index"), dict) else None


def _check_sizes(paths: list[Path], entries: dict[Path, dict]) -> None:
    """One stat per shard: a shard shorter than its index says was truncated after indexing."""
    for p in paths:
        if not p.is_file():
            raise DataError(f"missing shard {p}; re-copy it or re-run vitlab shards")
        if p.stat().st_size < entries[p]["bytes"]:
            raise DataError(f"truncated shard {p}: {p.stat().st_size} bytes, its index says {entries[p]['bytes']}; "
                            "re-copy or re-pack it")


def shard_split(shard_set: ShardSet, split: str, class_names: list[str] | None = None,
                strict: bool = False) -> ShardSplit:
    """The named split as a ShardSplit; `class_names` (the training split's or a model's) label it."""
    if split not in shard_set.splits:
        raise DataError(f"missing split: the shards have no {split} split (found {', '.join(shard_set.splits)}); "
                        "hold out part of train with --val-fraction 0.1")
    paths = shard_set.splits[split]
    _check_sizes(paths, shard_set.entries)
    entries = [shard_set.entries[p] for p in paths]
    labels = np.array([v for e in entries for v in e["labels"]], dtype=np.int64)
    labels = relabel_by_name(labels, shard_set.class_names, class_names, "the shards")
    names = class_names or shard_set.class_names
    if names is None:
        top = max((max(e["labels"], default=-1) for e in shard_set.entries.values()), default=-1)
        names = [str(k) for k in range(top + 1)]  # no names recorded: the class indices, over all splits
    if len(labels) and (labels.min() < 0 or labels.max() >= len(names)):
        raise DataError(f"shard labels reach {int(labels.max())} but there are {len(names)} classes; "
                        "check the shards' .cls files")
    return ShardSplit(
        split, labels, list(names), strict=strict, shards=[str(p) for p in paths],
        shard_of=np.concatenate([np.zeros(0, np.int32)] + [np.full(len(e["keys"]), k, np.int32)
                                                           for k, e in enumerate(entries)]),
        offsets=np.array([v for e in entries for v in e["offsets"]], dtype=np.int64),
        sizes=np.array([v for e in entries for v in e["sizes"]], dtype=np.int64),
        keys=np.array([k for e in entries for k in e["keys"]], dtype=str),
    )


__all__ = ["ShardSet", "ShardSplit", "expand_braces", "is_shard_source", "open_shard_set", "scan_shard",
           "shard_split"]

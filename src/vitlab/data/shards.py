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
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from vitlab.data import shardindex
from vitlab.data.folder import compressed_advice, is_compressed_tar
from vitlab.data.shardindex import INDEX_NAME
from vitlab.data.sources import ImageSplit, relabel_by_name, run_lengths
from vitlab.data.untrusted import MAX_PATTERN_FILES, check_label_range, contained, parse_json, parse_yaml
from vitlab.errors import DataError, setting
from vitlab.files.reading import NotRegularFile, read_text_regular

INFO_NAME = "_info.json"
INFO_NAMES = (INFO_NAME, "_info.yaml", "_info.yml")  # timm's wds datasets ship either; vitlab writes JSON
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
        return run_lengths(self.shard_of)

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
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar (zero padding kept; several ranges multiply). A
    pattern naming more than MAX_PATTERN_FILES files is refused before any name is made."""
    count = 1
    for m in _BRACE.finditer(pattern):
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo:
            raise DataError(f"empty brace range {m.group(0)} in {pattern}; write {{low..high}}")
        count *= hi - lo + 1
        if count > MAX_PATTERN_FILES:
            raise DataError(f"the brace pattern {pattern} names more than vitlab's limit of {MAX_PATTERN_FILES:,} "
                            "files; check the range or pass the folder instead")
    return _expand(pattern)


def _expand(pattern: str) -> list[str]:
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    lo, hi, width = int(m.group(1)), int(m.group(2)), len(m.group(1))
    head, tail = pattern[: m.start()], pattern[m.end():]
    return [p for k in range(lo, hi + 1) for p in _expand(f"{head}{k:0{width}d}{tail}")]


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
    return next((root / n for n in INFO_NAMES if (root / n).exists()), None)  # a FIFO there is refused, not skipped


def _read_info(path: Path) -> dict:
    """An info file parsed within bounds (nesting, YAML aliases) and checked to be a mapping with `splits`."""
    try:
        text = read_text_regular(path)
        info = parse_json(text, str(path)) if path.suffix == ".json" else parse_yaml(text, str(path))
        if not isinstance(info, dict) or not isinstance(info["splits"], dict):
            raise TypeError("not a mapping with a 'splits' mapping")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError, KeyError, TypeError) as err:
        raise DataError(f"{path} is not a shard info file ({str(err).splitlines()[0]}); re-run vitlab shards "
                        "or fix the file") from None
    return info


def _listed_shards(root: Path, path: Path, name: str, split: object) -> list[str]:
    """The shard file names one split of an info file lists, each a plain name inside `root`."""
    files = (split.get("filenames") or split.get("shards") or []) if isinstance(split, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise DataError(f"{path}: split {name!r} does not list shard file names; re-run vitlab shards or fix it")
    for f in files:
        if contained(f, root) is None:
            raise DataError(f"{path} names a shard outside its folder ({f}); a shard set's files stay in {root}")
    return files


def _check_listed_once(path: Path, names: list[str]) -> None:
    twice = {n: k for n, k in Counter(names).items() if k > 1}
    if twice:
        first = next(iter(twice))
        raise DataError(f"{path} lists shard {first} {twice[first]} times ({len(twice)} shard(s) listed more than "
                        "once): its samples would count several times; list each shard once")


def _class_names(path: Path, info: dict) -> list[str] | None:
    names = info.get("class_names") or info.get("label_names")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) < len(names):
        raise DataError(f"{path}: class_names is not a list of distinct names; re-run vitlab shards or fix it")
    check_label_range(0, len(names) - 1, f"{path}: class_names")
    return names


def _from_info(root: Path) -> ShardSet:
    path = info_file(root)
    info = _read_info(path)
    raw_splits = info["splits"]
    splits: dict[str, list[Path]] = {}
    for name, split in raw_splits.items():
        splits[{"validation": "val", "test": "val"}.get(name, name)] = [
            root / f for f in _listed_shards(root, path, name, split)]
    names = [p.name for paths in splits.values() for p in paths]
    _check_listed_once(path, [os.path.normpath(p) for paths in splits.values() for p in paths])
    index = info.get("index")
    entries = (index if isinstance(index, dict) and all(n in index for n in names)
               else shardindex.cached_index(root, names))
    for split in raw_splits.values():  # timm's info records shard lengths: they must agree with the data
        for f, n in zip(split.get("filenames") or [], split.get("shard_lengths") or [], strict=False):
            held = len(_entry_arrays(root / f, entries[f]).keys)
            if held != n:
                raise DataError(f"{root / f} holds {held} samples, {path.name} says {n}; "
                                "the shard is incomplete: re-copy it")
    return ShardSet(splits, {root / n: entries[n] for n in names}, _class_names(path, info))


def open_shard_set(data: str) -> ShardSet:
    root = Path(data)
    if root.is_dir() and info_file(root) is not None:
        return _from_info(root)
    if root.is_dir():
        files = sorted(root.glob("*.tar"))
    else:
        files = [Path(p) for p in expand_braces(data)]
    compressed = [f for f in files if is_compressed_tar(f.name)]
    if compressed:
        raise DataError(compressed_advice(compressed[0]))
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
            entries.update({folder / n: e for n, e in shardindex.cached_index(folder, names).items()})
    return ShardSet(splits, entries, class_names)


def _vitlab_info(folder: Path) -> dict | None:
    try:
        info = parse_json(read_text_regular(folder / INFO_NAME), str(folder / INFO_NAME))
    except NotRegularFile as err:
        raise DataError(f"{err}; a shard folder's {INFO_NAME} is a file vitlab reads") from None
    except (OSError, UnicodeDecodeError, ValueError):  # JSONDecodeError and too deep (DataError) are ValueErrors
        return None
    return info if isinstance(info, dict) and isinstance(info.get("index"), dict) else None


def _check_shards(paths: list[Path], entries: dict[Path, dict]) -> None:
    """One stat and, where the index records one, a fingerprint per shard: a shard shorter than its index says was
    truncated after indexing; one whose first or last 64 KiB differ was replaced (`cp train-5.tar train-0.tar`
    would otherwise read 5's images under 0's labels). Indexes written before fingerprints get the size check."""
    for p in paths:
        if not p.is_file():
            raise DataError(f"missing shard {p}; re-copy it or re-run vitlab shards")
        if p.stat().st_size < entries[p]["bytes"]:
            raise DataError(f"truncated shard {p}: {p.stat().st_size} bytes, its index says {entries[p]['bytes']}; "
                            "re-copy or re-pack it")
        expected = entries[p].get("fingerprint")
        if expected is not None and shardindex.fingerprint(p) != expected:
            raise DataError(f"shard {p} is not the shard its index describes (its content differs: replaced or "
                            "modified after packing); restore it, or re-pack the shards into a new folder")


@dataclass
class _Arrays:
    """One shard's index entry as checked arrays."""

    keys: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray


def _entry_arrays(path: Path, entry: dict) -> _Arrays:
    """The entry's lists as arrays, refused in one line unless they have one value per sample and every image
    lies inside the shard: an index is read from the data folder, and a crafted size would be allocated."""
    try:
        if not isinstance(entry, dict):
            raise TypeError("not a mapping")
        arrays = _Arrays(np.asarray(entry["keys"], dtype=str), np.asarray(entry["offsets"], dtype=np.int64),
                         np.asarray(entry["sizes"], dtype=np.int64), np.asarray(entry["labels"], dtype=np.int64))
        total = int(entry["bytes"])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise DataError(f"the index of {path} is not a shard index (keys, offsets, sizes, labels); delete "
                        f"{path.parent / INDEX_NAME} or re-run vitlab shards") from None
    n = len(arrays.keys)
    ok = all(a.ndim == 1 and len(a) == n for a in (arrays.offsets, arrays.sizes, arrays.labels))
    if not ok or (n and (arrays.offsets.min() < 0 or arrays.sizes.min() < 0
                         or (arrays.offsets + arrays.sizes).max() > total)):
        raise DataError(f"the index of {path} does not fit the shard (samples outside its {total} bytes or lists of "
                        "different lengths); re-run vitlab shards or delete the index to rebuild it")
    if n:
        low, high = int(arrays.labels.argmin()), int(arrays.labels.argmax())
        check_label_range(int(arrays.labels[low]), 0, f"{path} sample {arrays.keys[low]}")
        check_label_range(0, int(arrays.labels[high]), f"{path} sample {arrays.keys[high]}")
    return arrays


def shard_split(shard_set: ShardSet, split: str, class_names: list[str] | None = None,
                strict: bool = False) -> ShardSplit:
    """The named split as a ShardSplit; `class_names` (the training split's or a model's) label it."""
    if split not in shard_set.splits:
        raise DataError(f"missing split: the shards have no {split} split (found {', '.join(shard_set.splits)}); "
                        f"hold out part of train with {setting('val_fraction', value=0.1)}")
    paths = shard_set.splits[split]
    arrays = [_entry_arrays(p, shard_set.entries[p]) for p in paths]  # before any value of an entry is used
    _check_shards(paths, shard_set.entries)
    labels = np.concatenate([np.zeros(0, np.int64)] + [a.labels for a in arrays])
    keys = np.concatenate([np.zeros(0, str)] + [a.keys for a in arrays])
    shard_of = np.concatenate([np.zeros(0, np.int32)] + [np.full(len(a.keys), k, np.int32)
                                                         for k, a in enumerate(arrays)])
    labels = relabel_by_name(labels, shard_set.class_names, class_names, "the shards")
    names = class_names or shard_set.class_names
    if names is None:  # no names recorded: the class indices, over all splits (each checked against MAX_CLASSES)
        top = max((int(_entry_arrays(p, e).labels.max(initial=-1)) for p, e in shard_set.entries.items()), default=-1)
        names = [str(k) for k in range(top + 1)]
    if len(labels) and labels.max() >= len(names):
        k = int(labels.argmax())
        raise DataError(f"{paths[shard_of[k]]} sample {keys[k]} has label {int(labels[k])} but there are "
                        f"{len(names)} classes (0..{len(names) - 1}); check the shards' .cls files")
    return ShardSplit(
        split, labels, list(names), strict=strict, shards=[str(p) for p in paths], shard_of=shard_of,
        offsets=np.concatenate([np.zeros(0, np.int64)] + [a.offsets for a in arrays]),
        sizes=np.concatenate([np.zeros(0, np.int64)] + [a.sizes for a in arrays]), keys=keys,
    )


scan_shard = shardindex.scan_shard

__all__ = ["INDEX_NAME", "ShardSet", "ShardSplit", "expand_braces", "is_shard_source", "open_shard_set",
           "scan_shard", "shard_split"]

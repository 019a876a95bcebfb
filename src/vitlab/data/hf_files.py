"""The files of a Hugging Face dataset on disk: where it keeps its splits, opened as memory-mapped Arrow.

Accepted: a `save_to_disk` folder (one Dataset, or a DatasetDict with a folder per split), a `.parquet` file, a
folder of Parquet files (the Hub's `data/train-00000-of-00003.parquet`, `train-*.parquet` or
`<split>/*.parquet`) or a brace pattern of Parquet files. Parquet is converted to Arrow once by the `datasets`
library (beside the data in `_vitlab_arrow/` when that folder is writable, else in the Hugging Face datasets
cache) and memory-mapped from then on. `datasets` is imported only here, and only when such a source is read.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.data.errors import log
from vitlab.data.shards import expand_braces
from vitlab.data.untrusted import contained, parse_json
from vitlab.errors import DataError, setting
from vitlab.files.reading import read_text_regular
from vitlab.progress import bars_enabled

NEEDS_DATASETS = "reading Hugging Face datasets needs the datasets package: pip install 'vitlab[hf]'"
CACHE_NAME = "_vitlab_arrow"  # Parquet converted to Arrow, beside the data
COLUMN_KEYS = ("image", "label")
VAL_NAMES = ("validation", "valid", "val", "dev")  # the split vitlab calls val; `test` when there is none
_HUB_FILE = re.compile(r"^([A-Za-z0-9_]+?)-\d+-of-\d+")  # train-00000-of-00003[-hash].parquet


def import_datasets() -> Any:
    """The `datasets` package, imported only when a Hugging Face source is read (it takes a second)."""
    try:
        import datasets
    except ImportError:
        raise DataError(NEEDS_DATASETS) from None
    return datasets


@contextmanager
def _bars(hf: Any):
    """The `datasets` progress bars follow vitlab's: shown on a terminal only, never under -q."""
    hide = not bars_enabled() and not hf.are_progress_bars_disabled()
    if hide:
        hf.disable_progress_bars()
    try:
        yield
    finally:
        if hide:
            hf.enable_progress_bars()


def split_columns(data: str) -> tuple[str, dict[str, str]]:
    """'/data/cifar#image=img,label=fine_label' -> ('/data/cifar', {'image': 'img', 'label': 'fine_label'})."""
    path, sep, spec = data.rpartition("#")
    if not sep:
        return data, {}
    columns = {}
    for item in spec.split(","):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not value:
            raise DataError(f"{data}: {item!r} is not KEY=COLUMN; write e.g. {path}#image=img,label=fine_label")
        if key not in COLUMN_KEYS:
            raise DataError(f"{data}: unknown key {key!r}; the keys are {' and '.join(COLUMN_KEYS)}")
        columns[key] = value
    return path, columns


# ---- layouts: which files hold which split ------------------------------------------------------------------


def _is_disk_dataset(root: Path) -> bool:
    """A `save_to_disk` folder: a DatasetDict, or a Dataset (its info, its state, its Arrow files)."""
    return (root / "dataset_dict.json").is_file() or (
        (root / "dataset_info.json").is_file() and (root / "state.json").is_file() and any(root.glob("*.arrow")))


def _parquet_files(root: Path) -> list[Path]:
    """Parquet files of the Hub's layouts: root/*.parquet, root/data/*.parquet, root/<split>/*.parquet."""
    folders = [root, root / "data", *(root / s for s in ("train", "test", *VAL_NAMES))]
    return [f for d in folders for f in sorted(d.glob("*.parquet"))]


def is_hf_source(data: str) -> bool:
    """A `save_to_disk` folder, a Parquet file or brace pattern, or a folder of Parquet files; a `#image=…,
    label=…` suffix chooses columns."""
    path = data.rpartition("#")[0] or data
    if path.endswith(".parquet"):
        return True
    root = Path(path)
    return root.is_dir() and (_is_disk_dataset(root) or bool(_parquet_files(root)))


def _split_of(file: Path, root: Path) -> str:
    """The split a Parquet file belongs to: its folder (root/validation/…), its Hub name
    (validation-00000-of-00001.parquet), a split word in its name, else train."""
    parent = file.parent.name if file.parent != root else ""
    if parent in ("train", "test", *VAL_NAMES):
        return parent
    m = _HUB_FILE.match(file.name)
    if m:
        return m.group(1)
    words = set(re.split(r"[-_.]", file.stem.lower()))
    return "validation" if words & set(VAL_NAMES) else "test" if "test" in words else "train"


def _state_split(root: Path) -> str:
    """The split a single saved Dataset was (`_split` of its state.json, 'train[:10%]' -> 'train'), else train."""
    try:
        name = parse_json(read_text_regular(root / "state.json"), str(root / "state.json")).get("_split") or "train"
    except (OSError, ValueError, AttributeError):  # ValueError: not JSON, or nested too deeply
        name = "train"
    return re.match(r"[A-Za-z0-9_]*", str(name)).group(0) or "train"


@dataclass
class HFSet:
    """A Hugging Face source: its splits by their own names, each a saved Dataset folder or Parquet files."""

    source: str  # the --data string without its #columns part
    columns: dict[str, str]  # chosen columns (#image=…,label=…)
    root: Path  # the folder the data lies in (where a Parquet cache goes)
    splits: dict[str, Path | list[Path]]  # split -> its save_to_disk folder, or its Parquet files
    opened: dict[str, Any] = field(default_factory=dict)  # split -> datasets.Dataset, opened once

    def resolve(self, split: str, lenient: bool = False) -> str:
        """This source's name of vitlab's `split` (val: validation/valid/val/dev, else test). `lenient`: a
        source with one split serves any (like a plain class folder)."""
        if lenient and len(self.splits) == 1:
            return next(iter(self.splits))
        wanted = {"train": ("train",), "val": (*VAL_NAMES, "test"), "test": ("test", *VAL_NAMES)}[split]
        for name in wanted:
            if name in self.splits:
                return name
        raise DataError(f"missing split: {self.source} has no {split} split (found {', '.join(self.splits)}); "
                        f"hold out part of train with {setting('val_fraction', value=0.1)}")

    @property
    def has_val(self) -> bool:
        return any(n in self.splits for n in (*VAL_NAMES, "test"))

    def open(self, split: str) -> Any:
        if split not in self.opened:
            where = self.splits[split]
            self.opened[split] = (_from_parquet(where, self.root, f"{self.source}[{split}]") if isinstance(where, list)
                                  else _load_from_disk(where))
        return self.opened[split]

    def features(self, split: str) -> Any:
        """The split's features; for Parquet from the file's schema, before any conversion."""
        where = self.splits[split]
        if not isinstance(where, list):
            return self.open(split).features
        import pyarrow.parquet as pq

        return import_datasets().Features.from_arrow_schema(pq.read_schema(where[0]))

    def label_values(self, split: str, column: str) -> np.ndarray:
        where = self.splits[split]
        if not isinstance(where, list):
            return int_column(self.open(split).data.column(column))
        import pyarrow.parquet as pq

        return np.concatenate([int_column(pq.read_table(f, columns=[column]).column(column)) for f in where])


def open_hf(data: str) -> HFSet:
    path, columns = split_columns(data)
    root = Path(path)
    if root.is_dir() and (root / "dataset_dict.json").is_file():
        try:
            names = parse_json(read_text_regular(root / "dataset_dict.json"), str(root / "dataset_dict.json"))["splits"]
            if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                raise TypeError("'splits' is not a list of split names")
            if any(contained(n, root) is None for n in names):
                raise TypeError("a split names a folder outside the dataset")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{root / 'dataset_dict.json'} is not a DatasetDict's ({err}); re-save it") from None
        return HFSet(path, columns, root, {n: root / n for n in names})
    if root.is_dir() and _is_disk_dataset(root):
        return HFSet(path, columns, root, {_state_split(root): root})
    files = _parquet_files(root) if root.is_dir() else [Path(p) for p in expand_braces(path)]
    missing = [f for f in files if not f.is_file()]
    if missing or not files:
        raise DataError(f"no Parquet file {missing[0] if missing else path}; pass a save_to_disk folder, a "
                        ".parquet file or pattern, or a folder of Parquet files")
    base = root if root.is_dir() else files[0].parent
    splits: dict[str, Path | list[Path]] = {}
    for f in files:
        splits.setdefault(_split_of(f, base), []).append(f)
    return HFSet(path, columns, base, splits)


# ---- opening: memory-mapped Arrow -----------------------------------------------------------------------------


def _load_from_disk(folder: Path) -> Any:
    hf = import_datasets()
    with _bars(hf):
        try:
            return hf.load_from_disk(str(folder))
        except (OSError, ValueError, json.JSONDecodeError) as err:
            raise DataError(f"{folder} is not a readable save_to_disk folder ({err}); re-save it") from None


def _cache_dir(root: Path) -> str | None:
    """`root/_vitlab_arrow` when it can be written, else None: the Hugging Face datasets cache."""
    cache = root / CACHE_NAME
    try:
        cache.mkdir(exist_ok=True)
    except OSError:
        return None
    return str(cache) if os.access(cache, os.W_OK) else None


def _from_parquet(files: list[Path], root: Path, where: str) -> Any:
    """The Parquet files as one memory-mapped Dataset: converted to Arrow on first use, reused after (the
    cache is keyed by the files, so a changed file is converted again)."""
    hf = import_datasets()
    with _bars(hf):
        try:
            builder = hf.load_dataset_builder("parquet", data_files={"train": [str(f) for f in files]},
                                              cache_dir=_cache_dir(root))
            if not Path(builder.cache_dir).is_dir():
                log.warning("%s: converting Parquet to Arrow once (memory-mapped from then on), cached in %s",
                            where, builder.cache_dir)
            builder.download_and_prepare()
            return builder.as_dataset(split="train")
        except (OSError, ValueError, hf.builder.DatasetGenerationError) as err:  # a corrupt file fails here
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DataError(f"{where}: cannot read the Parquet files ({first}); check or re-copy them") from None


def int_column(column: Any) -> np.ndarray:
    """An Arrow column of class indices as int64 numpy."""
    return np.asarray(column.fill_null(-1).to_numpy(), dtype=np.int64)  # a missing label reads as -1


__all__ = ["CACHE_NAME", "NEEDS_DATASETS", "VAL_NAMES", "HFSet", "import_datasets", "int_column", "is_hf_source",
           "open_hf", "split_columns"]

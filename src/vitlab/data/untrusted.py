"""Reading data files that may be corrupt or crafted: bounds checked before anything is allocated, only regular
files opened, and a dataset's files kept inside its folder.

A data folder is as untrusted as a downloaded file: a label of 10^9 would size a class list of 20 GB, a brace
pattern can name 10^9 files, YAML aliases can expand a 400-byte file to 10^9 values ("billion laughs"), nested
JSON ends in a RecursionError, a FIFO named `x.png` blocks the reader forever, and an image row holding a path
could make vitlab read (and `vitlab shards` copy) any file on the machine. Each of these is refused here with one
line naming the file and the limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from vitlab.errors import DataError

MAX_CLASSES = 1_000_000  # ImageNet-21k has 21,843 classes, JFT-300M 18,291: a larger label is a broken file
MAX_PATTERN_FILES = 1_000_000  # files one brace pattern may name (2,000 shards is a large dataset)
MAX_LABEL_BYTES = 64 * 1024  # a `.cls` / `.json` label member of a tar shard
MAX_YAML_VALUES = 1_000_000  # values an info file may expand to (aliases included)


def parse_json(text: str | bytes, where: str) -> Any:
    """json.loads with nesting too deep for the parser as one line (json.JSONDecodeError passes through)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise DataError(f"{where} is nested too deeply to be a data file (JSON deeper than Python's recursion "
                        "limit); fix or regenerate it") from None


def _expanded_size(value: Any, limit: int) -> int:
    """How many values `value` holds with every alias expanded, counted up to `limit` (no recursion, so a
    deep structure cannot overflow the stack; a shared list counts each time it is reached, as a reader sees it)."""
    count, todo = 0, [value]
    while todo and count <= limit:
        item = todo.pop()
        count += 1
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return count


def parse_yaml(text: str, where: str) -> Any:
    """yaml.safe_load that refuses, in one line, documents nested too deeply or whose aliases expand to more than
    MAX_YAML_VALUES values (yaml.YAMLError passes through)."""
    try:
        value = yaml.safe_load(text)
    except RecursionError:
        raise DataError(f"{where} is nested too deeply to be a data file (YAML deeper than Python's recursion "
                        "limit); fix or regenerate it") from None
    if _expanded_size(value, MAX_YAML_VALUES) > MAX_YAML_VALUES:
        raise DataError(f"{where} expands to more than {MAX_YAML_VALUES:,} values (YAML aliases: a 'billion laughs' "
                        "file); write the values out without &anchors and *aliases")
    return value


def check_label_range(low: int, high: int, where: str) -> None:
    """Class indices must be >= 0 and below MAX_CLASSES: the class list is sized by the largest one."""
    if low < 0:
        raise DataError(f"{where}: label {low} is negative; class indices start at 0 (fix the label)")
    if high >= MAX_CLASSES:
        raise DataError(f"{where}: label {high} is beyond vitlab's limit of {MAX_CLASSES:,} classes; "
                        "a class index that large is a corrupt or crafted label (fix the label)")


def contained(path: str | Path, root: Path) -> Path | None:
    """`path` (relative paths are taken from `root`) with every symbolic link resolved, if it lies inside `root`
    (also resolved); None if it points outside."""
    base = root.resolve()
    target = (base / path).resolve()  # an absolute `path` replaces base
    return target if target.is_relative_to(base) else None

"""`build_datasets`: a train and a validation split from an embedded set or an image folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .embedded import EMBEDDED, embedded_splits
from .errors import DataError
from .folder import check_same_classes, class_folders, folder_layout, scan_split
from .sources import ImageSplit, stratified_holdout


@dataclass
class Datasets:
    train: ImageSplit
    val: ImageSplit
    class_names: list[str]
    source: str  # the embedded name or the folder
    skipped: list[str] = field(default_factory=list)  # files found unreadable while scanning

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def build_datasets(data: str = "digits", val_fraction: float | None = None, strict: bool = False) -> Datasets:
    """Embedded `digits`/`mnist` (validation = their fixed test split) or an image folder.

    `val_fraction` holds out that fraction of each training class as the validation split instead (the paper's
    way of choosing hyper-parameters without touching the test/val data). A folder without `val/` needs it.
    """
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise DataError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if data in EMBEDDED:
        train, val = embedded_splits(data)
        ds = Datasets(train, val, train.class_names, data)
    else:
        ds = _folder_datasets(Path(data), val_fraction, strict)
    if val_fraction:
        keep, held = stratified_holdout(ds.train.labels, val_fraction, seed=0)
        ds.train, ds.val = ds.train.subset(keep, "train"), ds.train.subset(held, f"train[{val_fraction:g}]")
    return ds


def _folder_datasets(root: Path, val_fraction: float | None, strict: bool) -> Datasets:
    train_dir, val_dir = folder_layout(root)
    if val_dir is None and not val_fraction:
        raise DataError(
            f"missing split: {root} has no val/ folder; add {root}/val/<class>/*.jpg or hold out part of the "
            "training images with --val-fraction 0.1"
        )
    class_names = class_folders(train_dir)
    train, skipped = scan_split(train_dir, class_names, "train", strict)
    if val_dir is not None and not val_fraction:
        val, bad_val = scan_with_classes(val_dir, class_names, "val", strict)
        skipped += bad_val
    else:
        val = train.subset(np.arange(0), "val")  # replaced by the held-out part in build_datasets
    return Datasets(train, val, class_names, str(root), skipped)


def scan_with_classes(
    split_dir: Path, class_names: list[str], name: str, strict: bool
) -> tuple[ImageSplit, list[str]]:
    """A split labelled by a given class list (the training set's or the model's). Its folder may lack some
    classes (a small val set) but must not have classes outside the list."""
    check_same_classes(class_names, split_dir)
    present = set(class_folders(split_dir))
    split, bad = scan_split(split_dir, [c for c in class_names if c in present], name, strict)
    remap = np.array([class_names.index(c) for c in class_names if c in present], dtype=np.int64)
    split.labels = remap[split.labels]
    split.class_names = class_names
    return split, bad


def load_split(
    data: str, split: str = "val", class_names: list[str] | None = None, strict: bool = False
) -> ImageSplit:
    """One split for evaluation: `val` (embedded: the test split; folder: root/val, or the whole folder
    when it is a plain root/<class>/ tree) or `train`. With `class_names` (a model's), folders are labelled
    by that list."""
    if split not in ("train", "val", "test"):
        raise DataError(f"unknown split {split!r}; use train or val")
    if data in EMBEDDED:
        train, test = embedded_splits(data)
        return train if split == "train" else test
    root = Path(data)
    train_dir, val_dir = folder_layout(root)
    if split == "train" or train_dir == root:
        target = train_dir
    elif val_dir is None:
        raise DataError(f"missing split: {root} has no val/ folder; add {root}/val/<class>/*.jpg or use --split train")
    else:
        target = val_dir
    if class_names is None:
        class_names = class_folders(target)
    return scan_with_classes(target, class_names, split, strict)[0]


__all__ = ["Datasets", "build_datasets", "load_split"]

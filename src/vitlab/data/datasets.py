"""`build_datasets`: a train and a validation split from an embedded set or an image folder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.data import synthetic
from vitlab.data.embedded import embedded_splits, is_embedded
from vitlab.data.folder import check_same_classes, class_folders, folder_layout, scan_split
from vitlab.data.objects import is_dataset_object, is_object_description, object_datasets
from vitlab.data.sources import ImageSplit
from vitlab.errors import DataError, setting

# The source families beyond the embedded sets and image folders (drawn, Hugging Face, tar shards) are imported by
# the functions below when a source is not an embedded set: a run on the digits imports none of their readers.


def _drawn() -> list[tuple[str, Any, Callable[[str], tuple[ImageSplit, ImageSplit]]]]:
    """Sources drawn by a formula (KIND:C:N[:SEED]): (kind, module, its (train, val) pair, rendered or cached)."""
    from vitlab.data import fontglyphs, fractal, strokes

    return [("fractal", fractal, fractal.fractal_splits), ("strokes", strokes, strokes.strokes_splits),
            ("fonts", fontglyphs, fontglyphs.fonts_splits)]


def is_drawn_source(data: str) -> bool:
    return any(synthetic.is_source(data, module.PREFIX) for _, module, _ in _drawn())


@dataclass(frozen=True)
class DrawnSource:
    """What a drawn source (fractal:, strokes:, fonts:) holds, known from its spec without drawing it."""

    kind: str  # "fractal", "strokes" or "fonts"
    classes: int
    train_images: int
    val_images: int
    cached: bool  # already rendered into the cache: loading it draws nothing


def describe_drawn(data: str) -> DrawnSource | None:
    """The sizes of a drawn source and whether it is rendered yet; None for any other source."""
    for kind, module, _ in _drawn():
        if synthetic.is_source(data, module.PREFIX):
            spec = module.parse_spec(data)
            return DrawnSource(kind, spec.classes, spec.classes * spec.count("train"),
                               spec.classes * spec.count("val"), module.cache_path(spec).is_file())
    return None


def drawn_splits(data: str) -> tuple[ImageSplit, ImageSplit]:
    """(train, val) of a drawn source (`is_drawn_source`)."""
    return next(splits for _, module, splits in _drawn() if synthetic.is_source(data, module.PREFIX))(data)


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


def build_datasets(data: Any = "digits", val_fraction: float | None = None, strict: bool = False) -> Datasets:
    """Embedded `digits`/`mnist` (validation = their fixed test split), an image folder (or any source named by a
    string), or a dataset object or (train, val) pair of them (vitlab.data.objects).

    `val_fraction` holds out that fraction of each training class as the validation split instead (the paper's
    way of choosing hyper-parameters without touching the test/val data). A folder without `val/` needs it.
    """
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise DataError(f"{setting('val_fraction')} must be in [0, 1), got {val_fraction}")
    if is_dataset_object(data):
        ds = _object_datasets(data, val_fraction)
    else:
        ds = _named_datasets(data, val_fraction, strict)
    if val_fraction:
        keep, held = ds.train.holdout(val_fraction, seed=0)
        ds.train, ds.val = ds.train.subset(keep, "train"), ds.train.subset(held, f"train[{val_fraction:g}]")
    return ds


def _named_datasets(data: str, val_fraction: float | None, strict: bool) -> Datasets:
    check_data_named(data)
    if is_embedded(data):
        train, val = embedded_splits(data)
        return Datasets(train, val, train.class_names, data)
    if is_drawn_source(data):  # fractal:C:N[:SEED] (Kataoka et al. 2020), strokes:C:N[:SEED], fonts:C:N[:SEED]
        train, val = drawn_splits(data)
        return Datasets(train, val, train.class_names, data)
    from vitlab.data.hf_split import hf_train_val, is_hf_source
    from vitlab.data.shards import is_shard_source

    if is_hf_source(data):  # before shards: a brace pattern of .parquet files is not a tar pattern
        train, val = hf_train_val(data, val_fraction, strict)
        return Datasets(train, val, train.class_names, data)
    if is_shard_source(data):
        return _shard_datasets(data, val_fraction, strict)
    return _folder_datasets(Path(data), val_fraction, strict)


def _object_datasets(data: Any, val_fraction: float | None) -> Datasets:
    train, val, source = object_datasets(data)
    if val is None and not val_fraction:
        raise DataError("missing split: data is one dataset, with no validation split; pass data=(train, val) or "
                        "hold out part of it with val_fraction=0.1")
    return Datasets(train, val if val is not None else train.subset(np.arange(0), "val"), train.class_names, source)


def check_data_named(data: str) -> None:
    """An empty --data would read the current directory (Path('') is '.'), and a dataset object's description (a
    vitlab.fit run's recorded `data`) names no files: both refused with what to pass."""
    if is_object_description(data):
        raise DataError(f"--data {str(data)[:120]} names a dataset object a vitlab.fit run was given; it cannot be "
                        "read from its description: pass the same object to vitlab.fit(data=...)")
    if not str(data).strip():
        raise DataError(f"{setting('data')} is empty; pass an image folder, tar shards, a Hugging Face dataset on "
                        "disk, fractal:C:N, strokes:C:N, fonts:C:N or an embedded name (digits, mnist)")


def _folder_datasets(root: Path, val_fraction: float | None, strict: bool) -> Datasets:
    train_dir, val_dir = folder_layout(root)
    if val_dir is None and not val_fraction:
        raise DataError(_missing_val(root, train_dir))
    class_names = class_folders(train_dir)
    train, skipped = scan_split(train_dir, class_names, "train", strict)
    if val_dir is not None and not val_fraction:
        val, bad_val = scan_with_classes(val_dir, class_names, "val", strict)
        skipped += bad_val
    else:
        val = train.subset(np.arange(0), "val")  # replaced by the held-out part in build_datasets
    return Datasets(train, val, class_names, str(root), skipped)


VAL_NAMES = ("val", "validation", "valid")  # what a validation folder beside the training one is called


def _missing_val(root: Path, train_dir: Path) -> str:
    """The fix for an image folder without a validation split. --data naming the training half of a pair
    (photos/train beside photos/val) is answered with the pair's parent, as vitlab reads a split folder."""
    hold_out = f"hold out part of the training images with {setting('val_fraction', value=0.1)}"
    if train_dir != root:  # root/train/ without root/val/
        return f"missing split: {root} has no val/ folder; add {root}/val/<class>/*.jpg or {hold_out}"
    parent = root.parent
    beside = next((parent / n for n in VAL_NAMES if (parent / n).is_dir() and parent / n != root), None)
    if beside is None:
        return (f"missing split: {root} holds the classes and no validation split; {hold_out}, or arrange the "
                f"images as {root}/train/<class>/ and {root}/val/<class>/")
    renames = [f"{old} to {parent / new}" for old, new in ((root, "train"), (beside, "val")) if old.name != new]
    then = f"rename {' and '.join(renames)}, then " if renames else ""
    return (f"missing split: {root} is a training split and {beside} is beside it: {then}pass "
            f"{setting('data', value=str(parent))} (vitlab reads {parent}/train/ and {parent}/val/), or {hold_out}")


def _shard_datasets(data: str, val_fraction: float | None, strict: bool) -> Datasets:
    from vitlab.data.shards import open_shard_set, shard_split

    shards = open_shard_set(data)
    if "val" not in shards.splits and not val_fraction:
        raise DataError(f"missing split: the shards {data} have no val split; pack one (vitlab shards SRC OUT "
                        f"--val-fraction 0.1) or hold out part of train with {setting('val_fraction', value=0.1)}")
    train = shard_split(shards, "train", strict=strict)
    val = shard_split(shards, "val", train.class_names, strict) if not val_fraction else train.subset(
        np.arange(0), "val")  # replaced by the held-out part in build_datasets
    return Datasets(train, val, train.class_names, data)


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


HOLDOUT_FRACTION = 0.2  # a protocol's default test share of a folder without val/ (the embedded sets' too)
HOLDOUT_SEED = 0  # the seed `build_datasets` draws --val-fraction with: a run's validation images are found again


def _check_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"{setting('val_fraction')} must be in (0, 1), got {val_fraction}")


def load_split(
    data: str, split: str = "val", class_names: list[str] | None = None, strict: bool = False,
    val_fraction: float | None = None,
) -> ImageSplit:
    """One split for evaluation: `val` (embedded: the test split; folder: root/val, or the whole folder
    when it is a plain root/<class>/ tree, e.g. a test set) or `train`. With `class_names` (a model's), folders
    are labelled by that list. With `val_fraction`, `val` is that stratified share of each class of the train
    split and `train` the rest, drawn as training's --val-fraction draws them (seed 0)."""
    if split not in ("train", "val", "test"):
        raise DataError(f"unknown split {split!r}; use train or val")
    check_data_named(data)
    if val_fraction is not None:
        _check_fraction(val_fraction)
        train, held = _held_out(load_split(data, "train", class_names, strict), val_fraction)
        return train if split == "train" else held
    if is_embedded(data):
        train, test = embedded_splits(data)
        return train if split == "train" else test
    if is_drawn_source(data):
        train, val = drawn_splits(data)
        return train if split == "train" else val
    from vitlab.data.hf_split import hf_split, is_hf_source, open_hf
    from vitlab.data.shards import is_shard_source, open_shard_set, shard_split

    if is_hf_source(data):
        return hf_split(open_hf(data), split, class_names, strict, lenient=True)
    if is_shard_source(data):
        shards = open_shard_set(data)
        only = next(iter(shards.splits)) if len(shards.splits) == 1 else None  # like a plain folder: any split
        return shard_split(shards, only or ("train" if split == "train" else "val"), class_names, strict)
    root = Path(data)
    train_dir, val_dir = folder_layout(root)
    if split == "train" or train_dir == root:
        target = train_dir
    elif val_dir is None:
        raise DataError(f"missing split: {root} has no val/ folder; add {root}/val/<class>/*.jpg, use --split "
                        "train, or hold out part of train/ with --val-fraction 0.2")
    else:
        target = val_dir
    if class_names is None:
        class_names = class_folders(target)
    return scan_with_classes(target, class_names, split, strict)[0]


def _held_out(train: ImageSplit, val_fraction: float) -> tuple[ImageSplit, ImageSplit]:
    keep, held = train.holdout(val_fraction, seed=HOLDOUT_SEED)
    if not len(held):
        raise DataError(f"{setting('val_fraction', value=val_fraction)} holds out no image of {train.name} "
                        f"({len(train)} images): raise it or add images")
    return train.subset(keep, "train"), train.subset(held, f"train[{val_fraction:g}]")


def has_val_split(data: str) -> bool:
    """Whether `data` has a validation split of its own (embedded test split, a folder's val/, val shards)."""
    check_data_named(data)
    if is_embedded(data) or is_drawn_source(data):
        return True
    from vitlab.data.hf_split import is_hf_source, open_hf
    from vitlab.data.shards import is_shard_source, open_shard_set

    if is_hf_source(data):
        return open_hf(data).has_val
    if is_shard_source(data):
        return "val" in open_shard_set(data).splits
    return folder_layout(Path(data))[1] is not None


@dataclass
class EvaluationSplits:
    """A fit split and a test split that share no image (a protocol that fits on one and tests on the other)."""

    train: ImageSplit
    test: ImageSplit
    test_source: str  # where the test images come from, in words: printed and recorded with the result
    val_fraction: float | None  # the held-out share of train, None when the test split is a split of its own

    def record(self) -> dict:
        """What a result file records about the split."""
        held = {"val_fraction": self.val_fraction, "holdout_seed": HOLDOUT_SEED} if self.val_fraction else {}
        return {"test_split": self.test_source, "train_images": len(self.train), "test_images": len(self.test),
                **held}


def evaluation_splits(
    data: str, val_fraction: float | None = None, class_names: list[str] | None = None, strict: bool = False
) -> EvaluationSplits:
    """Train and test splits for few-shot evaluation. The test split is the embedded sets' test split or a
    folder's val/; a folder without val/ (or any data, given `val_fraction`) holds out a stratified share of
    each class of its train split instead (HOLDOUT_FRACTION by default, seed 0): testing on the images the
    shots were drawn from would report memorisation as accuracy."""
    has_val = has_val_split(data)
    if val_fraction is None and has_val:
        train = load_split(data, "train", class_names, strict)
        test = load_split(data, "val", class_names, strict)
        source = f"the {data} test split" if is_embedded(data) else f"{Path(data) / 'val'}"
        if is_drawn_source(data):
            source = f"the {data} val split"
        from vitlab.data.hf_split import HFSplit

        if isinstance(test, HFSplit):
            source = f"the {test.split_name} split of {test.source}"
        return EvaluationSplits(train, test, source, None)
    fraction = HOLDOUT_FRACTION if val_fraction is None else val_fraction
    _check_fraction(fraction)
    whole = load_split(data, "train", class_names, strict)
    train, test = _held_out(whole, fraction)
    why = "" if has_val else f"; {data} has no val/"
    source = f"{whole.describe_holdout(fraction, HOLDOUT_SEED)}{why})"
    return EvaluationSplits(train, test, source, fraction)


__all__ = ["Datasets", "EvaluationSplits", "build_datasets", "evaluation_splits", "has_val_split", "load_split"]

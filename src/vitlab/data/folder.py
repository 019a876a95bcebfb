"""Image-folder datasets: `root/<class>/*.jpg|png|webp`, either split as `root/train/…` and `root/val/…` or a
single tree from which a fraction is held out. Class names are the sorted folder names.

Every file's header is opened once while scanning (threads: it is I/O), so files that are not images are found
before training; files that fail later while decoding (truncated JPEGs) are handled by the loader.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import DataError, describe_paths, log
from .sources import DECODE_ERRORS, ImageSplit

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
_EXT_TEXT = ", ".join(IMAGE_EXTENSIONS)


def class_folders(split_dir: Path) -> list[str]:
    names = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise DataError(f"{split_dir} has no class folders; expected {split_dir}/<class>/*.jpg")
    return names


def _header_ok(path: str) -> bool:
    try:
        with Image.open(path) as img:
            img.size  # noqa: B018 - opening parses the header; that is the check
        return True
    except DECODE_ERRORS:
        return False


def scan_split(split_dir: Path, class_names: list[str], name: str, strict: bool) -> tuple[ImageSplit, list[str]]:
    """All images under split_dir/<class>/ (recursively) and the unreadable ones. A class folder that is
    missing or has no readable image is an error: training would silently learn one class fewer."""
    paths: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(class_names):
        folder = split_dir / cls
        files = sorted(str(p) for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
        if not files:
            raise DataError(f"class folder {folder} has no images ({_EXT_TEXT}); add images or remove the folder")
        paths += files
        labels += [label] * len(files)
    with ThreadPoolExecutor(max_workers=8) as pool:
        ok = list(pool.map(_header_ok, paths, chunksize=64))
    bad = [p for p, good in zip(paths, ok, strict=True) if not good]
    if bad and strict:
        raise DataError(f"{len(bad)} unreadable image(s) in {split_dir}: {describe_paths(bad)} (--strict)")
    if bad:
        log.warning("skipping %d unreadable image(s) in %s: %s", len(bad), split_dir, describe_paths(bad))
    keep = np.array(ok, dtype=bool)
    label_arr = np.array(labels, dtype=np.int64)[keep]
    for label, cls in enumerate(class_names):
        if not (label_arr == label).any():
            raise DataError(f"class folder {split_dir / cls} has no readable images; all of them failed to open")
    kept = [p for p, good in zip(paths, ok, strict=True) if good]
    return ImageSplit(name, label_arr, class_names, paths=kept, strict=strict), bad


def folder_layout(root: Path) -> tuple[Path, Path | None]:
    """(train_dir, val_dir or None) for the two accepted layouts."""
    if not root.is_dir():
        raise DataError(
            f"data folder {root} does not exist; pass root/<class>/*.jpg, root/train|val/<class>/*.jpg, "
            "or an embedded dataset name (digits, mnist)"
        )
    train, val = root / "train", root / "val"
    if train.is_dir():
        return train, (val if val.is_dir() else None)
    if val.is_dir():
        raise DataError(f"missing split: {root} has val/ but no train/; add {train}/<class>/*.jpg")
    return root, None


def check_same_classes(known: list[str], split_dir: Path) -> None:
    """Every class folder of split_dir must be one of `known` (the training split's or the model's classes)."""
    unknown = sorted(set(class_folders(split_dir)) - set(known))
    if unknown:
        raise DataError(
            f"{split_dir} has class folders unknown to the {len(known)} training classes: "
            f"{', '.join(unknown[:5])}; rename or remove them"
        )

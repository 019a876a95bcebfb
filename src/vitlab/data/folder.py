"""Image-folder datasets: `root/<class>/*.jpg|png|webp`, either split as `root/train/…` and `root/val/…` or a
single tree from which a fraction is held out. Class names are the sorted folder names.

Every file's header is opened once while scanning (threads: it is I/O), so files that are not images are found
before training; files that fail later while decoding (truncated JPEGs) are handled by the loader.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from vitlab.data.errors import describe_paths, log
from vitlab.data.sources import DECODE_ERRORS, PIXELS_ENV, ImageSplit, open_image, pixel_budget
from vitlab.errors import DataError, setting
from vitlab.files.reading import open_regular

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
_EXT_TEXT = ", ".join(IMAGE_EXTENSIONS)


def walk(top: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk(top)` (top-down, links to folders listed but not entered, the caller may prune `dirs`) without
    recursion: a folder nested thousands deep is walked, not a RecursionError."""
    pending = [os.fspath(top)]
    while pending:
        root = pending.pop()
        try:
            entries = list(os.scandir(root))
        except OSError:  # unreadable or vanished: skipped, as os.walk skips it
            continue
        dirs, files = [], []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield root, dirs, files
        pending += [os.path.join(root, name) for name in reversed(dirs)
                    if not os.path.islink(os.path.join(root, name))]


def files_under(folder: Path) -> list[Path]:
    """Every file below `folder` (`walk`), sorted."""
    return sorted(Path(root, name) for root, _, files in walk(folder) for name in files)


def class_folders(split_dir: Path) -> list[str]:
    names = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise DataError(f"{split_dir} has no class folders; expected {split_dir}/<class>/*.jpg")
    return names


BOMB = "bomb"  # a header that declares more pixels than the image budget (a decompression bomb, or just too big)


def header_problem(path: str) -> str | None:
    """None if the image header reads; BOMB for an image over the budget of `pixel_budget()`; else "unreadable"
    (not an image, truncated header, or not a regular file: a FIFO would block the open)."""
    try:
        with open_regular(path) as f, open_image(f):  # opening parses the header and checks its size
            return None
    except Image.DecompressionBombError:  # vitlab's ImageTooLarge, or Pillow's refusal under a raised budget
        return BOMB
    except DECODE_ERRORS:
        return "unreadable"


def bomb_limit() -> str:
    """The image budget in words; the messages that say it name PIXELS_ENV as the way to raise it."""
    return f"{pixel_budget():,} pixels"


def report_skipped(bad: list[str], bombs: list[str], where: str, strict: bool) -> None:
    """The one-line warnings (or, with --strict, the error) for files a scan leaves out."""
    if bombs and strict:
        raise DataError(f"{len(bombs)} image(s) in {where} over the image budget of {bomb_limit()}: "
                        f"{describe_paths(bombs)} ({setting('strict')}); remove or shrink them, or raise {PIXELS_ENV}")
    if bad and strict:
        raise DataError(f"{len(bad)} unreadable image(s) in {where}: {describe_paths(bad)} ({setting('strict')})")
    if bombs:
        log.warning("skipping %d image(s) in %s over the image budget of %s (a decompression bomb, or an image "
                    "too large to decode safely; %s raises the budget): %s", len(bombs), where, bomb_limit(),
                    PIXELS_ENV, describe_paths(bombs))
    if bad:
        log.warning("skipping %d unreadable image(s) in %s: %s", len(bad), where, describe_paths(bad))


def scan_split(split_dir: Path, class_names: list[str], name: str, strict: bool) -> tuple[ImageSplit, list[str]]:
    """All images under split_dir/<class>/ (recursively) and the unreadable ones. A class folder that is
    missing or has no readable image is an error: training would silently learn one class fewer."""
    paths: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(class_names):
        folder = split_dir / cls
        files = sorted(str(p) for p in files_under(folder) if p.suffix.lower() in IMAGE_EXTENSIONS)
        if not files:
            raise DataError(f"class folder {folder} has no images ({_EXT_TEXT}); add images or remove the folder")
        paths += files
        labels += [label] * len(files)
    with ThreadPoolExecutor(max_workers=8) as pool:
        problems = list(pool.map(header_problem, paths, chunksize=64))
    bombs = [p for p, why in zip(paths, problems, strict=True) if why == BOMB]
    bad = [p for p, why in zip(paths, problems, strict=True) if why is not None and why != BOMB]
    report_skipped(bad, bombs, str(split_dir), strict)
    keep = np.array([why is None for why in problems], dtype=bool)
    label_arr = np.array(labels, dtype=np.int64)[keep]
    for label, cls in enumerate(class_names):
        if not (label_arr == label).any():
            raise DataError(f"class folder {split_dir / cls} has no readable images; all of them failed to open")
    kept = [p for p, good in zip(paths, keep, strict=True) if good]
    return ImageSplit(name, label_arr, class_names, paths=kept, strict=strict), bad + bombs


def folder_layout(root: Path) -> tuple[Path, Path | None]:
    """(train_dir, val_dir or None) for the two accepted layouts."""
    if root.exists() and not root.is_dir():
        raise DataError(compressed_advice(root) if is_compressed_tar(root.name) else
                        f"{root} is a file, not a data folder; pass root/<class>/*.jpg, root/train|val/<class>/*.jpg, "
                        "tar shards (.tar), a Hugging Face dataset or an embedded name (digits, mnist)")
    if not root.is_dir() and is_compressed_tar(root.name):
        raise DataError(compressed_advice(root))
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
    _check_class_tree(root)
    return root, None


COMPRESSED_TARS = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def is_compressed_tar(name: str) -> bool:
    return name.lower().endswith(COMPRESSED_TARS)


def compressed_advice(path: Path) -> str:
    return (f"{path} is a compressed tar shard; vitlab reads uncompressed .tar shards (it seeks to each image's "
            "bytes): decompress them (gunzip *.tar.gz) or pack the images with vitlab shards")


def _check_class_tree(root: Path) -> None:
    """A folder without train/ or val/ must hold class folders; an empty folder, loose images or compressed shards
    each get their own advice instead of the "no val/ folder" that would follow."""
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    if any(p.is_dir() for p in entries):
        return
    if not entries:
        raise DataError(f"data folder {root} is empty; put the images in {root}/<class>/*.jpg (a folder per class) "
                        f"or {root}/train|val/<class>/*.jpg")
    compressed = [p for p in entries if is_compressed_tar(p.name)]
    if compressed:
        raise DataError(f"{compressed_advice(compressed[0])} ({len(compressed)} such file(s) in {root})")
    images = [p for p in entries if p.suffix.lower() in IMAGE_EXTENSIONS]
    if images:
        raise DataError(f"{root} holds {len(images)} image(s) but no class folders; move them into {root}/<class>/ "
                        "(a folder per class: the folder names are the labels)")
    raise DataError(f"{root} holds no class folders nor images (found {describe_paths([p.name for p in entries])}); "
                    f"expected {root}/<class>/*.jpg or {root}/train|val/<class>/*.jpg")


def check_same_classes(known: list[str], split_dir: Path) -> None:
    """Every class folder of split_dir must be one of `known` (the training split's or the model's classes)."""
    unknown = sorted(set(class_folders(split_dir)) - set(known))
    if unknown:
        raise DataError(
            f"{split_dir} has class folders unknown to the {len(known)} training classes: "
            f"{', '.join(unknown[:5])}; rename or remove them"
        )

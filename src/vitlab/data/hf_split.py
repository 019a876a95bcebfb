"""A split of a Hugging Face dataset on disk as an ImageSplit (where the splits are: `hf_files`): rows read by random
access from the memory-mapped Arrow files, so the samplers work as for image files. Images are read as the stored
encoded bytes and decoded here exactly as for image files and shards; labels come from one column read. The image
column is the `Image` feature, the label column the `ClassLabel` feature (its names are the class names); `--data
'/data/cifar100#image=img,label=fine_label'` chooses them by name.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.data.errors import describe_paths, log
from vitlab.data.hf_files import NEEDS_DATASETS, HFSet, import_datasets, int_column, is_hf_source, open_hf
from vitlab.data.sources import ImageSplit, relabel_by_name, run_lengths
from vitlab.data.untrusted import check_label_range, contained
from vitlab.errors import DataError, setting
from vitlab.files.reading import read_regular

PATH_CHECKS = 100_000  # path-only rows checked when a split opens (every row is checked again when read)

IMAGE_NAMES = ("image", "img", "jpg", "png")  # image columns by name when no column has the Image feature
LABEL_NAMES = ("label", "labels", "cls", "fine_label", "target")
_INT_TYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


def _is_image(feature: Any, hf: Any) -> bool:
    if isinstance(feature, hf.Image):
        return True
    if isinstance(feature, hf.Value):
        return feature.dtype in ("binary", "large_binary", "string", "large_string")  # bytes, or a file path
    return isinstance(feature, dict) and "bytes" in feature  # {bytes, path} without the Image feature


def _is_label(feature: Any, hf: Any) -> bool:
    return isinstance(feature, hf.ClassLabel) or isinstance(feature, hf.Value) and feature.dtype in _INT_TYPES


def _choose(kind: str, features: Any, chosen: str | None, typed: type, named: tuple[str, ...], accept: Any,
            where: str, source: str) -> str:
    """One column of `kind`: the chosen one, else the only one with the typed feature, else the only one with
    a conventional name. None or several: a one-line error asking for #kind=COLUMN."""
    listing = ", ".join(features)
    if chosen is not None:
        if chosen not in features:
            raise DataError(f"{where} has no column {chosen!r} (#{kind}={chosen}); its columns are {listing}")
        if not accept(features[chosen]):
            raise DataError(f"{where}: column {chosen!r} holds {features[chosen]}, not "
                            f"{'images' if kind == 'image' else 'class indices'}; its columns are {listing}")
        return chosen
    found = [c for c, f in features.items() if isinstance(f, typed)]
    found = found or [c for c in named if c in features and accept(features[c])]
    if len(found) == 1:
        return found[0]
    what = f"{len(found)} {kind} columns ({', '.join(found)})" if found else f"no {kind} column (columns: {listing})"
    raise DataError(f"{where} has {what}; choose one: --data '{source}#{kind}={found[0] if found else 'COLUMN'}'")


def pick_columns(features: Any, chosen: dict[str, str], where: str, source: str) -> tuple[str, str]:
    """(image column, label column) of a split's features."""
    hf = import_datasets()
    image = _choose("image", features, chosen.get("image"), hf.Image, IMAGE_NAMES, lambda f: _is_image(f, hf),
                    where, source)
    label = _choose("label", features, chosen.get("label"), hf.ClassLabel, LABEL_NAMES, lambda f: _is_label(f, hf),
                    where, source)
    return image, label


def row_bytes(value: Any, root: str | None, where: str) -> bytes:
    """The encoded image of an image row: its bytes, or the file its path names. A path is read only inside the
    dataset's folder `root` (relative paths taken from it; None: a dataset held in memory, whose paths are read as
    given), never from a FIFO. OSError (a decode error to the loader, which skips and counts the row) otherwise."""
    data, path = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (
        (None, value) if isinstance(value, str) else (value, None))
    if data is None and path:  # an Image feature may refer to a file instead of holding its bytes
        inside = Path(path) if root is None else contained(path, Path(root)) if root else None
        if inside is None:
            raise OSError(f"{where} refers to {path}, outside the dataset folder {root}; not read")
        return read_regular(inside)  # a FIFO would block the read forever
    if not isinstance(data, bytes | bytearray):
        raise OSError(f"{where} has no image")
    return bytes(data)


# ---- the split ----------------------------------------------------------------------------------------------


@dataclass
class HFSplit(ImageSplit):
    """An ImageSplit whose images are rows of a memory-mapped Dataset (`paths` and `arrays` stay None)."""

    dataset: Any = None  # datasets.Dataset over memory-mapped files: pickles as their paths, not their rows
    image_column: str = "image"
    source: str = ""  # the --data path, for messages
    split_name: str = ""  # the dataset's own name of the split (validation, test, …)
    rows: np.ndarray | None = None  # (N,) the dataset row of sample i; None: sample i is row i (8 bytes/row less)
    root: str = ""  # the dataset's folder: an image row holding a path is read only if the path lies inside it
    _chunks: Any = field(default=None, init=False, repr=False, compare=False)  # per process, rebuilt after pickling

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_chunks": None}  # Arrow arrays would pickle their data

    def _record_batches(self) -> tuple[list, np.ndarray]:
        """The image column's record batches and the first row of each (one cheap pass over the metadata)."""
        if self._chunks is None:
            chunks = self.dataset.data.table.column(self.image_column).chunks
            self._chunks = (chunks, np.cumsum([0] + [len(c) for c in chunks], dtype=np.int64))
        return self._chunks

    def _row(self, i: int) -> int:
        return int(i if self.rows is None else self.rows[i])

    def describe(self, i: int) -> str:
        return f"{self.source}[{self.split_name}][row {self._row(i)}]"

    def read_bytes(self, i: int) -> bytes:
        """The stored encoded image of sample i. OSError (a decode error to the loader, which then substitutes
        or skips the row) for a row without an image."""
        chunks, starts = self._record_batches()
        row = self._row(i)
        k = int(np.searchsorted(starts, row, "right")) - 1
        return row_bytes(chunks[k][row - int(starts[k])].as_py(), self.root, self.describe(i))

    def encoded(self, i: int) -> io.BytesIO:
        return io.BytesIO(self.read_bytes(i))

    def storage_blocks(self) -> np.ndarray:
        """Runs of consecutive samples in one Arrow record batch (a contiguous stretch of one memory-mapped file;
        `datasets` writes image rows 100 to a batch), or what a subset kept of them."""
        _, starts = self._record_batches()
        if self.rows is None:
            lengths = np.diff(starts)
            return lengths[lengths > 0]
        return run_lengths(np.searchsorted(starts, self.rows, "right") - 1)  # the record batch of each row

    def subset(self, indices: np.ndarray, name: str) -> HFSplit:
        rows = np.asarray(indices, np.int64) if self.rows is None else self.rows[indices]
        return dataclasses.replace(self, name=name, labels=self.labels[indices], rows=rows)


def _check_labels(labels: np.ndarray, num_classes: int, column: str, where: str) -> None:
    unlabelled = int((labels == -1).sum())
    if unlabelled:
        raise DataError(f"{where}: {unlabelled} of {len(labels)} rows have no label (-1: Hugging Face's mark of an "
                        "unlabelled test split); use a labelled split, e.g. hold out part of train with "
                        f"{setting('val_fraction', value=0.1)}")
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if len(bad):
        raise DataError(f"{where}: label {int(bad[0])} in column {column!r} is outside the {num_classes} classes; "
                        "choose the label column with #label=COLUMN or fix the data")


def _image_paths(column: Any) -> tuple[int, list[str]]:
    """(rows holding an image, paths of the first PATH_CHECKS rows that refer to a file instead of holding
    bytes), from validity bitmaps only: the image bytes are not read (struct fields are zero-copy slices)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    has_image, paths = 0, []
    for chunk in column.chunks:
        if pa.types.is_struct(chunk.type) and chunk.type.get_field_index("bytes") >= 0:
            no_bytes = pc.or_kleene(pc.is_null(chunk), pc.is_null(pc.struct_field(chunk, "bytes")))
            path = pc.struct_field(chunk, "path") if chunk.type.get_field_index("path") >= 0 else None
        elif pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type):
            no_bytes, path = pa.array(np.ones(len(chunk), bool)), chunk  # a column of file paths
        else:
            no_bytes, path = pc.is_null(chunk), None
        has_path = (pc.and_(no_bytes, pc.invert(pc.is_null(path))) if path is not None
                    else pa.array(np.zeros(len(chunk), bool)))
        has_image += len(chunk) - int(pc.sum(no_bytes).as_py() or 0) + int(pc.sum(has_path).as_py() or 0)
        rows = np.flatnonzero(has_path.to_numpy(zero_copy_only=False))[: PATH_CHECKS - len(paths)]
        paths += [path[int(r)].as_py() for r in rows]
    return has_image, paths


def _check_images(dataset: Any, image: str, root: Path, where: str) -> None:
    """An image column without any image is an error; rows that refer to files outside the dataset folder are
    reported once (they are never read: HFSplit.read_bytes refuses them, and the loader skips them)."""
    has_image, paths = _image_paths(dataset.data.column(image))
    if not has_image and len(dataset):
        raise DataError(f"{where}: the image column {image!r} holds no image (all {len(dataset)} rows are empty); "
                        "choose the image column with #image=COLUMN or re-save the dataset with its images")
    outside = [p for p in paths if contained(p, root) is None]
    if outside:
        log.warning("%s: %d image row(s) refer to files outside the dataset folder %s (%s); they are not read "
                    "and are skipped as unreadable images", where, len(outside), root, describe_paths(outside))


def hf_split(hf: HFSet, split: str, class_names: list[str] | None = None, strict: bool = False,
             lenient: bool = False) -> HFSplit:
    """vitlab's `split` (train, val, test) of a Hugging Face source; `class_names` (the training split's or a
    model's) label it by name."""
    name = hf.resolve(split, lenient)
    where = f"{hf.source}[{name}]"
    image, label = pick_columns(hf.features(name), hf.columns, where, hf.source)
    dataset = hf.open(name)
    _check_images(dataset, image, hf.root, where)
    labels = int_column(dataset.data.column(label))  # one column read, no pass over the rows
    feature = dataset.features[label]
    recorded = list(feature.names) if isinstance(feature, import_datasets().ClassLabel) else None
    if recorded is None and class_names is None:  # no names: the class indices, over all splits
        top = max((int(hf.label_values(s, label).max(initial=-1)) for s in hf.splits), default=-1)
        check_label_range(0, top, f"{where}: column {label!r}")  # the class list is sized by it
        recorded_count = top + 1
    else:
        recorded_count = len(recorded) if recorded is not None else len(class_names)
    _check_labels(labels, recorded_count, label, where)
    labels = relabel_by_name(labels, recorded, class_names, where)
    names = class_names or recorded or [str(k) for k in range(recorded_count)]
    return HFSplit(split, labels, list(names), strict=strict, dataset=dataset, image_column=image, source=hf.source,
                   split_name=name, root=str(hf.root))


def hf_train_val(data: str, val_fraction: float | None, strict: bool) -> tuple[HFSplit, HFSplit]:
    """The train split and the val split labelled by its classes (empty with --val-fraction: held out later)."""
    hf = open_hf(data)
    if not hf.has_val and not val_fraction:
        raise DataError(f"missing split: {hf.source} has no validation or test split (found "
                        f"{', '.join(hf.splits)}); hold out part of train with {setting('val_fraction', value=0.1)}")
    train = hf_split(hf, "train", strict=strict)
    val = hf_split(hf, "val", train.class_names, strict) if not val_fraction else train.subset(np.arange(0), "val")
    return train, val


__all__ = ["NEEDS_DATASETS", "HFSet", "HFSplit", "hf_split", "hf_train_val", "is_hf_source", "open_hf",
           "pick_columns"]

"""Datasets given as Python objects (`vitlab.fit(data=...)`): a map-style dataset of (image, label) pairs, or a
(train, validation) pair of them, or a dict of splits (a `datasets.DatasetDict`: its train and validation splits),
as the run's `Datasets`.

Accepted: a torchvision `ImageFolder` (or any `VisionDataset`), a Hugging Face `datasets.Dataset` with an image and
a class-index column, and any object with `__len__` and `__getitem__` returning (PIL image, tensor or array, int
label). The images must be the raw images: vitlab applies its own training and evaluation transforms (crop, flip,
resize, the model's normalisation), so a dataset that transforms them itself (a torchvision `transform=`, an HF
`set_transform`) is refused rather than normalised twice. A tensor image is (C, H, W) or an array (H, W[, C]),
uint8, or float in [0, 1].

Images pass the checks image files pass (`sources.check_pixels`): more pixels than the image budget, or a side of 0,
and the item is skipped and counted as an unreadable file is. A `datasets.Dataset`'s image rows are read as the
stored encoded bytes and decoded by vitlab's reader (`sources.decode_rgb`: the budget applies before decoding, icon
members included), not by `datasets`; a row that names a file is read only inside the dataset's folder when it has
one (`hf_split.row_bytes`, as for a dataset folder), as given for a dataset held in memory. A torchvision
`ImageFolder` (any `DatasetFolder` with torchvision's loader) is read as its files, by vitlab's reader.

Class names come from the dataset (`.classes`, an HF `ClassLabel`), else they are the label indices. Labels are read
once, without touching the images where the dataset keeps them apart (`.targets`, an HF column), else through
`__getitem__` (every image is then decoded once).

A run records a dataset object by its description (`describe`): type, items, classes and a fingerprint, the SHA-256
of the label, shape, mode and pixels of its first and last FINGERPRINT_ITEMS items: cheap for any size of dataset,
and a resumed run given another dataset (other images at either end, another length or other classes) is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from vitlab.data.errors import log
from vitlab.data.sources import DECODE_ERRORS, ImageSplit, check_pixels, decode_rgb, to_rgb
from vitlab.data.untrusted import check_label_range
from vitlab.errors import DataError
from vitlab.ranges import MAX_COUNT

FINGERPRINT_ITEMS = 8  # items hashed at each end of a dataset
SCAN_NOTICE = 10_000  # items whose labels are read through __getitem__ before vitlab says it is doing so
OBJECT_PREFIX = "object:"  # how a run's `data` (config.json) names a dataset object: its description follows
ACCEPTED = ("a map-style dataset of (image, label): a torchvision ImageFolder, a datasets.Dataset or any object "
            "with __len__ and __getitem__")


VAL_SPLITS = ("validation", "val", "valid")  # a split dict's validation split, by the names datasets use


def is_dataset_object(data: Any) -> bool:
    """Whether `data` is a dataset object (or a (train, val) pair of them, or a dict of splits such as a
    `datasets.DatasetDict`) rather than a path or a name."""
    if isinstance(data, tuple) and len(data) == 2:
        return all(_is_map_style(d) for d in data)
    if isinstance(data, Mapping):
        return bool(data) and all(_is_map_style(d) for d in data.values())
    return _is_map_style(data)


def split_pair(data: Any, name: str = "data") -> Any:
    """A dict of splits (a `datasets.DatasetDict`) as what the run trains on: its `train` split and its validation
    split (VAL_SPLITS) as a (train, val) pair, or `train` alone when it has none (then `val_fraction` holds out part
    of it): the test split is never read, it is for the final report. Anything else as it is."""
    if not isinstance(data, Mapping):
        return data
    if "train" not in data:
        keys = list(data)
        raise DataError(f"{name} is a dict of splits ({', '.join(map(str, keys))}) with no 'train' split; pass "
                        f"{name}=({name}[{keys[0]!r}], {name}[{keys[-1]!r}]) as (train, validation)")
    val = next((data[k] for k in VAL_SPLITS if k in data), None)
    return data["train"] if val is None else (data["train"], val)


def _is_map_style(data: Any) -> bool:
    return hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(data, str | bytes | dict)


def iterable_only(data: Any) -> str | None:
    """Why `data`, an iterable dataset (a torch IterableDataset, a generator, a streaming datasets.IterableDataset),
    cannot be trained on, in one line; None for anything else."""
    if isinstance(data, str | bytes | dict) or _is_map_style(data) or not hasattr(data, "__iter__"):
        return None
    return (f"data is a {_type_name(data)}, an iterable dataset (no __len__ or indexing); vitlab samples images by "
            f"index, so pass {ACCEPTED} (a datasets.IterableDataset: load it without streaming=True)")


def is_object_description(data: str) -> bool:
    return str(data).startswith(OBJECT_PREFIX)


def _type_name(data: Any) -> str:
    kind = type(data)
    module = kind.__module__.split(".")[0]
    return kind.__name__ if module in ("builtins", "__main__") else f"{module}.{kind.__name__}"


def _is_hf(data: Any) -> bool:
    return type(data).__module__.startswith("datasets.") and hasattr(data, "features")


@dataclass
class ObjectSplit(ImageSplit):
    """An ImageSplit whose images are items of a dataset object (`paths` and `arrays` stay None)."""

    dataset: Any = None
    rows: np.ndarray | None = None  # (N,) the dataset index of sample i
    image_column: str | None = None  # an HF dataset's image column (its rows are dicts)
    encoded: bool = False  # the image column holds encoded images (bytes or a path), decoded by vitlab's reader
    root: str | None = None  # the folder of a dataset's files, inside which a path row must lie (None: in memory)

    def _image(self, i: int) -> Any:
        try:
            item = self.dataset[int(self.rows[i])]
        except Exception as err:  # the dataset's own code: one line naming the item, then skipped and counted
            raise ValueError(f"{self.describe(i)}: reading the item raised {type(err).__name__}: {err}") from None
        return item[self.image_column] if self.image_column is not None else item[0]

    def describe(self, i: int) -> str:
        return f"{self.name}[{int(self.rows[i])}]"

    def load(self, i: int, min_size: int | None = None) -> Image.Image:
        if self.encoded:
            from vitlab.data.hf_split import row_bytes

            return decode_rgb(io.BytesIO(row_bytes(self._image(i), self.root, self.describe(i))), min_size)
        return as_pil(self._image(i), self.describe(i))

    def image_size(self, i: int) -> tuple[int, int]:
        img = self.load(i)
        return img.height, img.width

    def subset(self, indices: np.ndarray, name: str) -> ObjectSplit:
        return dataclasses.replace(self, name=name, labels=self.labels[indices], rows=self.rows[indices])


def as_pil(image: Any, where: str) -> Image.Image:
    """An item's image as PIL: a PIL image as it is (8-bit RGB or greyscale), a tensor or array converted; ValueError
    or ImageTooLarge (decode errors the loader knows) naming the item otherwise, also for an image without pixels or
    with more than the image budget (`sources.check_pixels`)."""
    if isinstance(image, Image.Image):
        _check_pixels(image.width, image.height, where)
        return to_rgb(image) if image.mode not in ("RGB", "L") else image
    array = image.detach().cpu().numpy() if hasattr(image, "detach") else image
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{where}: the image is a {type(image).__name__}; a dataset item's image must be a PIL image, "
                         "a tensor or an array")
    if hasattr(image, "detach") and array.ndim == 3 and array.shape[0] in (1, 3):
        array = array.transpose(1, 2, 0)  # a tensor is (C, H, W); an image array (H, W, C)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(f"{where}: an image of shape {tuple(image.shape)}; vitlab reads (C, H, W) tensors and "
                         "(H, W[, C]) arrays with 1 or 3 channels")
    _check_pixels(array.shape[1], array.shape[0], where)
    if np.issubdtype(array.dtype, np.floating):
        if array.size and not (np.isfinite(array).all() and array.min() >= 0 and array.max() <= 1):
            raise ValueError(f"{where}: a float image with values from {array.min():g} to {array.max():g}; vitlab "
                             "reads raw images (floats in [0, 1]) and normalises them itself: remove the dataset's "
                             "Normalize")
        array = np.round(array * 255)
    elif array.dtype != np.uint8:
        raise ValueError(f"{where}: an image of dtype {array.dtype}; vitlab reads uint8, or floats in [0, 1]")
    return Image.fromarray(np.ascontiguousarray(array.astype(np.uint8)))


def _check_pixels(width: int, height: int, where: str) -> None:
    try:
        check_pixels(width, height)
    except (ValueError, Image.DecompressionBombError) as err:
        raise type(err)(f"{where}: {err}") from None


def object_datasets(data: Any, name: str = "data") -> tuple[ImageSplit, ImageSplit | None, str]:
    """(train, validation or None, description) of a dataset object or a (train, val) pair; `name`: the keyword
    it was given as, for messages. DataError (one line) for what vitlab cannot train on."""
    data = split_pair(data, name)
    train_ds, val_ds = data if isinstance(data, tuple) else (data, None)
    train = _split(train_ds, "train", None, f"{name} (train)" if val_ds is not None else name)
    val = _split(val_ds, "val", train.class_names, f"{name} (val)") if val_ds is not None else None
    parts = [describe(train_ds, train)] + ([describe(val_ds, val)] if val is not None else [])
    return train, val, OBJECT_PREFIX + " + ".join(parts)


def describe(dataset: Any, split: ImageSplit) -> str:
    """A dataset object in a run's record: type, items, classes, and the fingerprint (module doc)."""
    digest = hashlib.sha256()
    n = len(split)
    for i in sorted(set(range(min(FINGERPRINT_ITEMS, n))) | set(range(max(0, n - FINGERPRINT_ITEMS), n))):
        try:
            img = split.load(i)
        except DECODE_ERRORS as err:  # an unreadable item (skipped when training) is fingerprinted by its error
            digest.update(f"{int(split.labels[i])} unreadable {type(err).__name__}".encode())
            continue
        digest.update(f"{int(split.labels[i])} {img.size} {img.mode}".encode())
        digest.update(img.tobytes())
    return (f"{_type_name(dataset)}({n} items, {len(split.class_names)} classes, sha256 "
            f"{digest.hexdigest()[:16]})")


def _split(dataset: Any, name: str, class_names: list[str] | None, where: str) -> ImageSplit:
    if not _is_map_style(dataset):
        raise DataError(f"{where} is a {_type_name(dataset)}; pass {ACCEPTED}")
    _check_own_transform(dataset, where)
    if not _length(dataset, where):
        raise DataError(f"{where} ({_type_name(dataset)}) is empty")
    image_column, encoded, root = None, False, None
    if _is_hf(dataset):
        image_column, labels, names = _hf_labels(dataset, where)
        dataset, encoded, root = _undecoded(dataset, image_column)
    else:
        labels, names = _labels(dataset, where), _classes(dataset)
    check_label_range(int(labels.min()), int(labels.max()), where)
    names = names or class_names or [str(i) for i in range(int(labels.max()) + 1)]
    if class_names is not None and names != class_names:
        if not set(names) <= set(class_names):
            raise DataError(f"{where} has classes unknown to the {len(class_names)} training classes: "
                            f"{', '.join(sorted(set(names) - set(class_names))[:5])}; use data with the same classes")
        labels = np.array([class_names.index(c) for c in names], dtype=np.int64)[labels]
        names = class_names
    if labels.max() >= len(names):
        raise DataError(f"{where}: label {int(labels.max())} but {len(names)} class names; the dataset's classes and "
                        "labels disagree")
    paths = None if encoded else _file_paths(dataset)
    split = ImageSplit(name, labels, list(names), paths=paths) if paths is not None else ObjectSplit(
        name, labels, list(names), dataset=dataset, rows=np.arange(len(labels)), image_column=image_column,
        encoded=encoded, root=root)
    try:
        split.load(0)  # a dataset whose items vitlab cannot read is refused now, not skipped image by image
    except DECODE_ERRORS as err:
        raise DataError(f"{err}" if encoded is False else f"{split.describe(0)}: {type(err).__name__}: {err}") from None
    return split


def _file_paths(dataset: Any) -> list[str] | None:
    """The files of a torchvision DatasetFolder (an ImageFolder) that loads them with torchvision's own loader,
    which decodes with Pillow alone: vitlab reads them as a folder's files instead. None for other datasets."""
    samples, loader = getattr(dataset, "samples", None), getattr(dataset, "loader", None)
    if getattr(loader, "__module__", "") != "torchvision.datasets.folder" or not isinstance(samples, list):
        return None
    if len(samples) != len(dataset) or not all(isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], str)
                                               for s in samples):
        return None
    return [s[0] for s in samples]


def _length(dataset: Any, where: str) -> int:
    """len(dataset), or one line: a __len__ that fails, is not a count, or exceeds MAX_COUNT items."""
    try:
        n = len(dataset)
    except Exception as err:  # TypeError (not an int), ValueError (negative), OverflowError, the dataset's own
        raise DataError(f"{where}: len() of the {_type_name(dataset)} fails ({type(err).__name__}: {err}); a dataset "
                        "object's __len__ must return its number of items") from None
    if n > MAX_COUNT:
        raise DataError(f"{where}: the {_type_name(dataset)} says it has {n:,} items, more than vitlab reads from "
                        f"one dataset object ({MAX_COUNT:,}); check its __len__, or pass its files as a folder or "
                        "shards")
    return n


def _undecoded(dataset: Any, column: str) -> tuple[Any, bool, str | None]:
    """(the dataset with its image column's `Image` feature set not to decode, True, the folder of its files or
    None): `datasets` would decode each row with Pillow, outside the image budget."""
    import os

    from vitlab.data.hf_files import import_datasets

    hf = import_datasets()
    if isinstance(dataset.features[column], hf.Image):
        dataset = dataset.cast_column(column, hf.Image(decode=False))
    files = [f["filename"] for f in getattr(dataset, "cache_files", None) or []]
    return dataset, True, os.path.commonpath([os.path.dirname(f) for f in files]) if files else None


def _check_own_transform(dataset: Any, where: str) -> None:
    """Refuse a dataset that transforms its images itself (module doc)."""
    transform = None if _is_hf(dataset) else getattr(dataset, "transform", None)
    if transform is not None:
        raise DataError(f"{where}: {_type_name(dataset)} has a transform of its own ({type(transform).__name__}); "
                        "vitlab applies its own training and evaluation transforms to the raw images: build the "
                        "dataset with transform=None")
    if _is_hf(dataset) and (dataset.format.get("type") == "custom"):
        raise DataError(f"{where}: the datasets.Dataset has a transform of its own (set_transform / with_transform); "
                        "vitlab applies its own training and evaluation transforms to the raw images: pass it "
                        "without one (dataset.reset_format())")


def _labels(dataset: Any, where: str) -> np.ndarray:
    """The class index of every item: `.targets` when the dataset keeps them (torchvision), else every item read."""
    targets = getattr(dataset, "targets", None)
    if targets is not None and getattr(dataset, "target_transform", None) is None and len(targets) == len(dataset):
        values = list(targets)
    else:
        n = len(dataset)
        if n > SCAN_NOTICE:
            log.warning("%s: reading the labels of %s items through __getitem__ (each image decoded once); a "
                        "`targets` list of labels on the dataset avoids it", where, f"{n:,}")
        values = [_item(dataset, i, where)[1] for i in range(n)]
    return _as_labels(values, where)


def _item(dataset: Any, i: int, where: str) -> tuple[Any, Any]:
    try:
        item = dataset[i]
    except Exception as err:  # the dataset's own code (an IndexError before its __len__): one line naming the item
        raise DataError(f"{where}[{i}]: reading the item raised {type(err).__name__}: {err} (len() says "
                        f"{len(dataset):,} items)") from None
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise DataError(f"{where}[{i}] is a {type(item).__name__}; each item must be an (image, label) pair")
    return item[0], item[1]


def _as_labels(values: list[Any], where: str) -> np.ndarray:
    out = []
    for i, v in enumerate(values):
        v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise DataError(f"{where}[{i}]: label {v!r:.40} is not a class index (int)")
        out.append(int(v))
    return np.array(out, dtype=np.int64)


def _classes(dataset: Any) -> list[str] | None:
    classes = getattr(dataset, "classes", None)
    return [str(c) for c in classes] if isinstance(classes, list | tuple) and classes else None


def _hf_labels(dataset: Any, where: str) -> tuple[str, np.ndarray, list[str] | None]:
    """(image column, labels, class names or None) of a datasets.Dataset."""
    from vitlab.data.hf_split import pick_columns

    try:
        image, label = pick_columns(dataset.features, {}, where, "dataset")
    except DataError as err:
        raise DataError(f"{str(err).split('; choose one')[0]}; name them 'image' and 'label' "
                        "(dataset.rename_column)") from None
    names = getattr(dataset.features[label], "names", None)
    return image, _as_labels(list(dataset[label]), f"{where} column {label!r}"), list(names) if names else None

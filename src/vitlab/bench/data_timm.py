"""timm's loader on the source `vitlab bench --data` measures, with vitlab's training settings: the same image
size, crop area (0.05, 1) and aspect (3/4, 4/3) ranges, bilinear resize, horizontal flip, no colour jitter, the
same workers and batch size. Folders: `create_dataset('', root=...)`; shards: timm's WebDataset reader
(`wds/...`, root = the shard folder), which needs the `webdataset` package.

timm's `create_loader` wraps its DataLoader in a prefetcher that normalises to float on the device; the bench
iterates the inner DataLoader, whose batches are uint8 (N, 3, H, W) like vitlab's (vitlab normalises on the
device too), so that both sides do the same work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

# vitlab shards keep each image's own extension (.jpg, .jpeg, .png, .webp); timm's default key list lacks jpeg
IMAGE_KEYS = "jpg;jpeg;png;webp"


def timm_reader(s: Any, source: dict[str, Any], workers: int) -> tuple[str, Callable[[], Iterator[Any]]]:
    """(the reader in words, a callable that opens the source and yields timm's training batches). A note on
    how timm was pointed at the shards goes to source["notes"]."""
    try:
        from timm.data import create_dataset
    except ImportError as err:
        raise ValueError("--compare timm needs timm: pip install timm") from err
    if source["kind"] == "folder":
        def dataset() -> Any:
            return create_dataset("", root=s.data, split="train", is_training=True)

        return "timm create_dataset('', root=...)", lambda: _batches(dataset, s, workers)
    if source["kind"] == "shards":
        root, split, note = _wds_split(s, source)
        if note:
            source["notes"].append(note)

        def dataset() -> Any:
            return create_dataset("wds/bench", root=root, split=split, is_training=True, batch_size=s.batch_size,
                                  seed=s.seed, input_key=IMAGE_KEYS)

        return "timm create_dataset('wds/...', root=...)", lambda: _batches(dataset, s, workers)
    raise ValueError(f"--compare timm reads image folders and WebDataset shards; {s.data} is a {source['kind']} "
                     "source: leave out --compare")


def _wds_split(s: Any, source: dict[str, Any]) -> tuple[str, str, str | None]:
    """(root, split, note): the split "train" read from the folder's info file when timm accepts it, else the
    training shards listed explicitly with their sample count (timm's `a.tar::b.tar|N` form)."""
    from timm.data import create_dataset

    files = source["shard_files"]
    root = s.data if Path(s.data).is_dir() else str(Path(files[0]).parent)
    try:
        import webdataset  # noqa: F401 - timm's reader needs it; say so in one line before timm asserts
    except ImportError as err:
        raise ValueError("--compare timm on shards needs the webdataset package: pip install webdataset") from err
    try:
        create_dataset("wds/bench", root=root, split="train", is_training=True, batch_size=s.batch_size)
        return root, "train", None
    except Exception as err:  # noqa: BLE001 - any failure of timm's info parsing means: list the shards
        listed = "::".join(files) + f"|{source['train_images']}"
        why = f"{type(err).__name__}: {err}"
        return root, listed, (f"timm's wds reader did not accept split 'train' from {root}/_info.json ({why}); "
                              "it was given the training shards as an explicit list instead.")


def _batches(dataset: Callable[[], Any], s: Any, workers: int) -> Iterator[Any]:
    from timm.data import create_loader

    loader = create_loader(
        dataset(), input_size=(3, s.image_size, s.image_size), batch_size=s.batch_size, is_training=True,
        scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, vflip=0.0, color_jitter=None, interpolation="bilinear",
        num_workers=workers, device=torch.device("cpu"), use_prefetcher=True, pin_memory=False,
        persistent_workers=True,
    )
    inner = loader.loader  # uint8 batches (fast_collate); the prefetcher's float normalisation is left out
    while True:  # epochs, until the bench has its images
        served = 0
        for batch in inner:
            served += 1
            yield batch
        if not served:
            raise ValueError(f"timm's loader made no batch of {s.batch_size} from {s.data}: lower --batch-size")

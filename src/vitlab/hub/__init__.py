"""Published checkpoints by name: the catalogue (catalogue.json), the cache, downloads. A name becomes a local
file here; reading it into a model is vitlab.weights' job (hub knows no models).

    vitlab.load("ViT-B/16", pretrained="augreg-i21k")         # the AugReg ImageNet-21k ViT-B/16
    vitlab.load("augreg-i21k-ft-i1k:ViT-B/16")                # the same name written as one string
    vitlab.load("hf-hub:google/vit-base-patch16-224")         # any Hugging Face repository by id
    vitlab.load("augreg:B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0")   # any AugReg run

Nothing downloads unless a name is asked for; VITLAB_OFFLINE=1 / HF_HUB_OFFLINE=1 forbid it altogether.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

from vitlab.files.cache import cache_dir
from vitlab.hub.cache import entry_path, offline, read_meta
from vitlab.hub.catalogue import Entry, default_tags, entries, find, is_catalogue_name, select, tags
from vitlab.hub.fetch import fetch

__all__ = ["Entry", "cache_dir", "default_tags", "entries", "entry_path", "fetch", "find", "imagenet_classes",
           "is_catalogue_name", "offline", "published_info", "resolve", "select", "tags"]


def resolve(name_or_path: str | Path, pretrained: str | bool | None = None, progress: bool = True,
            ) -> tuple[Entry | None, Path]:
    """(catalogue entry or None, local path). An existing path, or a string that is no catalogue name, is returned
    as it is; a name is fetched into the cache if it is not there."""
    if pretrained is None or pretrained is False:
        path = Path(name_or_path)
        if path.exists() or not is_catalogue_name(str(name_or_path)):
            return None, path
    entry = find(str(name_or_path), pretrained)
    return entry, fetch(entry, progress=progress)


@functools.cache
def imagenet_classes() -> tuple[tuple[str, str], ...]:
    """The 1000 ImageNet-1k classes in label order: (WordNet id, WordNet lemmas), e.g. ("n01440764", "tench,
    Tinca tinca"); label order is the sorted WordNet ids, as in the official input pipelines."""
    text = resources.files(__package__).joinpath("imagenet1k_classes.tsv").read_text(encoding="utf-8")
    return tuple(tuple(line.split("\t", 1)) for line in text.splitlines() if line)  # type: ignore[misc]


def published_info(entry: Entry | None, path: Path) -> dict[str, Any] | None:
    """What the catalogue says of a loaded checkpoint: from the entry, else from the cache record beside the file."""
    if entry is not None:
        return {"name": entry.name, "classes": entry.classes, "eval_resize": entry.eval_resize,
                "mean": entry.mean, "std": entry.std, "top1": entry.top1, "licence": entry.licence}
    return read_meta(path) if path.is_file() else None

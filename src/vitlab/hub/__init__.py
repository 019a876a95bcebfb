"""Published checkpoints by name: the catalogue (catalogue.json), the cache, downloads.

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

from ..cache import cache_dir
from .cache import entry_path, offline, read_meta
from .catalogue import Entry, default_tags, entries, find, is_catalogue_name, select, tags
from .fetch import fetch

__all__ = ["Entry", "cache_dir", "default_tags", "entries", "entry_path", "fetch", "find", "imagenet_classes",
           "is_catalogue_name", "load", "offline", "resolve", "resolve_path", "select", "tags"]


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


def resolve_path(name_or_path: str | Path) -> Path:
    """A weights path for a path or a catalogue name (what `--init`, `--weights` accept)."""
    return resolve(name_or_path)[1]


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


def load(name_or_path: str | Path, pretrained: str | bool | None = None, **kwargs: Any) -> Any:
    """`vitlab.load` for paths and catalogue names alike. A published checkpoint gets `model.hub_entry` (its
    catalogue record) and, for ImageNet-1k classifiers, `model.class_names`."""
    from ..weights.load import load as load_file

    entry, path = resolve(name_or_path, pretrained)
    model = load_file(path, **kwargs)
    if entry is not None and entry.model and entry.repo is not None:  # files in the cache are checked on read
        from ..weights.checkpoint import Checkpoint
        from ..weights.load import check_published

        check_published(Checkpoint(model.config, {}, source=entry.format), path, entry.model, entry.name)
    info = published_info(entry, path)
    if info:
        model.hub_entry = info
        k = model.config.num_classes
        if info.get("classes") == "imagenet1k" and k == 1000 and not getattr(model, "class_names", None):
            model.class_names = [name for _, name in imagenet_classes()]
    if not getattr(model, "class_names", None):  # weights without names: the class indices as text, so that
        model.class_names = [str(i) for i in range(model.config.num_classes)]  # model.class_names[i] always works
    return model

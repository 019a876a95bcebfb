"""The catalogue of published checkpoints: data in `catalogue.json` beside this file, read into `Entry` records.

Names: `TAG:MODEL` (`augreg-i21k:ViT-B/16`, the tags are listed in the JSON with what each one is),
`hf-hub:owner/name` for any Hugging Face repository, `augreg:FILENAME` for any run of the AugReg index
(see augreg.py), and timm's `ARCH.TAG` (`vit_base_patch16_224.augreg2_in21k_ft_in1k`; a bare ARCH takes timm's
default tag), an alias of `hf-hub:timm/ARCH.TAG`. Facts (URLs, resolutions, accuracies, sizes) come from the
references each group names; a size marked "derived" is 4 bytes times the architecture's parameter count
because no size was published.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from vitlab.errors import by_surface
from vitlab.hub.augreg import augreg_entry
from vitlab.hub.entry import Entry, document, index_entry

HF_PREFIX = "hf-hub:"
# Units of the published sizes; the rounding a stated figure allows is half its last digit's unit.
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
# Dataset names a filter accepts for the catalogue's short ones.
DATASET_ALIASES = {
    "i21k": ("i21k", "in21k", "imagenet21k", "imagenet-21k", "i21k_30"),
    "i1k": ("i1k", "in1k", "imagenet", "imagenet1k", "imagenet-1k", "imagenet2012", "ilsvrc2012", "ilsvrc-2012"),
}


def parse_size(value: int | str | None) -> tuple[int | None, int]:
    """(bytes, slack): 412746060 -> exact; "391 MiB" -> 391·2^20 give or take half a MiB; "2.64 GB" -> ±0.005 GB."""
    if value is None or isinstance(value, int):
        return value, 0
    m = re.fullmatch(r"\s*([0-9]+(?:\.([0-9]+))?)\s*([KMG]i?B|B)\s*", value)
    if not m or m.group(3) not in _UNITS:
        raise ValueError(f"catalogue size {value!r} is not '<number> <B|KB|MB|GB|KiB|MiB|GiB>'")
    unit = _UNITS[m.group(3)]
    decimals = len(m.group(2) or "")
    return round(float(m.group(1)) * unit), (unit // 2 // 10**decimals if unit > 1 else 0)


def _entry(group: dict[str, Any], item: dict[str, Any]) -> Entry:
    data = {k: v for k, v in group.items() if k not in ("entries", "about", "url")}
    data.update(item)
    tag, model = data.pop("tag"), data.pop("model")
    repo = data.pop("repo", None)
    url = group["url"] + data.pop("file") if "url" in group else None
    size, slack = parse_size(data.pop("size", None))
    known = set(Entry.__dataclass_fields__)
    extra = {k: data.pop(k) for k in list(data) if k not in known}
    for key in ("mean", "std"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    name = HF_PREFIX + repo if repo else f"{tag}:{model}"
    return Entry(name=name, tag=tag, model=model, url=url, repo=repo, size=size, size_slack=slack, extra=extra, **data)


@cache
def entries() -> tuple[Entry, ...]:
    """Every catalogue entry, in the file's order."""
    out = [_entry(g, item) for g in document()["groups"] for item in g["entries"]]
    return (*out, index_entry())


def tags() -> dict[str, str]:
    """Tag -> what it is (from the catalogue)."""
    return {g["tag"]: g["about"] for g in document()["groups"]}


def default_tags() -> list[str]:
    return list(document()["default_tags"])


@dataclass(frozen=True)
class TimmName:
    """A timm model name read against the catalogue's timm table: the vitlab model it builds, the resolution in
    its name, its tag (timm's default when the name has none) and that tag's class count."""

    arch: str
    model: str
    resolution: int
    tag: str | None
    num_classes: int

    @property
    def hub_name(self) -> str:
        return f"{HF_PREFIX}timm/{self.arch}.{self.tag}"


def timm_models() -> dict[str, dict[str, Any]]:
    """timm architecture -> {"model": vitlab name, "default": tag or None, "tags": {tag: classes}}."""
    return document()["timm"]["models"]


def timm_name(name: str) -> TimmName | None:
    """The timm reading of `name` ("vit_base_patch16_224", "resnetv2_50x1_bit.goog_in21k"), None when the
    architecture is not one vitlab builds; ValueError for a tag timm does not publish."""
    if not isinstance(name, str):
        return None
    arch, _, tag = name.partition(".")
    spec = timm_models().get(arch)
    if spec is None:
        return None
    tag = tag or spec["default"]
    if tag is not None and tag not in spec["tags"]:
        have = ", ".join(spec["tags"]) or "none"
        raise ValueError(f"timm publishes no {arch}.{tag}; its tags: {have}")
    m = re.search(r"_(\d+)$", arch)
    resolution = int(m.group(1)) if m and arch.startswith(("vit_", "deit_")) else 224
    classes = spec["tags"][tag] if tag is not None else 1000
    return TimmName(arch=arch, model=spec["model"], resolution=resolution, tag=tag, num_classes=classes)


def is_catalogue_name(name: str) -> bool:
    """Whether `name` is meant as a catalogue name rather than a path: hf-hub:…, augreg:…, a TAG:MODEL name."""
    if not isinstance(name, str) or ":" not in name:
        if not isinstance(name, str):
            return False
        arch, _, tag = name.partition(".")  # a timm name only with a tag timm publishes: "x_bit.pth" is a path
        spec = timm_models().get(arch)
        return any(e.name == name for e in entries()) or (spec is not None and (not tag or tag in spec["tags"]))
    head = name.split(":", 1)[0]
    return head in ("hf-hub", "augreg") or head in tags()


def find(name: str, pretrained: str | bool | None = None) -> Entry:
    """The entry for a catalogue name, or for `model` + `pretrained` tag (True: the first default tag that has the
    model). ValueError naming the choices otherwise. A timm name carries its tag (or takes timm's default)."""
    if pretrained in (True, None, False) and (hit := _lookup(name) if timm_name(name) else None) is not None:
        return hit
    if pretrained is not None and pretrained is not False:
        if pretrained is True:
            choices = [f"{t}:{name}" for t in default_tags()]
        elif str(pretrained).startswith(HF_PREFIX) or str(pretrained).startswith("augreg:"):
            choices = [str(pretrained)]
        else:
            choices = [f"{pretrained}:{name}"]
        for choice in choices:
            if (hit := _lookup(choice)) is not None:
                if hit.model and hit.model != name and not hit.name.startswith(HF_PREFIX):
                    raise ValueError(f"{choice} is a {hit.model}, not a {name}")
                return hit
        raise ValueError(_unknown(name, pretrained))
    hit = _lookup(name)
    if hit is None:
        raise ValueError(_unknown(name, None))
    return hit


def _lookup(name: str) -> Entry | None:
    if (timm := timm_name(name)) is not None:
        if timm.tag is None:
            raise ValueError(f"timm publishes no weights for {timm.arch}; create it with pretrained=False")
        name = timm.hub_name
        hit = next((e for e in entries() if e.name == name), None)
        return hit or Entry(name=name, tag="hf-hub", model=timm.model, format="timm", repo=name[len(HF_PREFIX):],
                            resolution=timm.resolution, num_classes=timm.num_classes, notes="not in the catalogue")
    for e in entries():
        if e.name == name:
            return e
    if name.startswith(HF_PREFIX):
        repo = name[len(HF_PREFIX):]
        if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", repo):
            raise ValueError(f"{name!r} is not hf-hub:owner/name")
        return Entry(name=name, tag="hf-hub", model="", format="hf", repo=repo, notes="not in the catalogue")
    if name.startswith("augreg:"):
        return augreg_entry(name.split(":", 1)[1])
    return None


def _unknown(name: str, pretrained: str | bool | None) -> str:
    model = name if pretrained is not None else name.split(":", 1)[-1]
    have = sorted({e.tag for e in entries() if e.model == model})
    what = f"{pretrained}:{name}" if pretrained not in (None, True) else name
    lists = by_surface("`vitlab models --pretrained`", "vitlab.list_models(pretrained=True)")
    if have:
        return f"no published checkpoint {what!r}; {model} has: {', '.join(have)} ({lists})"
    return f"no published checkpoint {what!r}; {lists} lists the names"


def dataset_matches(value: str | None, wanted: str) -> bool:
    if value is None:
        return False
    wanted = wanted.lower()
    return wanted == value.lower() or wanted in DATASET_ALIASES.get(value, ())


def select(model: str | None = None, dataset: str | None = None, resolution: int | None = None) -> list[Entry]:
    """Catalogue entries (not the index) filtered by architecture, pre-training or fine-tuning dataset, resolution."""
    out = []
    for e in entries():
        if e.format == "csv":
            continue
        if model and e.model != model:
            continue
        if dataset and not (dataset_matches(e.pretrain, dataset) or dataset_matches(e.finetune, dataset)):
            continue
        if resolution and e.resolution != resolution:
            continue
        out.append(e)
    return out

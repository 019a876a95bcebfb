"""Any of the ~50k AugReg runs by the filename its index gives it: `augreg:B_16-i21k-300ep-…` (pre-training) or
`augreg:B_16-i21k-300ep-…--imagenet2012-steps_20k-lr_0.01-res_384` (fine-tuned).

The index (gs://vit_models/augreg/index.csv, columns described in vit_jax/checkpoint.py `get_augreg_df`) is a
catalogue entry of its own, `augreg-index`, downloaded and cached like a checkpoint; a row's file is
`https://storage.googleapis.com/vit_models/augreg/{filename}.npz`.
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

from vitlab.errors import closest
from vitlab.hub.entry import Entry, index_entry
from vitlab.hub.fetch import fetch

AUGREG_URL = "https://storage.googleapis.com/vit_models/augreg/"
# Fine-tuning datasets whose class count vitlab knows (informative: the file's head is what counts).
ADAPT_CLASSES = {"imagenet2012": 1000, "cifar100": 100, "cifar10": 10, "oxford_iiit_pet": 37, "resisc45": 45,
                 "oxford_flowers102": 102, "sun397": 397}
PRETRAIN = {"i21k": ("i21k", 21843), "i21k_30": ("i21k", 21843), "i1k": ("i1k", 1000)}


def vitlab_model(paper_name: str) -> str:
    """The index's model names ("B/16", "R26+S/32", "R+Ti/16") as vitlab names ("ViT-B/16", "R26+ViT-S/32")."""
    stem, _, vit = paper_name.rpartition("+")
    return f"{stem}+ViT-{vit}" if stem else f"ViT-{vit}"


@cache
def _read_index(path: str, mtime: float) -> dict[str, dict[str, str]]:
    """filename -> row, for pre-training (`filename`) and fine-tuning (`adapt_filename`) names alike."""
    rows: dict[str, dict[str, str]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row.get("filename"):
                rows.setdefault(row["filename"], {**row, "_kind": "pretrain"})
            if row.get("adapt_filename"):
                rows[row["adapt_filename"]] = {**row, "_kind": "adapt"}
    return rows


def read_index(path: Path) -> dict[str, dict[str, str]]:
    return _read_index(str(path), path.stat().st_mtime)


def augreg_entry(filename: str, index: Path | None = None) -> Entry:
    """The entry of one AugReg run; the index is fetched (or read from the cache) to check the name exists."""
    filename = filename.removesuffix(".npz")
    if index is None:
        index = fetch(index_entry(), progress=False)
    rows = read_index(index)
    row = rows.get(filename)
    if row is None:
        close = closest(filename, rows, cutoff=0.8)  # long names share most of their letters
        hint = f"did you mean augreg:{close}?" if close else "the index's filename/adapt_filename columns list them"
        raise ValueError(f"augreg:{filename} is not a run of the AugReg index; {hint}")
    return _row_entry(filename, row)


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _row_entry(filename: str, row: dict[str, str]) -> Entry:
    pretrain, upstream_classes = PRETRAIN.get(row.get("ds", ""), (row.get("ds") or None, None))
    adapt = row["_kind"] == "adapt"
    params = _number(row.get("params"))
    top1 = _number(row.get("adapt_final_test")) if adapt else None
    resolution = _number(row.get("adapt_resolution")) if adapt else 224
    finetune = row.get("adapt_ds") if adapt else None
    return Entry(
        name=f"augreg:{filename}", tag="augreg", model=vitlab_model(row.get("name", "")), format="jax-npz",
        url=f"{AUGREG_URL}{filename}.npz", pretrain=pretrain,
        finetune="i1k" if finetune == "imagenet2012" else finetune,
        resolution=int(resolution) if resolution else None,
        num_classes=ADAPT_CLASSES.get(finetune or "") if adapt else upstream_classes,
        size=int(4 * params) if params else None, size_source="derived (index params)",
        top1=round(100 * top1, 2) if top1 is not None and top1 <= 1 else top1,
        top1_reference="AugReg index.csv adapt_final_test" if top1 is not None else None,
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), eval_resize="official",
        classes="imagenet1k" if finetune == "imagenet2012" else None, licence="Apache-2.0",
        reference="vit_models/augreg/index.csv",
    )

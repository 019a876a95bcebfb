"""What the two Hugging Face transformers formats (ViT: hf.py, BiT: hf_bit.py) share: the class a folder holds
(classifier or backbone), its class count and names (id2label), and the export folder (config.json, the image
processor's config, the model card, model.safetensors) written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vitlab.errors import WeightsError
from vitlab.files.outputs import mark
from vitlab.weights.card import CARD
from vitlab.weights.tensors import write_folder_atomically

PREPROCESSOR = "preprocessor_config.json"
HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", PREPROCESSOR, "README.md")


def hf_architecture(hf: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path, classes: tuple[str, str],
                    base: str) -> str:
    """The transformers class of a folder, one of (classifier, backbone): its config's `architectures`, else
    whether the tensors sit under the classifier's `base` prefix."""
    classifier, backbone = classes
    archs = hf.get("architectures") or []
    if archs:
        if archs[0] not in classes:
            raise WeightsError(path, f"architecture {archs[0]!r} is not supported",
                               f"vitlab reads {classifier} and {backbone} weights")  # fmt: skip
        return archs[0]
    return classifier if any(k.startswith(base) for k in tensors) else backbone


def hf_num_classes(hf: dict[str, Any], arch: str, classifier: str) -> int:
    """The head's class count of a config.json: id2label's length, else num_labels (transformers' default 2);
    0 for a backbone."""
    if arch != classifier:
        return 0
    return len(hf["id2label"]) if isinstance(hf.get("id2label"), dict) else int(hf.get("num_labels", 2))


def checkpoint_meta(hf: dict[str, Any], arch: str, num_classes: int, notes: list[str]) -> dict[str, Any]:
    """The WeightsRecord.meta of a folder read: its transformers class, id2label's names in index order (unless
    they are HF's placeholders LABEL_0, LABEL_1, …) and the notes on what was assumed or ignored."""
    meta: dict[str, Any] = {"hf_architecture": arch}
    id2label = hf.get("id2label")
    if num_classes and isinstance(id2label, dict):
        names = [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(num_classes)]  # JSON keys are strings
        if names != [f"LABEL_{i}" for i in range(num_classes)]:
            meta["class_names"] = names
    return {**meta, "notes": notes} if notes else meta


def label_maps(num_classes: int, class_names: list[str] | None) -> dict[str, Any]:
    """transformers' id2label / label2id (its own LABEL_i names when the model has none)."""
    if not num_classes:
        return {}
    names = list(class_names or [f"LABEL_{i}" for i in range(num_classes)])
    return {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}


def write_hf_folder(folder: str | Path, config_json: dict[str, Any], preprocessor: dict[str, Any], card: str,
                    tensors: dict[str, torch.Tensor]) -> None:
    """config.json, the image processor's config, the model card and model.safetensors, into a temporary folder
    renamed into place; an existing folder is replaced only if it holds nothing but an earlier export."""

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        (tmp / PREPROCESSOR).write_text(json.dumps(preprocessor, indent=2) + "\n", encoding="utf-8")
        (tmp / CARD).write_text(card, encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", **mark()})

    write_folder_atomically(folder, write, owned=HF_FILES)

"""What the two Hugging Face transformers formats (ViT: hf.py, BiT: hf_bit.py) share: the class a folder holds
(classifier or backbone), its class count and names (id2label), the image processor that reproduces a model's
evaluation pixels, and the export folder (config.json, the image processor's config, the model card,
model.safetensors) written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vitlab.constants import timm_resize_name
from vitlab.errors import WeightsError
from vitlab.files.outputs import mark
from vitlab.models.timm_compat import crop_pct_for, timm_eval_crop
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


# PIL's resampling numbers, which transformers' image processors use as `resample`.
RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3}


def image_processor(image_size: tuple[int, int], mean: Any, std: Any, eval_resize: str, squash_type: str
                    ) -> dict[str, Any]:
    """preprocessor_config.json for transformers that feeds the model what `vitlab.transforms` (eval, predict)
    feeds it under `eval_resize` (timm's fields for it, `timm_eval_crop`): the whole image squashed to the input
    size by `squash_type` ("official"); otherwise BitImageProcessor's resize (the short side to
    floor(size / crop_pct) for timm's "center" mode, both sides for "squash"), then the centre crop, with timm's
    interpolation (the short side is approximate for a non-square input size). transformers floors the crop offset
    where timm (torchvision) rounds it half to even: an image whose resized side exceeds the crop by 3 (mod 4) is
    cropped one pixel further up or left (docs/deployment.md)."""
    h, w = image_size
    fields = timm_eval_crop(image_size, eval_resize)
    normalise = {"do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(mean),
                 "image_std": list(std)}  # fmt: skip
    resample = RESAMPLE[fields["interpolation"]]
    if (fields["crop_pct"], fields["crop_mode"]) == (1.0, "squash"):
        return {"image_processor_type": squash_type, "do_resize": True, "size": {"height": h, "width": w},
                "resample": resample, **({"do_center_crop": False, "crop_size": {"height": h, "width": w}}
                                         if squash_type == "BitImageProcessor" else {}), **normalise}  # fmt: skip
    scaled = (math.floor(h / fields["crop_pct"]), math.floor(w / fields["crop_pct"]))
    size = {"shortest_edge": min(scaled)} if fields["crop_mode"] == "center" else {"height": scaled[0],
                                                                                    "width": scaled[1]}
    return {"image_processor_type": "BitImageProcessor", "do_resize": True, "size": size, "resample": resample,
            "do_center_crop": True, "crop_size": {"height": h, "width": w}, **normalise, "do_convert_rgb": True}


def eval_resize_from_processor(pre: dict[str, Any], image_size: tuple[int, int]) -> str | None:
    """The eval resize (timm's spelling) of an image processor that resizes and crops the centre to `image_size`
    (what `image_processor` writes, and timm-converted folders hold); None for one that squashes or that says
    neither (vitlab's default, "official", is that squash)."""
    size, crop = pre.get("size"), pre.get("crop_size")
    interpolation = {v: k for k, v in RESAMPLE.items()}.get(pre.get("resample"))
    if not (pre.get("do_center_crop") and pre.get("do_resize", True) and interpolation and isinstance(size, dict)
            and isinstance(crop, dict) and (crop.get("height"), crop.get("width")) == tuple(image_size)):
        return None
    side = max(image_size)
    try:
        if isinstance(size.get("shortest_edge"), int):
            return timm_resize_name(interpolation, crop_pct_for(min(image_size), size["shortest_edge"]), "center")
        if isinstance(size.get("height"), int) and size.get("height") == size.get("width"):
            return timm_resize_name(interpolation, crop_pct_for(side, size["height"]), "squash")
    except (ValueError, TypeError, ZeroDivisionError):
        return None
    return None


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

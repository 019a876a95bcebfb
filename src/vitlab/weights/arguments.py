"""The argument checks of the public entry points that read and write weights (`vitlab.load`, `vitlab.save`,
`vitlab.transforms`): a wrong type or an impossible size is a TypeError / ValueError naming the argument and the
fix, before any file is opened or tensor allocated."""

from __future__ import annotations

import os
from typing import Any

from vitlab.models.config import BiTConfig, ViTConfig
from vitlab.ranges import MAX_CLASSES, MAX_IMAGE_SIDE, is_int


def check_source(value: Any, what: str = "vitlab.load") -> None:
    """A weights path (str or os.PathLike) or a published name (str)."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{what} takes a path (str or pathlib.Path) or a published name such as "
                        f"'augreg-i21k:ViT-B/16', got {type(value).__name__}")


def check_load_sizes(image_size: Any, num_classes: Any) -> None:
    """`image_size` None, an integer or (height, width) within vitlab's limit; `num_classes` None or 0…MAX."""
    if image_size is not None:
        sides = (image_size, image_size) if is_int(image_size) else image_size
        if not (isinstance(sides, tuple | list) and len(sides) == 2 and all(is_int(s) for s in sides)):
            raise TypeError(f"image_size must be an integer or two integers (height, width), got {image_size!r}")
        if not all(1 <= s <= MAX_IMAGE_SIDE for s in sides):
            raise ValueError(f"image_size must be from 1 to {MAX_IMAGE_SIDE:,} pixels per side, got {image_size!r}")
    if num_classes is not None and not is_int(num_classes):
        raise TypeError(f"num_classes must be an integer (0: no classifier), got {num_classes!r}")
    if num_classes is not None and not 0 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes must be from 0 (no classifier) to {MAX_CLASSES:,}, got {num_classes}")


def check_model(model: Any) -> None:
    """A vitlab model: a module (or train.checkpoint's WeightsHolder) with a ViTConfig or BiTConfig `config`."""
    if not callable(getattr(model, "state_dict", None)):
        raise TypeError(f"vitlab.save takes a vitlab model (from vitlab.create_model or vitlab.load), got "
                        f"{type(model).__name__}; to save a bare state dict use safetensors.torch.save_file")
    if not isinstance(getattr(model, "config", None), ViTConfig | BiTConfig):
        raise TypeError(f"vitlab.save takes a vitlab model, and this {type(model).__name__} has no vitlab config; "
                        "save a bare module with safetensors.torch.save_file, or unwrap the vitlab model inside it")


def check_matches_config(model: Any, tensors: dict[str, Any], expected: dict[str, Any]) -> None:
    """ValueError when the model holds unmerged peft (LoRA) adapters, or its parameters no longer match what its
    config builds (a module replaced or removed after it was made, e.g. prune_intermediate_layers(prune_norm=True)),
    or when it no longer pools (timm's global_pool "", e.g. prune_intermediate_layers(prune_head=True)): `load`
    could not rebuild it."""
    if getattr(model, "unpooled", False):
        raise ValueError("vitlab.save: the model no longer pools (timm's global_pool '', set by "
                         "prune_intermediate_layers(prune_head=True) or reset_classifier(n, '')), which no vitlab "
                         "config describes, so vitlab.load could not rebuild it; save it before pruning its head, or "
                         "prune with prune_head=False")  # fmt: skip
    adapters = [name for name, module in getattr(model, "named_modules", list)()
                if type(module).__module__.split(".")[0] == "peft" and not hasattr(module, "peft_config")]
    if adapters:
        shown = ", ".join(adapters[:2]) + (f" and {len(adapters) - 2} more" if len(adapters) > 2 else "")
        raise ValueError(f"vitlab.save: the model holds peft adapters not merged into its weights ({shown}); merge "
                         "them first: model = peft_model.merge_and_unload(), then vitlab.save(model, path)")
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    reshaped = sorted(k for k in set(expected) & set(tensors) if tuple(expected[k]) != tuple(tensors[k].shape))
    for what, names in (("lacks parameters its config describes", missing),
                        ("has parameters its config does not describe", extra),
                        ("has parameters of other shapes than its config describes", reshaped)):
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ValueError(f"vitlab.save: the model {what} ({shown}), "
                             "so vitlab.load could not rebuild it (a module replaced or pruned after creation, e.g. "
                             "prune_intermediate_layers(prune_norm=True)); save the model before changing its modules")

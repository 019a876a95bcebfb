"""torch.hub entry points: `torch.hub.load("path/to/vitlab", "vit_b16", source="local", num_classes=10)`, and, as
timm's hubconf has one per model, every timm name vitlab builds under that name:
`torch.hub.load("path/to/vitlab", "vit_tiny_patch16_224", source="local")`.

Each entry builds the named vitlab model (`vitlab.create_model`), or with `weights=` loads any file or folder
`vitlab.load` reads (official .npz, timm, HF transformers, vitlab safetensors, a run directory) and holds the
architecture the entry names (another is refused: ValueError). Nothing is
downloaded unless asked, as `vitlab.create_model(..., pretrained=True)` is asked.
"""

import os
import re
import sys

dependencies = ["torch", "numpy", "safetensors"]

try:
    import vitlab
except ImportError:  # a clone that was not pip-installed: the package lives in src/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
    import vitlab


def _entry_name(model_name: str) -> str:
    """"ViT-B/16" -> "vit_b16", "R50+ViT-B/16" -> "r50_vit_b16", "BiT-R50x1" -> "bit_r50x1"."""
    return re.sub(r"[^a-z0-9]+", "_", model_name.lower().replace("/", "")).strip("_")


def _load_as(model_name: str, weights, **kwargs):
    """vitlab.load(weights), refused in one line (ValueError) when the file holds another architecture than the
    entry point names: `vit_b16(weights="vit_s16.safetensors")` must not return a ViT-S."""
    import torch

    from vitlab.models.registry import architecture_differences, describe_architecture

    with torch.device("meta"):  # the architecture the name builds, without allocating it
        expected = vitlab.create_model(model_name).config
    model = vitlab.load(weights, **kwargs)
    differences = architecture_differences(expected, model.config)
    if differences:
        raise ValueError(f"{_entry_name(model_name)}: {weights} holds {describe_architecture(model.config)} "
                         f"({'; '.join(differences)}), not {model_name}; use that architecture's entry point, "
                         "or vitlab.load")
    return model


def _make_entry(model_name: str, entry_name: str):
    def entry(weights=None, **kwargs):
        if weights is not None:
            return _load_as(model_name, weights, **kwargs)
        return vitlab.create_model(model_name, **kwargs)

    entry.__name__ = entry_name
    entry.__doc__ = (f"{model_name}: a fresh model (keyword arguments override its config, e.g. num_classes=10, "
                     f"image_size=384, or timm's img_size=384, drop_path_rate=0.1, features_only=True), or "
                     f"weights=PATH to load a file with vitlab.load(PATH, **kwargs).")
    return entry


for _name in vitlab.list_models():
    globals()[_entry_name(_name)] = _make_entry(_name, _entry_name(_name))
for _name in vitlab.list_models("*"):  # the timm names (and vitlab's own, already entries): each under its own name
    if _name not in vitlab.list_models():
        globals()[_name] = _make_entry(_name, _name)

"""vitlab: Vision Transformers exact to the paper (Dosovitskiy et al., ICLR 2021).

    import vitlab
    model = vitlab.create_model("ViT-B/16", num_classes=10)   # vitlab or timm names, fresh or pretrained=True
    model = vitlab.load("ViT-B_16.npz")                        # official .npz, BiT .npz, timm, HF, vitlab, runs
    x = vitlab.transforms(model)("photo.jpg")                  # the model's exact evaluation pixels
    logits = model(x[None])
    vitlab.save(model, "model.safetensors")                    # load(save(m)) is exact
    vitlab.fit("finetune", init="model.safetensors", data="photos/", epochs=3, out="runs/ft")
    vitlab.export_onnx(model, "model.onnx")                    # checked in ONNX Runtime

The command line is `vitlab <verb>` (`vitlab --help`). The configuration dataclasses are `vitlab.ViTConfig`,
`vitlab.BiTConfig` and `vitlab.ResNetConfig`.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and the API reference (read, never run)
    from vitlab.api import create_model, export_onnx, fit, list_models, load, save, transforms
    from vitlab.models import BiTConfig as BiTConfig
    from vitlab.models import ResNetConfig as ResNetConfig
    from vitlab.models import ViTConfig as ViTConfig

# Each public name and the module that holds it, imported on first use: `vitlab --help` imports the command line,
# which is inside this package, and must not pay for torch.
_PUBLIC = {
    "create_model": "vitlab.api", "export_onnx": "vitlab.api", "fit": "vitlab.api", "list_models": "vitlab.api",
    "load": "vitlab.api", "save": "vitlab.api", "transforms": "vitlab.api",
    "BiTConfig": "vitlab.models", "ResNetConfig": "vitlab.models", "ViTConfig": "vitlab.models",
}

# help(vitlab) shows these; the config dataclasses stay importable (vitlab.ViTConfig) without their generated
# methods filling the page.
__all__ = ["create_model", "export_onnx", "fit", "list_models", "load", "save", "transforms", "__version__"]


def __getattr__(name: str) -> Any:
    import importlib
    import importlib.util

    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value  # read once: later look-ups are plain attributes
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # `import vitlab; vitlab.models.ViTConfig`
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the subpackages imported so far and the module's dunders: not the names this file uses
    itself (Any, TYPE_CHECKING), which are no part of vitlab."""
    import types

    loaded = {k for k, v in globals().items() if isinstance(v, types.ModuleType) and v.__name__ == f"{__name__}.{k}"}
    dunders = {k for k in globals() if k.startswith("__") and k.endswith("__")}
    return sorted({*__all__, *_PUBLIC, *loaded, *dunders})

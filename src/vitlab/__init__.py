"""vitlab: Vision Transformers exact to the paper (Dosovitskiy et al., ICLR 2021)."""

from .models import BiTConfig, ResNetConfig, ViTConfig, create_model, list_models

__version__ = "0.1.0"


def load(path, image_size=None, num_classes=None, pretrained=None, **kwargs):
    """Load any supported weights file or folder (see `vitlab.weights.load`), or a published checkpoint by name,
    downloaded once into the cache (see `vitlab.hub`): `load("ViT-B/16", pretrained="augreg-i21k")`,
    `load("augreg-i21k:ViT-B/16")`, `load("hf-hub:google/vit-base-patch16-224")`."""
    from .hub import load as _load

    return _load(path, pretrained=pretrained, image_size=image_size, num_classes=num_classes, **kwargs)


def save(model, path) -> None:
    """Write vitlab safetensors with the config in the metadata; `load(save(m))` is exact."""
    from .weights.io import save as _save

    _save(model, path)


__all__ = ["BiTConfig", "ResNetConfig", "ViTConfig", "create_model", "list_models", "load", "save", "__version__"]

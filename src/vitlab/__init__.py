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

from vitlab.api import create_model, export_onnx, fit, list_models, load, save, transforms
from vitlab.models import BiTConfig as BiTConfig  # re-exported: vitlab.ViTConfig etc.
from vitlab.models import ResNetConfig as ResNetConfig
from vitlab.models import ViTConfig as ViTConfig

__version__ = "0.1.0"

# help(vitlab) shows these; the config dataclasses stay importable (vitlab.ViTConfig) without their generated
# methods filling the page.
__all__ = ["create_model", "export_onnx", "fit", "list_models", "load", "save", "transforms", "__version__"]

"""vitlab: Vision Transformers exact to the paper (Dosovitskiy et al., ICLR 2021)."""

import os

from .data.transforms import model_transform
from .factory import create_model, list_models
from .models import BiTConfig, ResNetConfig, ViTConfig
from .weights.load import load as load_weights
from .weights.load import preprocessing
from .weights.vitlab_format import save as save_weights

__version__ = "0.1.0"


def load(path, image_size=None, num_classes=None, pretrained=None, precision=None, **kwargs):
    """Load any supported weights file or folder (see `vitlab.weights.load`), or a published checkpoint by name,
    downloaded once into the cache (see `vitlab.hub`): `load("ViT-B/16", pretrained="augreg-i21k")`,
    `load("augreg-i21k:ViT-B/16")`, `load("hf-hub:google/vit-base-patch16-224")`.

    `precision` (auto, fp32, bf16, int8; None: float32 as stored) prepares the model for inference on the CPU as
    `vitlab eval --precision` does (vitlab.precision): `model.precision` is the choice and its reason. A bf16 ViT
    holds bf16 weights and takes float32 images; hybrids and BiT keep float32 weights and compute in bf16 under
    `vitlab.precision.autocast_for("cpu", model.precision)`."""
    model = load_weights(path, image_size=image_size, num_classes=num_classes, pretrained=pretrained, **kwargs)
    if precision is None:
        return model
    from .precision import model_width, prepare_for_inference, resolve_precision

    chosen = resolve_precision(precision, next(model.parameters()).device, use="infer", width=model_width(model))
    model = prepare_for_inference(model, chosen)
    model.precision = chosen
    return model


def save(model, path, *, force=False) -> None:
    """Write vitlab safetensors with the config in the metadata; `load(save(m))` is exact (class names and the
    evaluation resize a loaded model carries are kept). An existing `path` is replaced only if vitlab wrote it
    (its metadata says so) or with force=True; a device, FIFO, socket, symbolic link or folder there never is.
    A refusal raises FileExistsError with a one-line message (a .pt/.pth name: ValueError)."""
    resize = getattr(model, "eval_resize", None)
    save_weights(model, path, meta={"eval_resize": resize} if resize else None, force=force)


def export_onnx(model_or_weights, path, *, precision="fp32", batch_size=2, opset=None, force=False):
    """Write a model (or weights: path, run directory, published name) as ONNX with a dynamic batch dimension,
    after checking ONNX Runtime's output against PyTorch's (vitlab.deploy; `pip install 'vitlab[onnx]'`).
    precision: fp32 (auto) or int8. Returns the report (`.line()`, `.check.error`); a failed check raises
    ValueError and writes nothing."""
    from .deploy import export_onnx as export_model
    from .deploy import export_weights

    export = export_weights if isinstance(model_or_weights, str | os.PathLike) else export_model
    return export(model_or_weights, path, precision=precision, batch_size=batch_size, opset=opset, force=force)


def fit(recipe=None, **settings):
    """Train, or fine-tune with `init=WEIGHTS`, as `vitlab train` / `vitlab finetune` do, showing the same progress;
    returns the result with the trained model (vitlab.train.fit): `settings` are the command line's flags as
    keywords (`data`, `init`, `out`, `epochs` or `steps`, `lr`, …).

        result = vitlab.fit("finetune", init="vit.npz", data="photos/", epochs=10, out="runs/photos")
        result.metrics["top1"], result.out_dir, result.model
    """
    from .train.fit import fit as fit_run

    return fit_run(recipe, **settings)


def transforms(model_or_weights, train=False, seed=0, **train_options):
    """The pre-processing of a model (or of weights: path, run directory, published name) as a callable
    image -> float32 (3, H, W) tensor; the image is a PIL image, a uint8 (H, W, 3) array or a file path.
    train=False: exactly what `vitlab eval` feeds the model (its size, its recorded evaluation resize, its
    mean/std). train=True: the training augmentation (the official inception crop and flip unless
    `train_options` set crop, crop_scale, crop_ratio, flip), drawing from random.Random(seed).

        model = vitlab.load("runs/demo")
        x = vitlab.transforms(model)("digit.png")
        probs = model(x[None]).softmax(-1)[0]
    """
    config, eval_resize = preprocessing(model_or_weights)
    return model_transform(config.image_size, config.mean, config.std, eval_resize, train, seed, **train_options)


__all__ = ["BiTConfig", "ResNetConfig", "ViTConfig", "create_model", "export_onnx", "list_models", "load", "save",
           "fit", "transforms", "__version__"]

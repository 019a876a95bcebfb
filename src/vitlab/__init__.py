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

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

from vitlab.data.transforms import model_transform
from vitlab.factory import create_model, list_models
from vitlab.models import BiTConfig as BiTConfig  # re-exported: vitlab.ViTConfig etc.
from vitlab.models import ResNetConfig as ResNetConfig
from vitlab.models import ViTConfig as ViTConfig
from vitlab.weights.load import load as load_weights
from vitlab.weights.load import preprocessing
from vitlab.weights.vitlab_format import save as save_weights

__version__ = "0.1.0"


def load(
    path: str | os.PathLike,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    pretrained: str | bool | None = None,
    precision: str | None = None,
    *,
    arch: str | None = None,
) -> nn.Module:
    """A model in eval mode, its architecture read from the weights (nothing else needed).

    Args:
        path: a weights file or folder in any supported format (vitlab safetensors, the official JAX `.npz`, BiT
            `.npz`, a timm hub folder or state dict, a Hugging Face transformers folder), a run or checkpoint
            directory, or a published name, downloaded once into the cache: `"augreg-i21k:ViT-B/16"`,
            `"hf-hub:google/vit-base-patch16-224"`, a timm name with its tag, or a model name with `pretrained`.
        image_size: a new native input size; the position embedding is resampled as the official code does
            (bilinear, corners aligned, prefix entries kept).
        num_classes: a class count other than the file's attaches a new zero-initialised head (the paper's
            fine-tuning rule); 0 removes the head.
        pretrained: with a model name, the published tag to load (`"augreg-i21k"`; True: the default tag).
        precision: auto, fp32, bf16 or int8 (None: float32 as stored) prepares the model for inference as
            `vitlab eval --precision` does.
        arch: the timm architecture name of a bare timm state dict whose shapes alone do not determine it.

    Returns:
        The model (`torch.nn.Module`) with `.config`; a published checkpoint also carries `.hub_entry` and,
        for ImageNet classifiers, `.class_names`. Raises `vitlab.weights.WeightsError` (one line naming the file,
        the tensor and the fix) for a file it cannot read; nothing is loaded partially.

    `precision` (auto, fp32, bf16, int8; None: float32 as stored) prepares the model for inference on the CPU as
    `vitlab eval --precision` does (vitlab.precision): `model.precision` is the choice and its reason. A bf16 ViT
    holds bf16 weights and takes float32 images; hybrids and BiT keep float32 weights and compute in bf16 under
    `vitlab.precision.autocast_for("cpu", model.precision)`."""
    model = load_weights(path, image_size=image_size, num_classes=num_classes, pretrained=pretrained, arch=arch)
    if precision is None:
        return model
    from vitlab.precision import model_width, prepare_for_inference, resolve_precision

    chosen = resolve_precision(precision, next(model.parameters()).device, use="infer", width=model_width(model))
    model = prepare_for_inference(model, chosen)
    model.precision = chosen
    return model


def save(model: nn.Module, path: str | os.PathLike, *, force: bool = False) -> None:
    """Write vitlab safetensors with the config in the metadata; `load(save(m))` is exact (class names and the
    evaluation resize a loaded model carries are kept). The write is atomic (temporary file + rename).

    Args:
        model: a vitlab model (`create_model`, `load`).
        path: the `.safetensors` file to write. An existing file is replaced only if vitlab wrote it (its metadata
            says so); a device, FIFO, socket, symbolic link or folder there never is.
        force: replace an existing regular file that vitlab did not write.

    Raises:
        FileExistsError: the one-line refusal (a `.pt`/`.pth` name: ValueError, pickles are not written).
    """
    resize = getattr(model, "eval_resize", None)
    save_weights(model, path, meta={"eval_resize": resize} if resize else None, force=force)


def export_onnx(model_or_weights: nn.Module | str | os.PathLike, path: str | os.PathLike, *, precision: str = "fp32",
                batch_size: int = 2, opset: int | None = None, force: bool = False) -> Any:
    """Write a model as ONNX with a dynamic batch dimension, after checking ONNX Runtime's output against
    PyTorch's (`vitlab.deploy`; needs `pip install 'vitlab[onnx]'`).

    Args:
        model_or_weights: a model, or weights `load` reads (path, run directory, published name).
        path: the `.onnx` file, written atomically only after the check passes.
        precision: fp32 (or auto) or int8 (ONNX Runtime's dynamic quantization of the encoder's matmuls).
        batch_size: the batch the export traces; the file also runs at other batch sizes (checked at two).
        opset: the ONNX opset (None: the exporter's default).
        force: replace an existing file that vitlab did not write.

    Returns:
        The export report (`.line()` says what was checked and how close). A failed check raises ValueError
        and writes nothing.
    """
    from vitlab.deploy import export_onnx as export_model
    from vitlab.deploy import export_weights

    export = export_weights if isinstance(model_or_weights, str | os.PathLike) else export_model
    return export(model_or_weights, path, precision=precision, batch_size=batch_size, opset=opset, force=force)


def fit(recipe: str | None = None, **settings: Any) -> Any:
    """Train, or fine-tune with `init=WEIGHTS`, as `vitlab train` / `vitlab finetune` do, showing the same progress;
    returns the result with the trained model (vitlab.train.fit).

    Args:
        recipe: a recipe name (`vitlab recipes`; None: the demo recipe, or `finetune` with `init`).
        **settings: the command line's flags as keywords (`data`, `init`, `out`, `epochs` or `steps`, `lr`,
            `batch_size`, `lr_sweep`, …), checked and resolved as the command line's are.

        result = vitlab.fit("finetune", init="vit.npz", data="photos/", epochs=10, out="runs/photos")
        result.metrics["top1"], result.out_dir, result.model
    """
    from vitlab.train.fit import fit as fit_run

    return fit_run(recipe, **settings)


def transforms(model_or_weights: nn.Module | str | os.PathLike, train: bool = False, seed: int = 0,
               **train_options: Any) -> Callable[[Any], torch.Tensor]:
    """The pre-processing of a model as a callable image -> float32 (3, H, W) tensor; the image is a PIL image,
    a uint8 (H, W, 3) array or a file path (decoded exactly: the same pixels as timm's and HF's pipelines).

    Args:
        model_or_weights: a model, or weights (path, run directory, published name).
        train: False: exactly what `vitlab eval` feeds the model (its size, its recorded evaluation resize, its
            mean/std). True: the training augmentation (the official inception crop and flip).
        seed: the augmentation draws from random.Random(seed).
        **train_options: crop, crop_scale, crop_ratio, flip for the training augmentation.

    Example:
        ```python
        model = vitlab.load("runs/demo")
        x = vitlab.transforms(model)("digit.png")
        probs = model(x[None]).softmax(-1)[0]
        ```
    """
    config, eval_resize = preprocessing(model_or_weights)
    return model_transform(config.image_size, config.mean, config.std, eval_resize, train, seed, **train_options)


# help(vitlab) shows these; the config dataclasses stay importable (vitlab.ViTConfig) without their generated
# methods filling the page.
__all__ = ["create_model", "export_onnx", "fit", "list_models", "load", "save", "transforms", "__version__"]

"""Top-k classes of image files with trained weights: the library side of `vitlab predict`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ..data import EvalTransform, normalize
from ..data.errors import DataError
from ..data.folder import IMAGE_EXTENSIONS
from ..data.sources import DECODE_ERRORS, ImageSplit
from ..device import pick_device
from ..models.timm_compat import eval_resize_of
from ..precision import autocast_for
from ..progress import progress as progress_bar
from .inference import load_for_inference, with_precision


def expand_images(paths: list[str | Path]) -> list[str]:
    """Image files as given, each folder replaced by the images under it (sorted, any depth)."""
    images: list[str] = []
    for path in map(Path, paths):
        if not path.is_dir():
            images.append(str(path))
            continue
        found = sorted(str(p) for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not found:
            raise DataError(f"{path} is a folder without images ({', '.join(IMAGE_EXTENSIONS)}); pass image files "
                            "or a folder that holds some")
        images += found
    return images


@torch.no_grad()
def predict(weights: str | Path, images: list[str], top_k: int | None = None, device: str = "auto",
            precision: str = "auto") -> list[dict[str, Any]]:
    """`vitlab predict`: for each image (a folder: every image under it), the top-k classes with softmax
    probabilities. `top_k` None: 5, or all classes of a model with fewer; a given `top_k` above the class count
    shows all of them, with a warning. `precision`: auto, fp32, bf16 or int8 (vitlab.precision; the choice is
    logged)."""
    dev = pick_device(device)
    model, names = load_for_inference(weights, dev)
    model, chosen = with_precision(model, dev, precision)
    logging.getLogger("vitlab").info("precision %s (%s)", chosen.name, chosen.reason)
    images = expand_images(images)
    if top_k is None:
        top_k = min(5, len(names))
    elif top_k > len(names):
        logging.getLogger("vitlab").warning("top-k %d is more than the model's %d classes: showing all %d",
                                            top_k, len(names), len(names))
    transform = EvalTransform(model.config.image_size, eval_resize_of(model))
    split = ImageSplit("predict", torch.zeros(len(images), dtype=torch.long).numpy(), names, paths=list(images))
    results = []
    for i, path in enumerate(progress_bar(images, desc="predict", unit="img")):
        try:
            arr = transform(split.load(i, transform.min_source_size))
        except (FileNotFoundError, *DECODE_ERRORS) as err:
            raise DataError(f"cannot read image {path}: {type(err).__name__}: {err}") from None
        x = torch.tensor(arr).permute(2, 0, 1)[None].to(dev)  # (1, 3, H, W) uint8
        with autocast_for(dev, chosen):
            logits = model(normalize(x, model.config.mean, model.config.std))
        probs = logits.float().softmax(-1)[0]
        if not torch.isfinite(probs).all():
            raise ValueError(f"the model's output for {path} is not finite (NaN or inf); check the weights")
        top = probs.topk(min(top_k, probs.numel()))
        results.append({
            "image": str(path),
            "top": [{"class": names[j], "index": int(j), "probability": float(p)}
                    for p, j in zip(top.values.tolist(), top.indices.tolist(), strict=True)],
        })
    return results

"""Classify one image with an ONNX file `vitlab export` wrote, in ONNX Runtime alone (no torch, no vitlab)."""

import json

import numpy as np
import onnxruntime as ort
from PIL import Image


def classify(onnx_path: str, image_path: str, k: int = 5) -> list[tuple[str, float]]:
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map  # what vitlab wrote: see the table above
    height, width = json.loads(meta["image_size"])
    mean = np.array(json.loads(meta["mean"]), dtype=np.float32)
    std = np.array(json.loads(meta["std"]), dtype=np.float32)
    if meta.get("eval_resize", "official") != "official":
        raise NotImplementedError(f"this snippet resizes as 'official'; the file asks for {meta['eval_resize']}")
    # "official": the whole image to the model's size, bilinear, aspect ratio ignored
    image = Image.open(image_path).convert("RGB").resize((width, height), Image.Resampling.BILINEAR)
    pixels = (np.asarray(image, dtype=np.float32) / 255 - mean) / std  # (H, W, 3)
    batch = pixels.transpose(2, 0, 1)[None]  # (1, 3, H, W): the input `pixels`, any batch size
    logits = session.run(None, {session.get_inputs()[0].name: batch})[0][0]  # the output `logits`
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    names = json.loads(meta["class_names"]) if "class_names" in meta else [str(i) for i in range(len(probs))]
    top = np.argsort(-probs)[:k]
    return [(names[i], float(probs[i])) for i in top]

"""The one inference set-up: weights (or a model) on a device, in the precision it computes in, optionally
compiled, with the autocast of that precision. `vitlab.load(precision=)`, `vitlab eval`, `predict`, `fewshot`,
`analyze`, `bench` and the experiments all open a session, so a precision means the same model everywhere.

    session = open_session("model.safetensors", device="auto", precision="auto")
    with torch.inference_mode(), session.autocast():
        logits = session.model(x)
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from vitlab.runtime.device import pick_device
from vitlab.runtime.precision import (
    Precision,
    autocast_for,
    computed_precision,
    model_width,
    prepare_for_inference,
    resolve_precision,
)
from vitlab.weights.load import load


@dataclass(frozen=True)
class InferenceSession:
    """A model ready for inference: on `device`, in eval mode, in the form `precision` computes in fastest, and
    its class names (the weights' own, else the class indices as text; none for a model without a vitlab
    config)."""

    model: nn.Module
    device: torch.device
    precision: Precision
    class_names: tuple[str, ...]

    def autocast(self) -> AbstractContextManager:
        """What the model's computations run under: bf16 autocast for bf16, nothing otherwise."""
        return autocast_for(self.device, self.precision)


def open_session(
    weights: nn.Module | str | os.PathLike, *, device: str | torch.device = "auto",
    precision: str | Precision = "auto", compile: bool = False, image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None, cast_weights: bool = True,
) -> InferenceSession:
    """A session for `weights`: a model, or anything `vitlab.load` reads (a file or folder, a run or checkpoint
    directory, a published name) with `image_size` / `num_classes` as `load` takes them.

    `device`: auto, cpu, cuda, cuda:N (`pick_device`). `precision`: auto, fp32, bf16 or int8, resolved for
    inference on that device and the model's width (`resolve_precision`), or a choice already resolved; the
    session's `precision` is what the prepared model computes in (`computed_precision`: a BiT asked for int8 says
    fp32). `cast_weights`: prepare the model in the precision's fastest form (`prepare_for_inference`: every public
    forward path computes in it, float32 in and out); False keeps the float32 model as it is, computing bf16 only
    under `autocast()`. `compile`: wrap the prepared model with `torch.compile` (the wrapper still exposes `config`
    and `class_names`; compiling costs seconds, see BENCHMARKS.md)."""
    dev = pick_device(str(device))  # before the weights are read: a device that is not there is refused at once
    if isinstance(weights, nn.Module):
        if image_size is not None or num_classes is not None:
            raise ValueError("image_size and num_classes apply to weights being loaded, not to a model")
        model = weights
    else:
        model = load(weights, image_size=image_size, num_classes=num_classes)
    model = model.to(dev).eval()
    classes = getattr(getattr(model, "config", None), "num_classes", 0)  # 0 for a model of another library
    names = getattr(model, "class_names", None) or [str(i) for i in range(classes)]
    chosen = precision if isinstance(precision, Precision) else resolve_precision(
        precision, dev, use="infer", width=model_width(model))
    if cast_weights:
        model = prepare_for_inference(model, chosen)
        chosen = computed_precision(model, chosen)
    elif chosen.name == "int8":
        raise ValueError("int8 computes in int8 Linear layers, which replace the float32 weights: it needs "
                         "cast_weights; use auto, fp32 or bf16 here")
    if compile:
        model = torch.compile(model)
    return InferenceSession(model, dev, chosen, tuple(names))

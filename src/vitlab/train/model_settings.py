"""The model a run's settings describe, checked at resolution (so `--print-config` refuses what training would):
`model_args` the named model has, and a `--model` that agrees with the `--init` weights fine-tuning starts from.

Fine-tuning keeps the architecture of its initial weights: a `--model` naming another network would be recorded
(banner, config.json, weights' name) while the weights' own was trained, so it is refused; one naming the same
network is kept as the run's label.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..models.config import BiTConfig
from ..models.registry import architecture_differences, describe_architecture, model_config

# model_args keys the command line sets, by their flags
FLAGS = {"depth": "--depth", "width": "--width", "num_heads": "--heads", "mlp_dim": "--mlp-dim"}
# Fields the run sets itself (from --image-size, the data's classes, --dropout …), never through model_args.
_RUN_FIELDS = ("image_size", "num_classes", "name")


def _named(keys: list[str]) -> str:
    return ", ".join(FLAGS.get(k, k) for k in sorted(keys))


def check_model_args(model: str, model_args: Mapping[str, Any]) -> None:
    """ValueError unless every model_args key is a setting of `model`'s config and the result is a valid model."""
    base = model_config(model)  # an unknown name: its own one-line error
    fields = {f.name for f in dataclasses.fields(base)} - set(_RUN_FIELDS)
    run_set = [k for k in model_args if k in _RUN_FIELDS]
    if run_set:
        raise ValueError(f"model_args {_named(run_set)}: set by the run itself (--image-size, the data's classes), "
                         "not by model_args; remove it there")
    unknown = [k for k in model_args if k not in fields]
    if unknown:
        kind = ("a BiT ResNetV2, whose settings are layers and width_factor" if isinstance(base, BiTConfig) else
                "a ViT, whose settings include depth, width, num_heads, mlp_dim, patch_size, classifier, pos_embed")
        raise ValueError(f"{_named(unknown)} does not apply to {model} ({kind}); leave it out or choose another "
                         "--model")
    try:
        model_config(model, **model_args)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model_args of {model}: {err}") from None


def check_against_init(values: Mapping[str, Any], sources: Mapping[str, str], checkpoint: Any) -> None:
    """ValueError when `model` or `model_args`, set by a layer after the initial weights, describe a network
    other than the weights' (which is what fine-tuning builds)."""
    config = checkpoint.config
    own = config.name or describe_architecture(config)
    init = values.get("init")
    if values["model_args"] and not sources["model_args"].startswith("weights "):
        raise ValueError(f"{_named(list(values['model_args']))} ({sources['model_args']}) shape a model built from "
                         f"scratch; fine-tuning keeps the architecture of --init {init} ({own}): leave them out")
    model = values["model"]
    if model == own or sources["model"].startswith("weights "):
        return
    try:
        named = model_config(model)
    except ValueError:
        named = None
    differences = architecture_differences(named, config) if named is not None else ["not a listed variant"]
    if differences:
        raise ValueError(f"--model {model} ({sources['model']}) contradicts --init {init}: its weights are {own} "
                         f"({'; '.join(differences[:3])}); fine-tuning keeps the weights' architecture, so leave "
                         "--model out")

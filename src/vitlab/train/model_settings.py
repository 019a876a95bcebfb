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

from vitlab.models.config import BiTConfig
from vitlab.models.registry import architecture_differences, describe_architecture, model_config

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
    other than the weights' (which is what fine-tuning builds); naming the same network is fine."""
    config = checkpoint.config
    own = config.name or describe_architecture(config)
    model, model_args = values["model"], dict(values["model_args"])
    model_given = not sources["model"].startswith("weights ")
    args_given = bool(model_args) and not sources["model_args"].startswith("weights ")
    if not (model_given or args_given) or (model == own and not model_args):
        return
    try:  # the weights' own label ("ViT/4 (depth 4, …)") is no variant name: the flags then change the weights'
        named = model_config(model, **model_args) if model != own else config.replace(**model_args)
    except (TypeError, ValueError):
        named = None
    differences = architecture_differences(named, config) if named is not None else ["not a listed variant"]
    if not differences:
        return
    said = ([f"--model {model} ({sources['model']})"] if model_given else []) + (
        [", ".join(f"{FLAGS.get(k, k)} {v}" for k, v in sorted(model_args.items())) + f" ({sources['model_args']})"]
        if args_given else [])
    raise ValueError(f"{' and '.join(said)} contradict{'s' if len(said) == 1 else ''} --init {values.get('init')}: "
                     f"its weights are {own} ({'; '.join(differences[:3])}); fine-tuning keeps the weights' "
                     "architecture, so leave them out")

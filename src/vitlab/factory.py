"""`vitlab.create_model`: vitlab's names ("ViT-B/16") and timm's ("vit_base_patch16_224[.TAG]",
"resnetv2_50x1_bit", "vit_base_r50_s16_384"), vitlab's keywords (image_size, dropout) and timm's (img_size,
drop_rate, drop_path_rate, global_pool, class_token), fresh or `pretrained`, whole or `features_only`.

timm names build the vitlab model of that architecture at the name's resolution, with the class count of the tag
(timm's default tag when the name has none), as timm.create_model(name, pretrained=False) does; pretrained=True
loads `hf-hub:timm/ARCH.TAG` (vitlab.weights.load). The table of names and tags is the catalogue's (hub/catalogue.json).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .hub.catalogue import timm_name
from .models.config import BiTConfig, ModelConfig
from .models.registry import build_model, model_config
from .models.timm_compat import FeatureExtractor
from .weights.load import load

# timm keyword -> vitlab config field (global_pool and class_token choose `classifier`, mlp_ratio `mlp_dim`)
TIMM_KEYWORDS = {"img_size": "image_size", "drop_rate": "dropout", "attn_drop_rate": "attn_dropout",
                 "embed_dim": "width"}  # fmt: skip
# Settings that change no parameter: a loaded model takes them without touching its weights.
REGULARISATION = ("dropout", "attn_dropout", "drop_path_rate")
POOLS = {"token": "token", "avg": "gap"}


def create_model(
    name: str, /, pretrained: bool | str = False, features_only: bool = False,
    out_indices: int | list[int] | tuple[int, ...] | None = None, **kwargs: Any,
) -> nn.Module:
    """A model by vitlab or timm name. `pretrained=True` loads the published weights (timm names: the tag in the
    name, else timm's default tag; vitlab names: the catalogue's default tags; a string: that vitlab tag).
    `features_only=True` returns timm's feature extractor: a list of (N, C, H, W) maps at `out_indices`
    (ViT: the last 3 blocks by default; BiT: the root and every stage), described by `.feature_info`."""
    overrides = vitlab_overrides(kwargs)
    if pretrained:
        model = _load_pretrained(name, pretrained, overrides)
    else:
        model = build_model(model_config_for(name, overrides))
    if not features_only:
        if out_indices is not None:
            raise ValueError("out_indices applies only with features_only=True")
        return model
    if out_indices is None:
        out_indices = (0, 1, 2, 3, 4) if isinstance(model.config, BiTConfig) else 3
    return FeatureExtractor(model, out_indices)


def vitlab_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """timm's keywords as vitlab config fields; the pooling keywords as vitlab's `classifier`."""
    out = {TIMM_KEYWORDS.get(k, k): v for k, v in kwargs.items() if k not in ("global_pool", "class_token")}
    both = [k for k in kwargs if k in TIMM_KEYWORDS and TIMM_KEYWORDS[k] in kwargs]
    if both:
        raise ValueError(f"{both[0]} and {TIMM_KEYWORDS[both[0]]} name the same setting; pass one")
    if "mlp_ratio" in out:
        ratio, width = out.pop("mlp_ratio"), out.get("width")
        if width is None:
            raise ValueError("mlp_ratio needs embed_dim (or width) beside it; or pass mlp_dim")
        out["mlp_dim"] = int(width * ratio)
    pool, cls = kwargs.get("global_pool"), kwargs.get("class_token")
    if pool is not None or cls is not None:
        out["classifier"] = _classifier(pool, cls)
    return out


def _classifier(pool: str | None, class_token: bool | None) -> str:
    if pool is not None and pool not in POOLS:
        raise ValueError(f"global_pool={pool!r}: vitlab pools with 'token' (class token) or 'avg' (GAP)")
    if pool is None:
        return "token" if class_token else "gap"
    if class_token is not None and bool(class_token) != (pool == "token"):
        raise ValueError(f"global_pool={pool!r} with class_token={class_token}: the paper's 'token' classifier "
                         "has a class token and its 'avg' (GAP) has none")  # fmt: skip
    return POOLS[pool]


def model_config_for(name: str, overrides: dict[str, Any]) -> ModelConfig:
    """The config of a vitlab or timm name with vitlab-field overrides; ValueError naming a bad keyword."""
    timm = timm_name(name)
    base = name
    if timm is not None:
        base = timm.model
        overrides = {"num_classes": timm.num_classes, **overrides}
        if not timm.arch.startswith("resnetv2_"):
            overrides = {"image_size": timm.resolution, **overrides}
    if overrides.get("classifier") == "gap" and base.startswith("ViT-") and not base.endswith("-gap"):
        base, overrides = base + "-gap", {k: v for k, v in overrides.items() if k != "classifier"}
    if isinstance(model_config(base), BiTConfig):
        overrides = _bit_overrides(overrides)
    try:
        return model_config(base, **overrides)
    except TypeError as e:
        raise ValueError(_unknown_keyword(base, overrides, e)) from None


def _bit_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """BiT has global mean pooling and no dropout or stochastic depth: timm's keywords for them are accepted at
    the values that change nothing."""
    out = dict(overrides)
    if out.pop("classifier", "gap") != "gap":
        raise ValueError("BiT pools with 'avg' (global mean); global_pool='token' needs a ViT")
    for key in REGULARISATION:
        if key in out and not out[key]:
            del out[key]
        elif key in out:
            raise ValueError(f"{key}={out[key]}: vitlab's BiT has no dropout or stochastic depth (ViT and the "
                             "hybrids have both)")  # fmt: skip
    return out


def _unknown_keyword(name: str, overrides: dict[str, Any], err: TypeError) -> str:
    import dataclasses

    cls = type(model_config(name))
    fields = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(overrides) - fields)
    if not bad:
        return str(err)
    timm_names = ", ".join(sorted({*TIMM_KEYWORDS, "global_pool", "class_token", "mlp_ratio"}))
    return (f"{name} takes no keyword {bad[0]!r}; use a config field ({', '.join(sorted(fields - {'name'}))}) "
            f"or one of timm's ({timm_names})")


def _load_pretrained(name: str, pretrained: bool | str, overrides: dict[str, Any]) -> nn.Module:
    """Published weights by name (vitlab.weights.load); image_size / num_classes resize or re-head them, regularisation
    settings (dropout, drop_path_rate) apply as given; anything that would change the weights is refused."""
    overrides = dict(overrides)
    image_size, num_classes = overrides.pop("image_size", None), overrides.pop("num_classes", None)
    regularisation = {k: overrides.pop(k) for k in REGULARISATION if k in overrides}
    if overrides:
        raise ValueError(f"{', '.join(sorted(overrides))}: would change the architecture of the published weights; "
                         "use pretrained=False, or load and then fine-tune")  # fmt: skip
    model = load(name, pretrained=None if pretrained is True and _is_timm(name) else pretrained,
                 image_size=image_size, num_classes=num_classes)
    return with_settings(model, regularisation) if regularisation else model


def _is_timm(name: str) -> bool:
    return timm_name(name) is not None


def with_settings(model: nn.Module, settings: dict[str, Any]) -> nn.Module:
    """The same weights under a config with other parameter-free settings (dropout, stochastic depth); what a
    loaded model carries beside its weights (class names, evaluation resize, catalogue record) is kept."""
    if isinstance(model.config, BiTConfig):
        settings = _bit_overrides(settings)
    config = model.config.replace(**settings)
    with torch.device("meta"):  # no initialisation: the loaded tensors are taken over
        new = build_model(config)
    new.load_state_dict(model.state_dict(), assign=True)
    for attr in ("class_names", "eval_resize", "hub_entry"):
        if hasattr(model, attr):
            setattr(new, attr, getattr(model, attr))
    return new.train(model.training)

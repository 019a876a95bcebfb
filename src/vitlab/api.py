"""The bodies of vitlab's public functions (`vitlab/__init__.py` re-exports them): create_model, list_models, load,
save, transforms, export_onnx and fit.

`create_model`: vitlab's names ("ViT-B/16") and timm's ("vit_base_patch16_224[.TAG]",
"resnetv2_50x1_bit", "vit_base_r50_s16_384"), vitlab's keywords (image_size, dropout) and timm's (img_size,
drop_rate, drop_path_rate, global_pool, class_token), fresh or `pretrained`, whole or `features_only`.

timm names build the vitlab model of that architecture at the name's resolution, with the class count of the tag
(timm's default tag when the name has none), as timm.create_model(name, pretrained=False) does; pretrained=True
loads `hf-hub:timm/ARCH.TAG` (vitlab.weights.load). The table of names and tags is the catalogue's (hub/catalogue.json).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vitlab.data.transforms import model_transform
from vitlab.errors import WeightsError, keyword_errors
from vitlab.hub.catalogue import HF_PREFIX, timm_models, timm_name
from vitlab.hub.entry import Entry
from vitlab.hub.fetch import fetch as fetch_entry
from vitlab.models.config import BiTConfig, ModelConfig, ViTConfig
from vitlab.models.registry import build_model, model_config, unknown_model
from vitlab.models.timm_compat import FeatureExtractor
from vitlab.ranges import check_choice
from vitlab.weights.load import load as load_weights
from vitlab.weights.load import preprocessing
from vitlab.weights.tensors import read_tensor_file
from vitlab.weights.timm_arch import LAYER_SCALE_NAMES, timm_config, timm_normalisation, timm_preprocessing
from vitlab.weights.timm_bit import TIMM_WS_EPS
from vitlab.weights.vitlab_format import save as save_weights

if TYPE_CHECKING:  # the return types, named in the signatures (their modules import onnx / the trainer on use)
    from vitlab.deploy.onnx_export import ExportReport
    from vitlab.train.fitting import FitResult

# timm keyword -> vitlab config field (global_pool and class_token choose `classifier`, mlp_ratio `mlp_dim`)
TIMM_KEYWORDS = {"img_size": "image_size", "drop_rate": "dropout", "attn_drop_rate": "attn_dropout",
                 "embed_dim": "width", "init_values": "layer_scale"}  # fmt: skip
# Settings that change no parameter: a loaded model takes them without touching its weights.
REGULARISATION = ("dropout", "attn_dropout", "drop_path_rate")
POOLS = {"token": "token", "avg": "gap"}
FEATURE_CLS = "getter"  # timm's name for a feature extractor built on forward_intermediates
# vitlab config fields where None is a value of its own ("none"), kept where timm drops None-valued keywords
NONE_IS_A_VALUE = ("representation_size", "layer_scale", "resnet")
# timm's pretrained_cfg keys that say where weights come from
WEIGHT_SOURCES = ("state_dict", "file", "hf_hub_id", "hf_hub_filename", "url", "source", "custom_load")


@keyword_errors
def create_model(
    name: str, /, pretrained: bool | str = False, pretrained_cfg: str | dict[str, Any] | None = None,
    pretrained_cfg_overlay: dict[str, Any] | None = None, checkpoint_path: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None, scriptable: bool | None = None, exportable: bool | None = None,
    no_jit: bool | None = None, features_only: bool = False,
    out_indices: int | list[int] | tuple[int, ...] | None = None, feature_cls: str | None = None, **kwargs: Any,
) -> nn.Module:
    """A model by vitlab or timm name. `pretrained=True` loads the published weights (timm names: the tag in the
    name, else timm's default tag; vitlab names: the catalogue's default tags; a string: that vitlab tag).
    `features_only=True` returns timm's feature extractor: a list of (N, C, H, W) maps at `out_indices`
    (ViT: the last 3 blocks by default; BiT: the root and every stage), described by `.feature_info`; it reads
    `forward_intermediates`, which is timm's `feature_cls="getter"` (the only one accepted).

    timm's other keywords mean what they mean in timm.create_model: keywords set to None are dropped (vitlab's
    `representation_size`, `layer_scale` and `resnet`, where None is a value, excepted); `pretrained_cfg` is a tag
    (timm names) or a dict of timm's pretrained_cfg keys, `pretrained_cfg_overlay` replaces keys of it: with
    pretrained=True its weight source (`state_dict`, `file`, `hf_hub_id`, `url`, in timm's order of priority) is
    read into the named architecture, and its `num_classes` (the source's classes; -1: unknown) gives the default
    class count and, where the model's differs, a new head; `input_size`, `mean` and `std` set the model's, the
    other keys its `pretrained_cfg`. `checkpoint_path` is read into the model once built (timm's
    `load_checkpoint`), `cache_dir` is where downloads go. `scriptable`, `exportable` and `no_jit` are accepted:
    vitlab's layers have one form (TorchScript itself stays refused, `torch.jit.trace`, `torch.export` and ONNX
    work)."""
    if not isinstance(name, str):
        raise TypeError(f"create_model takes a model name (a str such as 'ViT-B/16'; vitlab.list_models() lists "
                        f"them), got {type(name).__name__}")
    if not isinstance(pretrained, bool | str):
        raise TypeError(f"pretrained must be True, False or a tag name (str), got {pretrained!r}")
    for key, flag in (("scriptable", scriptable), ("exportable", exportable), ("no_jit", no_jit)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{key} must be True, False or None, got {flag!r}")
    if feature_cls is not None and not features_only:
        raise ValueError("feature_cls applies only with features_only=True")
    if feature_cls not in (None, FEATURE_CLS):
        raise ValueError(f"feature_cls={feature_cls!r}: vitlab's feature extractor reads forward_intermediates, "
                         f"timm's {FEATURE_CLS!r}; pass feature_cls={FEATURE_CLS!r} or leave it out")
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k in NONE_IS_A_VALUE}
    name, overlay = _resolve_pretrained_cfg(name, pretrained_cfg, pretrained_cfg_overlay)
    source = _weights_source(overlay) if pretrained else None
    _overlay_defaults(overlay, kwargs)
    dynamic = kwargs.pop("dynamic_img_size", False)
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic_img_size must be True or False, got {dynamic!r}")
    overrides = vitlab_overrides(kwargs)
    unpooled = kwargs.get("global_pool") == ""
    with _downloads_in(cache_dir):
        if pretrained and source is None:
            if unpooled:
                raise ValueError("global_pool='' with pretrained weights: load them, then "
                                 "model.reset_classifier(n, '')")
            model = _load_pretrained(name, pretrained, overrides)
        else:
            model = build_model(model_config_for(name, overrides))
            if _is_timm(name) or name.split(".", 1)[0] in LAYER_SCALE_NAMES:  # evaluated as timm evaluates its weights
                model.eval_resize = timm_preprocessing(name)[0]
            if source is not None:
                new_head = overlay.get("num_classes", model.num_classes) != model.num_classes
                read_into(model, source, arch=_timm_arch(name), new_head=new_head)
            if unpooled:  # timm's global_pool "": forward returns every token (the new head, if any, on each)
                model.reset_classifier(model.num_classes, "")
        if checkpoint_path:
            _read_checkpoint_path(model, checkpoint_path, _timm_arch(name))
    data_cfg = {k: v for k, v in overlay.items() if k not in (*WEIGHT_SOURCES, "num_classes")}
    if data_cfg:
        model.pretrained_cfg = data_cfg
    if dynamic:
        if not hasattr(model, "dynamic_img_size"):
            raise ValueError(f"dynamic_img_size applies to Vision Transformers; {name} (a ResNet) takes any input "
                             "size as it is")
        model.dynamic_img_size = True
    if not features_only:
        if out_indices is not None:
            raise ValueError("out_indices applies only with features_only=True")
        return model
    if out_indices is None:
        out_indices = (0, 1, 2, 3, 4) if isinstance(model.config, BiTConfig) else 3
    return FeatureExtractor(model, out_indices)


def _resolve_pretrained_cfg(name: str, cfg: Any, overlay: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """timm's `pretrained_cfg` (a tag, a dict, or timm's PretrainedCfg) and `pretrained_cfg_overlay` as (the name
    with the tag, the keys that replace the model's own pretrained_cfg)."""
    if overlay is not None and not isinstance(overlay, dict):
        raise TypeError(f"pretrained_cfg_overlay must be a dict of timm's pretrained_cfg keys, got {overlay!r}")
    if cfg is not None and hasattr(cfg, "to_dict"):  # timm's PretrainedCfg
        cfg = cfg.to_dict()
    if isinstance(cfg, str) and cfg:
        if not _is_timm(name):
            raise ValueError(f"pretrained_cfg={cfg!r} names a timm tag; {name} is a vitlab name: pass the vitlab "
                             f"tag as pretrained={cfg!r}")
        if "." in name:
            raise ValueError(f"{name} already has a tag; pass pretrained_cfg={cfg!r} with the bare name or neither")
        return f"{name}.{cfg}", dict(overlay or {})
    if cfg is not None and not isinstance(cfg, dict | str):
        raise TypeError(f"pretrained_cfg must be a tag (str) or a dict of timm's pretrained_cfg keys, got {cfg!r}")
    return name, {**(cfg or {}), **(overlay or {})}


def _weights_source(overlay: dict[str, Any]) -> dict[str, Any] | str | None:
    """Where pretrained weights come from when the overlay names a source, in timm's order: a state dict, a local
    file, a Hugging Face repository (`hf-hub:ID`), a URL (downloaded into vitlab's cache); None: the name's
    published weights."""
    if isinstance(overlay.get("state_dict"), dict):
        return overlay["state_dict"]
    if overlay.get("file"):
        return str(overlay["file"])
    if overlay.get("hf_hub_id"):
        return HF_PREFIX + overlay["hf_hub_id"]
    if overlay.get("url"):
        url = str(overlay["url"])
        return str(fetch_entry(Entry(name=url, tag="url", model="", format="timm", url=url), progress=False))
    return None


def _overlay_defaults(overlay: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """timm's defaults from a pretrained_cfg: the class count (unless negative), the input size and channels,
    and (vitlab's config fields) mean and std, where the caller passed none."""
    if isinstance(overlay.get("num_classes"), int) and overlay["num_classes"] >= 0:
        kwargs.setdefault("num_classes", overlay["num_classes"])
    if "input_size" in overlay:
        chans, *size = overlay["input_size"]
        if "image_size" not in kwargs:
            kwargs.setdefault("img_size", tuple(size))
        kwargs.setdefault("in_chans", chans)
    for key in ("mean", "std"):
        if key in overlay:
            kwargs.setdefault(key, tuple(overlay[key]))


def _timm_arch(name: str) -> str | None:
    """timm's architecture name for a timm name (what a bare timm state dict is read as), else None."""
    timm = timm_name(name)
    return timm.arch if timm is not None else None


@contextmanager
def _downloads_in(cache_dir: str | os.PathLike | None) -> Iterator[None]:
    """timm's `cache_dir`: vitlab's downloads and Hugging Face's (both read their folder when they download) go
    to `cache_dir` while the model is made."""
    if not cache_dir:
        yield
        return
    saved = {var: os.environ.get(var) for var in ("VITLAB_CACHE", "HF_HUB_CACHE")}
    os.environ.update(dict.fromkeys(saved, os.fspath(cache_dir)))
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def read_into(model: nn.Module, source: dict[str, Any] | str | os.PathLike, arch: str | None = None,
              new_head: bool = False) -> None:
    """Weights into a model already built, strictly, as timm's `load_checkpoint` and its pretrained file: a state
    dict (vitlab's or timm's tensor names), or anything `vitlab.load` reads, at the model's input size.
    `new_head`: the source's classifier is left out and the model's new zero-initialised one kept."""
    if isinstance(source, dict):
        state = dict(source)
        if new_head:  # the model's own head instead of the source's
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
            state.update({f"head.{k}": v for k, v in model.get_classifier().state_dict().items()})
    else:  # read at the model's size, with a new zero-initialised head where asked
        num_classes = model.num_classes if new_head else None
        image_size = getattr(model.config, "image_size", None)
        state = load_weights(source, image_size=image_size, num_classes=num_classes, arch=arch).state_dict()
    model.load_state_dict(state)


def _read_checkpoint_path(model: nn.Module, path: str | os.PathLike, arch: str | None) -> None:
    """timm's `load_checkpoint(model, checkpoint_path)`: a state dict's tensors (timm's or vitlab's names, training
    wrappers removed) into the model as built, so that a file of a model made with architecture keywords (depth=2)
    needs no architecture told by the file; a file that does not fit so (another input size, an official .npz)
    is read by `read_into`, which says in one line what does not match."""
    try:
        model.load_state_dict(read_tensor_file(path))
        return
    except (WeightsError, RuntimeError):  # not a state-dict file, or not this model's tensors as they are
        pass
    read_into(model, path, arch=arch)


def vitlab_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """timm's keywords as vitlab config fields; the pooling keywords as vitlab's `classifier`. `mlp_ratio` stays for
    model_config_for, which knows the name: timm's embed_dim without mlp_ratio keeps the name's ratio ("mlp_ratio":
    None), as timm computes the MLP width from the two; vitlab's `width` replaces the width alone (mlp_dim is a
    field of its own)."""
    skip = ("global_pool", "class_token", "no_embed_class")
    out = {TIMM_KEYWORDS.get(k, k): v for k, v in kwargs.items() if k not in skip}
    if "no_embed_class" in kwargs:
        out["pos_embed_prefix"] = not kwargs["no_embed_class"]
    both = [k for k in kwargs if k in TIMM_KEYWORDS and TIMM_KEYWORDS[k] in kwargs]
    if both:
        raise ValueError(f"{both[0]} and {TIMM_KEYWORDS[both[0]]} name the same setting; pass one")
    if "mlp_ratio" in out and "mlp_dim" in out:
        raise ValueError("mlp_ratio and mlp_dim name the same setting (mlp_dim = int(width · mlp_ratio)); pass one")
    if "mlp_ratio" in out:
        ratio = out["mlp_ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio < float("inf"):
            raise ValueError(f"mlp_ratio must be a positive number (e.g. 4.0), got {ratio!r}")
    elif "embed_dim" in kwargs and "mlp_dim" not in out:
        out["mlp_ratio"] = None  # timm's rule with the name's own ratio (model_config_for)
    pool, cls = kwargs.get("global_pool"), kwargs.get("class_token")
    if pool == "":  # no pooling: the name's prefix tokens, the final norm on the tokens (create_model unpools)
        pool = None
        out.setdefault("fc_norm", False)
    if pool is not None or cls is not None:
        out["classifier"] = _classifier(pool, cls)
        if out["classifier"] == "gap" and cls:
            out["class_token"] = True  # timm's class_token=True, global_pool="avg": the mean skips the class token
    return out


def _classifier(pool: str | None, class_token: bool | None) -> str:
    """global_pool="avg" is the paper's GAP (final LayerNorm, then the mean: timm's fc_norm=False; pass
    fc_norm=True for timm's default order), without a class token unless class_token=True."""
    if pool is not None and pool not in POOLS:
        raise ValueError(f"global_pool={pool!r}: vitlab pools with 'token' (class token) or 'avg' (the mean)")
    if pool is None:
        return "token" if class_token else "gap"
    if pool == "token" and class_token is not None and not class_token:
        raise ValueError("global_pool='token' needs a class token: use class_token=True, or global_pool='avg'")
    return POOLS[pool]


def model_config_for(name: str, overrides: dict[str, Any]) -> ModelConfig:
    """The config of a vitlab or timm name with vitlab-field overrides; ValueError naming a bad keyword."""
    if "mlp_ratio" in overrides:
        overrides = _with_mlp_dim(name, dict(overrides))
    timm = timm_name(name)
    base = name
    if timm is None and name.split(".", 1)[0] in LAYER_SCALE_NAMES:  # timm's register / layer-scale models
        return _timm_only_config(name, overrides)
    if timm is not None:
        base = timm.model
        overrides = {"num_classes": timm.num_classes, "image_size": timm_preprocessing(name)[1], **overrides}
        if timm.arch.startswith("resnetv2_"):  # timm's standardisation eps: timm's weights give timm's outputs
            overrides = {"ws_eps": TIMM_WS_EPS, **overrides}
        # timm's statistics for the weights of the name (DeiT, DINO, MAE: ImageNet's)
        mean, std = timm_normalisation(f"{timm.arch}.{timm.tag}" if timm.tag else timm.arch)
        overrides = {"mean": mean, "std": std, **overrides}
    if overrides.get("classifier") == "gap" and base.startswith("ViT-") and not base.endswith("-gap"):
        base, overrides = base + "-gap", {k: v for k, v in overrides.items() if k != "classifier"}
    try:
        named = model_config(base)
    except ValueError:  # no variant: the closest of every name create_model takes
        raise ValueError(unknown_model(name, also=[*timm_models(), *LAYER_SCALE_NAMES])) from None
    if isinstance(named, BiTConfig):
        overrides = _bit_overrides(overrides)
    try:
        return model_config(base, **overrides)
    except TypeError as e:
        raise ValueError(_unknown_keyword(name, type(named), overrides, e)) from None


def _with_mlp_dim(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """`mlp_ratio` (None: the name's) as mlp_dim by timm's rule, int(width · mlp_ratio), the width the override's
    or the name's. The name's ratio is timm's for its own names (5.6 for vit_little, 2.572 for so150m: not
    mlp_dim / width, which rounding moved), else mlp_dim / width."""
    ratio = overrides.pop("mlp_ratio")
    named = model_config_for(name, {})
    if not isinstance(named, ViTConfig):
        raise ValueError(f"{name} takes no keyword 'mlp_ratio': it is not a ViT")
    arch = name.split(".", 1)[0]
    if ratio is None:
        ratio = LAYER_SCALE_NAMES[arch][4] if arch in LAYER_SCALE_NAMES else named.mlp_dim / named.width
    width = overrides.get("width", named.width)
    if isinstance(width, bool) or not isinstance(width, int):
        raise ValueError(f"embed_dim (width) must be a positive integer, got {width!r}")
    overrides["mlp_dim"] = int(width * ratio)
    return overrides


def _timm_only_config(name: str, overrides: dict[str, Any]) -> ModelConfig:
    """A timm architecture outside the paper's table (registers, layer scale), as timm defines it, with vitlab-field
    overrides. Its published weights load by their hub name (`vitlab.load("hf-hub:timm/NAME.TAG")`)."""
    arch = name.split(".", 1)[0]
    if "." in name:
        raise ValueError(f"{name}: load timm's published weights of {arch} with vitlab.load('hf-hub:timm/{name}')")
    config = timm_config(arch)
    try:
        return config.replace(**overrides)
    except TypeError as e:
        raise ValueError(_unknown_keyword(name, type(config), overrides, e)) from None


def _bit_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """BiT has global mean pooling and no dropout or stochastic depth: timm's keywords for them are accepted at
    the values that change nothing."""
    out = dict(overrides)
    if out.pop("classifier", "gap") != "gap":
        raise ValueError("BiT pools with 'avg' (global mean); global_pool='token' needs a ViT")
    if out.get("fc_norm") is False:  # global_pool="": no LayerNorm after pooling, which BiT has none of
        del out["fc_norm"]
    for key in REGULARISATION:
        if key in out and not out[key]:
            del out[key]
        elif key in out:
            raise ValueError(f"{key}={out[key]}: vitlab's BiT has no dropout or stochastic depth (ViT and the "
                             "hybrids have both)")  # fmt: skip
    return out


def _unknown_keyword(name: str, cls: type, overrides: dict[str, Any], err: TypeError) -> str:
    """The message for a keyword the config class `cls` of the model `name` (as the caller spelled it) lacks."""
    import dataclasses

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
    if name.split(".", 1)[0] in LAYER_SCALE_NAMES:
        raise ValueError(f"{name}: vitlab builds this timm architecture but does not list its published weights; "
                         f"load them by hub name: vitlab.load('hf-hub:timm/{name.split('.', 1)[0]}.TAG')")
    overrides = dict(overrides)
    image_size, num_classes = overrides.pop("image_size", None), overrides.pop("num_classes", None)
    regularisation = {k: overrides.pop(k) for k in REGULARISATION if k in overrides}
    if overrides:
        raise ValueError(f"{', '.join(sorted(overrides))}: would change the architecture of the published weights; "
                         "use pretrained=False, or load and then fine-tune")  # fmt: skip
    model = load_weights(name, pretrained=None if pretrained is True and _is_timm(name) else pretrained,
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


def list_models(filter: str | list[str] = "", pretrained: bool = False) -> list[str]:
    """Model names. Without arguments: every vitlab variant (the ViTs of paper Table 1 and the official configs,
    their GAP versions, the hybrids, the BiT ResNetV2s). `filter`: shell-style patterns (timm's), matched against
    vitlab's names and the timm names vitlab builds (`"vit_*"`, `"*reg4*"`, `"ViT-B/*"`). `pretrained=True`: names
    with published weights instead, each loadable by `vitlab.load` / `create_model(..., pretrained=True)`:
    catalogue names (`"i21k:ViT-B/16"`) and timm's `"ARCH.TAG"` names, as timm lists them."""
    import fnmatch

    from vitlab.hub import catalogue
    from vitlab.models.registry import variant_names

    patterns = [p for p in ([filter] if isinstance(filter, str) else list(filter)) if p]
    if pretrained:  # (name, the architecture a pattern may also name)
        named = [(e.name, e.model) for e in catalogue.entries() if e.model and not (e.repo or "").startswith("timm/")]
        named += [(f"{arch}.{tag}", arch) for arch, spec in catalogue.timm_models().items() for tag in spec["tags"]]
    elif not patterns:
        return variant_names()
    else:
        named = [(n, n) for n in variant_names() + list(catalogue.timm_models()) + list(LAYER_SCALE_NAMES)]
    if patterns:
        named = [(n, a) for n, a in named if any(fnmatch.fnmatchcase(s, p) for p in patterns for s in (n, a))]
    return list(dict.fromkeys(n for n, _ in named))


@keyword_errors
def load(
    path: str | os.PathLike,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    pretrained: str | bool | None = None,
    precision: str | None = None,
    *,
    arch: str | None = None,
    use_ema: bool = False,
) -> nn.Module:
    """A model in eval mode, its architecture read from the weights (nothing else needed).

    Args:
        path: a weights file or folder in any supported format (vitlab safetensors, the official JAX `.npz`, BiT
            `.npz`, a timm hub folder or state dict, a timm `train.py` or Lightning training checkpoint, a Hugging Face
            transformers folder), a run or checkpoint
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
        use_ema: a training checkpoint's exponential-moving-average weights (timm's train.py `state_dict_ema`), as
            timm's `use_ema`; a file without them is an error. Default: the trained weights (`state_dict`).

    Returns:
        The model with `.config`; a published checkpoint also carries `.hub_entry` and, for ImageNet
            classifiers, `.class_names`.

    Raises:
        vitlab.weights.WeightsError: a file it cannot read, in one line naming the file, the tensor and the fix;
            nothing is loaded partially.

    `precision` (auto, fp32, bf16, int8; None: float32 as stored) prepares the model for inference as
    `vitlab eval --precision` does (vitlab.runtime.precision): `model.precision` is what the model computes in and
    why (a BiT asked for int8 says fp32: its only Linear layer is its head, which stays float32). Every public
    forward path (`forward`, `forward_features`, `forward_head`, `forward_intermediates`, `forward_inspect`)
    computes in it, takes float32 input and returns float32 outputs. bf16 computes the matmuls and convolutions in
    bf16 under the model's own autocast: from bf16 weights for a ViT, from float32 weights for the hybrids and BiT,
    whose weight standardisation is computed in float32."""
    _check_load_options(pretrained, precision, arch)  # path and sizes: weights.load's own checks
    if not isinstance(use_ema, bool):
        raise TypeError(f"use_ema must be True or False, got {use_ema!r}")
    model = load_weights(path, image_size=image_size, num_classes=num_classes, pretrained=pretrained, arch=arch,
                         use_ema=use_ema)
    if precision is None:
        return model
    from vitlab.runtime.session import open_session

    session = open_session(model, device=next(model.parameters()).device, precision=precision)
    session.model.precision = session.precision
    return session.model


def _check_load_options(pretrained: Any, precision: Any, arch: Any) -> None:
    """TypeError / ValueError naming a wrong `load` keyword, before any file is read."""
    if pretrained is not None and not isinstance(pretrained, bool | str):
        raise TypeError(f"pretrained must be a tag name (str), True, False or None, got {pretrained!r}")
    if arch is not None and not isinstance(arch, str):
        raise TypeError(f"arch must be a timm architecture name (str) or None, got {arch!r}")
    if precision is not None:
        from vitlab.runtime.precision import PRECISIONS

        check_choice("precision", precision, PRECISIONS)


@keyword_errors
def save(model: nn.Module, path: str | os.PathLike, *, force: bool = False) -> None:
    """Write vitlab safetensors with the config in the metadata; `load(save(m))` is exact (class names and the
    evaluation resize a loaded model carries are kept). The write is atomic (temporary file + rename).

    Args:
        model: a vitlab model (`create_model`, `load`).
        path: the `.safetensors` file to write. An existing file is replaced only if vitlab wrote it (its metadata
            says so); a device, FIFO, socket, symbolic link or folder there never is.
        force: replace an existing regular file that vitlab did not write.

    Raises:
        FileExistsError: the one-line refusal (a `.pt`/`.pth` or `.onnx` name: ValueError, read as another format).
        TypeError, ValueError: a wrong argument, or a model `load` could not rebuild (int8, pruned), in one line.
    """
    from vitlab.runtime.quantize import is_int8
    from vitlab.weights.arguments import check_model

    check_model(model)
    if is_int8(model):  # its Linear layers are packed int8 kernels, which no weights file describes
        raise ValueError("vitlab.save: an int8 (quantized) model cannot be saved as weights; save the float32 model "
                         "before quantizing it (load(path, precision='int8') quantizes it again), or export it as "
                         "int8 ONNX with export_onnx(model, path, precision='int8')")
    if not isinstance(force, bool):
        raise TypeError(f"force must be True or False, got {force!r}")
    resize = getattr(model, "eval_resize", None)
    save_weights(model, path, meta={"eval_resize": resize} if resize else None, force=force)


@keyword_errors
def export_onnx(model_or_weights: nn.Module | str | os.PathLike, path: str | os.PathLike, *, precision: str = "fp32",
                batch_size: int = 2, opset: int | None = None, force: bool = False) -> ExportReport:
    """Write a model as ONNX with a dynamic batch dimension, after checking ONNX Runtime's output against
    PyTorch's (`vitlab.deploy`; needs `pip install 'vitlab[onnx]'`).

    Args:
        model_or_weights: a model, or weights `load` reads (path, run directory, published name).
        path: the `.onnx` file, written atomically only after the check passes.
        precision: fp32 (or auto) or int8 (ONNX Runtime's dynamic quantization of the encoder's matmuls).
        batch_size: the batch the export traces (1 to 1024); the file also runs at other batch sizes (checked at
            two).
        opset: the ONNX opset, 14 to 20: those torch's exporter writes for every vitlab model
            (`vitlab.ranges.ONNX_OPSET`; None: the exporter's default).
        force: replace an existing file that vitlab did not write.

    Returns:
        An `ExportReport`: `path`, `precision`, `bytes`, `check` (ONNX Runtime's largest relative difference from
        PyTorch float32, its bound and the batch sizes run) and `note`; `.line()` says it in one line.

    Raises:
        ValueError: a failed check (nothing is written), or a wrong argument, named before anything is loaded.
        TypeError: an argument of the wrong type, named before anything is loaded.
    """
    from vitlab.deploy import export_onnx as export_model
    from vitlab.deploy import export_weights

    if not isinstance(model_or_weights, nn.Module | str | os.PathLike):
        raise TypeError(f"model_or_weights must be a vitlab model (vitlab.load, create_model) or weights (a path or "
                        f"a published name), got {type(model_or_weights).__name__}")
    export = export_weights if isinstance(model_or_weights, str | os.PathLike) else export_model
    return export(model_or_weights, path, precision=precision, batch_size=batch_size, opset=opset, force=force)


@keyword_errors
def fit(recipe: str | None = None, **settings: Any) -> FitResult:
    """Train, or fine-tune with `init=`, as `vitlab train` / `vitlab finetune` do, showing the same progress.

    Args:
        recipe: a recipe name (`vitlab recipes`; None: the demo recipe, or `finetune` with `init`).
        **settings: the training settings as keywords, each a field of `vitlab.train.TrainConfig` (the table
            under "Training settings" below; the command line's flag names with underscores). Besides paths:
            `data` may be a dataset object: a map-style dataset of (image, label), such as a torchvision
            `ImageFolder` or a `datasets.Dataset`; a `(train, val)` pair of them; or a `datasets.DatasetDict`
            (its `train` and `validation` splits). `init` may be a model: a vitlab model or a timm ViT.
            The architecture keywords `depth`, `width`, `heads`, `mlp_dim` change the recipe's model; its other
            settings go in `model_args`. `config_file` reads settings from a JSON/YAML file; `progress=False`
            silences the progress lines.

    Returns:
        A `FitResult`: `out_dir`, `status` ("completed" or "preempted"), `step`, `metrics` (the last validation:
        loss, top1, top5 above 5 classes), `best_top1`, `weights` (the final weights file), `model` (those weights
        loaded; None when preempted) and, with `lr_sweep`, `sweep`.

    Raises:
        TypeError: an unknown keyword, or a value of the wrong type, named by its keyword.
        ValueError: a value out of range, or settings or data the run would refuse, in one line that names the
            keywords to change (`resume=True`, `out=`).

    Example:
        ```python
        result = vitlab.fit("finetune", init="vit.npz", data="photos/", epochs=10, out="runs/photos")
        result.metrics["top1"], result.out_dir, result.model
        ```
    """
    from vitlab.train.fitting import fit as fit_run

    return fit_run(recipe, **settings)


@keyword_errors
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

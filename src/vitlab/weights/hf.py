"""Hugging Face transformers ViT folders (`ViTForImageClassification`, `ViTModel`), both ways.

HF keeps query, key and value as three Linear layers; vitlab stacks them as one `qkv` Linear with q, k, v along
the output axis (heads contiguous inside each, as HF's view(…, heads, head_dim) expects), so reading
concatenates and writing splits. HF's ViTModel pooler (Dense + tanh on the class token) is the paper's
representation layer, vitlab's `pre_logits`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.constants import OFFICIAL_MEAN, OFFICIAL_STD
from vitlab.errors import WeightsError
from vitlab.models.config import BiTConfig, ModelConfig, ViTConfig
from vitlab.models.registry import vitlab_name
from vitlab.models.timm_compat import eval_resize_of
from vitlab.weights.card import model_card
from vitlab.weights.hf_bit import read_hf_bit, write_hf_bit
from vitlab.weights.hf_folder import (
    PREPROCESSOR,
    checkpoint_meta,
    eval_resize_from_processor,
    hf_architecture,
    hf_num_classes,
    image_processor,
    label_maps,
    write_hf_folder,
)
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import read_json, read_weights_folder
from vitlab.weights.validate import check_against, expected_shapes

__all__ = ["config_from_hf", "hf_config", "read_hf", "to_hf_state_dict", "write_hf"]

CLASSIFIER, BACKBONE = "ViTForImageClassification", "ViTModel"
# HF hidden_act -> vitlab gelu; gelu_new, gelu_pytorch_tanh and gelu_fast all compute the tanh approximation.
HF_ACTS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
# transformers' ViTConfig defaults, for config.json files that leave a field out.
HF_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-12,
    "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True, "pooler_act": "tanh",
}  # fmt: skip


def _module_map(depth: int) -> list[tuple[str, str]]:
    """(HF module, vitlab module) pairs whose weight and bias carry over unchanged; q/k/v are handled apart."""
    pairs = [("embeddings.patch_embeddings.projection", "patch_embed.proj"), ("layernorm", "norm")]
    for i in range(depth):
        hf, vl = f"encoder.layer.{i}.", f"blocks.{i}."
        pairs += [(hf + "layernorm_before", vl + "norm1"), (hf + "attention.output.dense", vl + "attn.proj"),
                  (hf + "layernorm_after", vl + "norm2"), (hf + "intermediate.dense", vl + "mlp.fc1"),
                  (hf + "output.dense", vl + "mlp.fc2")]  # fmt: skip
    return pairs


def _qkv_params(config: ViTConfig) -> tuple[str, ...]:
    return ("weight", "bias") if config.qkv_bias else ("weight",)


def _name_pairs(config: ViTConfig, base: str) -> list[tuple[str, str]]:
    """(HF name, vitlab name) of every tensor but the attention's q, k and v (HF splits what vitlab's qkv holds)."""
    pairs = [(base + "embeddings.cls_token", "cls_token"), (base + "embeddings.position_embeddings", "pos_embed")]
    pairs += [(f"{base}{hf}.{p}", f"{vl}.{p}") for hf, vl in _module_map(config.depth) for p in ("weight", "bias")]
    for p in ("weight", "bias"):
        if config.representation_size:
            pairs.append((f"{base}pooler.dense.{p}", f"pre_logits.0.{p}"))
        if config.num_classes:
            pairs.append((f"classifier.{p}", f"head.{p}"))
    return pairs


def to_hf_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, base: str) -> dict[str, torch.Tensor]:
    """vitlab tensors -> HF names. `base` is "vit." inside ViTForImageClassification, "" for a ViTModel."""
    out = {hf: state[vl] for hf, vl in _name_pairs(config, base)}
    for i in range(config.depth):
        for p in _qkv_params(config):
            q, k, v = state[f"blocks.{i}.attn.qkv.{p}"].chunk(3, dim=0)  # (3D, …) -> 3 × (D, …)
            for name, t in zip(("query", "key", "value"), (q, k, v), strict=True):
                out[f"{base}encoder.layer.{i}.attention.attention.{name}.{p}"] = t
    return out


def from_hf_state_dict(tensors: dict[str, torch.Tensor], config: ViTConfig, base: str) -> dict[str, torch.Tensor]:
    """HF names -> vitlab tensors; the inverse of `to_hf_state_dict` (q, k, v concatenated into qkv)."""
    state = {vl: tensors[hf] for hf, vl in _name_pairs(config, base)}
    for i in range(config.depth):
        for p in _qkv_params(config):
            parts = [tensors[f"{base}encoder.layer.{i}.attention.attention.{n}.{p}"] for n in ("query", "key", "value")]
            state[f"blocks.{i}.attn.qkv.{p}"] = torch.cat(parts, dim=0)  # 3 × (D, …) -> (3D, …)
    return state


# --- reading -------------------------------------------------------------------------------------------------
def read_hf(path: str | Path) -> WeightsRecord:
    """A `save_pretrained` folder of ViTForImageClassification or ViTModel (config.json with model_type "vit",
    model.safetensors or pytorch_model.bin, optionally preprocessor_config.json for mean/std and the resize)."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    cfg_path = folder / "config.json"
    hf = read_json(cfg_path)
    if hf.get("model_type") == "bit":  # BitForImageClassification / BitModel
        return read_hf_bit(folder)
    if hf.get("model_type") != "vit":
        raise WeightsError(cfg_path, f"model_type {hf.get('model_type')!r} is not 'vit'",
                           "vitlab reads HF ViTForImageClassification / ViTModel folders")  # fmt: skip
    file, tensors = read_weights_folder(folder, ("model.safetensors", "pytorch_model.bin"))
    arch = hf_architecture(hf, tensors, cfg_path, (CLASSIFIER, BACKBONE), "vit.")
    base = "vit." if arch == CLASSIFIER else ""
    tensors, notes = _drop_unused(tensors, arch, base)
    mean, std = _normalisation(folder / PREPROCESSOR)
    config = config_from_hf(hf, cfg_path, arch, base + "pooler.dense.weight" in tensors, mean, std)
    meta_state = {k: torch.empty(s, device="meta") for k, s in expected_shapes(config, cfg_path, len(tensors)).items()}
    expected = {k: v.shape for k, v in to_hf_state_dict(meta_state, config, base).items()}
    check_against(file, expected, tensors, f"{arch} with this config.json")
    if not (folder / PREPROCESSOR).is_file():
        notes.append(f"no {PREPROCESSOR}: assumed mean = std = 0.5")
    meta = checkpoint_meta(hf, arch, config.num_classes, notes)
    if (folder / PREPROCESSOR).is_file() and (resize := eval_resize_from_processor(read_json(folder / PREPROCESSOR),
                                                                                    config.image_size)):
        meta["eval_resize"] = resize  # the processor crops the centre: `vitlab.transforms` does as it does
    return WeightsRecord(config, from_hf_state_dict(tensors, config, base), source="hf", meta=meta)


def _drop_unused(tensors: dict[str, torch.Tensor], arch: str, base: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Tensors HF stores but never uses for classification: the masked-image-modelling mask token, and the
    pooler in ViTForImageClassification files (HF's classifier reads the class token, not the pooler)."""
    unused = [base + "embeddings.mask_token"]
    if arch == CLASSIFIER:
        unused += [base + "pooler.dense.weight", base + "pooler.dense.bias"]
    dropped = [k for k in unused if k in tensors]
    notes = [f"ignored {k!r}: HF's {arch} does not use it" for k in dropped]
    return {k: v for k, v in tensors.items() if k not in dropped}, notes


def config_from_hf(
    hf: dict[str, Any], path: str | Path, arch: str, has_pooler: bool, mean: Any = None, std: Any = None
) -> ViTConfig:
    """The vitlab config of an HF ViT config.json; WeightsError naming any option vitlab cannot represent."""
    c = {**HF_DEFAULTS, **hf}
    if c["hidden_act"] not in HF_ACTS:
        raise WeightsError(path, f"hidden_act={c['hidden_act']!r} has no vitlab equivalent",
                           f"vitlab's ViT uses GELU: one of {sorted(HF_ACTS)}")  # fmt: skip
    if has_pooler and c["pooler_act"] != "tanh":
        raise WeightsError(path, f"pooler_act={c['pooler_act']!r} has no vitlab equivalent",
                           "the representation layer is Dense + tanh")  # fmt: skip
    patch = c["patch_size"]
    if not isinstance(patch, int):
        if len(patch) != 2 or patch[0] != patch[1]:
            raise WeightsError(path, f"patch_size={patch} is not square", "vitlab uses square patches")
        patch = patch[0]
    num_classes = hf_num_classes(hf, arch, CLASSIFIER)
    try:
        config = ViTConfig(
            image_size=c["image_size"], patch_size=patch, width=c["hidden_size"], depth=c["num_hidden_layers"],
            mlp_dim=c["intermediate_size"], num_heads=c["num_attention_heads"], num_classes=num_classes,
            representation_size=(c.get("pooler_output_size") or c["hidden_size"]) if has_pooler else None,
            gelu=HF_ACTS[c["hidden_act"]], ln_eps=float(c["layer_norm_eps"]), qkv_bias=bool(c["qkv_bias"]),
            in_chans=c["num_channels"], dropout=float(c["hidden_dropout_prob"]),
            attn_dropout=float(c["attention_probs_dropout_prob"]),
            mean=tuple(mean or OFFICIAL_MEAN), std=tuple(std or OFFICIAL_STD),
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise WeightsError(path, f"invalid ViT config ({e})", "the config.json is inconsistent") from None
    return config.replace(name=vitlab_name(config))


def _normalisation(path: Path) -> tuple[Any, Any]:
    """(mean, std) from HF's image processor config; (None, None) when there is none (vitlab's 0.5 applies)."""
    if not path.is_file():
        return None, None
    pre = read_json(path)
    if pre.get("do_normalize") is False:
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    mean, std = pre.get("image_mean"), pre.get("image_std")
    mean = [mean] * 3 if isinstance(mean, (int, float)) else mean
    std = [std] * 3 if isinstance(std, (int, float)) else std
    return mean, std


# --- writing -------------------------------------------------------------------------------------------------
def check_hf_representable(config: ModelConfig, where: str | Path = "model") -> None:
    """WeightsError for vitlab architectures transformers' ViT classes cannot build."""
    problem = ""
    if not isinstance(config, ViTConfig):
        problem = "a BiT ResNet classifier"
    elif config.resnet is not None:
        problem = "a ResNet stem (hybrid)"
    elif config.classifier != "token":
        problem = "the GAP classifier (no class token)"
    elif config.pos_embed != "learned":
        problem = f"pos_embed={config.pos_embed!r}"
    elif config.representation_size and config.num_classes:
        problem = "a representation layer (pre_logits) before the classifier"
    elif config.after_paper_features():
        problem = config.after_paper_features()[0]
    if problem:
        raise WeightsError(where, f"transformers' ViT has no equivalent of {problem}",
                           "save in vitlab's format, or timm's where it fits")  # fmt: skip


def hf_config(config: ViTConfig, class_names: list[str] | None = None) -> dict[str, Any]:
    """transformers' config.json: ViTForImageClassification with a head, else ViTModel (pooler = pre_logits)."""
    h, w = config.image_size
    out: dict[str, Any] = {
        "architectures": [CLASSIFIER if config.num_classes else BACKBONE], "model_type": "vit",
        "hidden_size": config.width, "num_hidden_layers": config.depth, "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim, "hidden_act": "gelu" if config.gelu == "exact" else "gelu_pytorch_tanh",
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attn_dropout,
        "initializer_range": 0.02, "layer_norm_eps": config.ln_eps, "image_size": h if h == w else [h, w],
        "patch_size": config.patch_size, "num_channels": config.in_chans, "qkv_bias": config.qkv_bias,
        "encoder_stride": config.patch_size, "pooler_output_size": config.representation_size or config.width,
        "pooler_act": "tanh",
    }  # fmt: skip
    return {**out, **label_maps(config.num_classes, class_names)}


def write_hf(model: nn.Module, folder: str | Path, source: str | Path | None = None) -> None:
    """A folder `transformers.ViTForImageClassification.from_pretrained` loads (a model without classifier is
    written as a ViTModel: pooler = pre_logits if it has one, else load it with add_pooling_layer=False).
    A model card (README.md) names `source`, the file converted. Written into a temporary folder and renamed
    into place; an existing folder is replaced only if it holds nothing but an earlier export. A BiT model is
    written as a BitForImageClassification / BitModel folder."""
    config = model.config
    if isinstance(config, BiTConfig):
        return write_hf_bit(model, folder, source)
    check_hf_representable(config, folder)
    base = "vit." if config.num_classes else ""
    # clone: q, k and v are views of one qkv tensor, and safetensors refuses tensors that share memory
    tensors = {k: v.detach().to("cpu").clone() for k, v in to_hf_state_dict(model.state_dict(), config, base).items()}
    cfg = hf_config(config, getattr(model, "class_names", None))
    pre = image_processor(config.image_size, config.mean, config.std, eval_resize_of(model), "ViTImageProcessor")

    write_hf_folder(folder, cfg, pre, model_card(model, "hf", folder, source), tensors)

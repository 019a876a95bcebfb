"""Hugging Face transformers ViT folders (`ViTForImageClassification`, `ViTModel`), both ways.

HF keeps query, key and value as three Linear layers; vitlab stacks them as one `qkv` Linear with q, k, v along
the output axis (heads contiguous inside each, as HF's view(…, heads, head_dim) expects), so reading
concatenates and writing splits. HF's ViTModel pooler (Dense + tanh on the class token) is the paper's
representation layer, vitlab's `pre_logits`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..errors import WeightsError
from ..models.config import OFFICIAL_MEAN, OFFICIAL_STD, BiTConfig, ModelConfig, ViTConfig
from .card import CARD, model_card
from .checkpoint import Checkpoint
from .files import check_against, expected_shapes, read_json, read_weights_folder, write_folder_atomically
from .timm_arch import vitlab_name

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
PREPROCESSOR = "preprocessor_config.json"
HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", PREPROCESSOR, "README.md")


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


def to_hf_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, base: str) -> dict[str, torch.Tensor]:
    """vitlab tensors -> HF names. `base` is "vit." inside ViTForImageClassification, "" for a ViTModel."""
    out = {base + "embeddings.cls_token": state["cls_token"],
           base + "embeddings.position_embeddings": state["pos_embed"]}  # fmt: skip
    for hf, vl in _module_map(config.depth):
        for p in ("weight", "bias"):
            out[f"{base}{hf}.{p}"] = state[f"{vl}.{p}"]
    for i in range(config.depth):
        for p in _qkv_params(config):
            q, k, v = state[f"blocks.{i}.attn.qkv.{p}"].chunk(3, dim=0)  # (3D, …) -> 3 × (D, …)
            for name, t in zip(("query", "key", "value"), (q, k, v), strict=True):
                out[f"{base}encoder.layer.{i}.attention.attention.{name}.{p}"] = t
    for p in ("weight", "bias"):
        if config.representation_size:
            out[f"{base}pooler.dense.{p}"] = state[f"pre_logits.0.{p}"]
        if config.num_classes:
            out[f"classifier.{p}"] = state[f"head.{p}"]
    return out


def from_hf_state_dict(tensors: dict[str, torch.Tensor], config: ViTConfig, base: str) -> dict[str, torch.Tensor]:
    """HF names -> vitlab tensors; the inverse of `to_hf_state_dict` (q, k, v concatenated into qkv)."""
    state = {"cls_token": tensors[base + "embeddings.cls_token"],
             "pos_embed": tensors[base + "embeddings.position_embeddings"]}  # fmt: skip
    for hf, vl in _module_map(config.depth):
        for p in ("weight", "bias"):
            state[f"{vl}.{p}"] = tensors[f"{base}{hf}.{p}"]
    for i in range(config.depth):
        for p in _qkv_params(config):
            parts = [tensors[f"{base}encoder.layer.{i}.attention.attention.{n}.{p}"] for n in ("query", "key", "value")]
            state[f"blocks.{i}.attn.qkv.{p}"] = torch.cat(parts, dim=0)  # 3 × (D, …) -> (3D, …)
    for p in ("weight", "bias"):
        if config.representation_size:
            state[f"pre_logits.0.{p}"] = tensors[f"{base}pooler.dense.{p}"]
        if config.num_classes:
            state[f"head.{p}"] = tensors[f"classifier.{p}"]
    return state


# --- reading -------------------------------------------------------------------------------------------------
def read_hf(path: str | Path) -> Checkpoint:
    """A `save_pretrained` folder of ViTForImageClassification or ViTModel (config.json with model_type "vit",
    model.safetensors or pytorch_model.bin, optionally preprocessor_config.json for mean/std)."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    cfg_path = folder / "config.json"
    hf = read_json(cfg_path)
    if hf.get("model_type") == "bit":  # BitForImageClassification / BitModel
        from .hf_bit import read_hf_bit

        return read_hf_bit(folder)
    if hf.get("model_type") != "vit":
        raise WeightsError(cfg_path, f"model_type {hf.get('model_type')!r} is not 'vit'",
                           "vitlab reads HF ViTForImageClassification / ViTModel folders")  # fmt: skip
    file, tensors = read_weights_folder(folder, ("model.safetensors", "pytorch_model.bin"))
    arch = hf_architecture(hf, tensors, cfg_path)
    base = "vit." if arch == CLASSIFIER else ""
    tensors, notes = _drop_unused(tensors, arch, base)
    mean, std = _normalisation(folder / PREPROCESSOR)
    config = config_from_hf(hf, cfg_path, arch, base + "pooler.dense.weight" in tensors, mean, std)
    meta_state = {k: torch.empty(s, device="meta") for k, s in expected_shapes(config, cfg_path, len(tensors)).items()}
    expected = {k: v.shape for k, v in to_hf_state_dict(meta_state, config, base).items()}
    check_against(file, expected, tensors, f"{arch} with this config.json")
    meta: dict[str, Any] = {"hf_architecture": arch}
    names = _class_names(hf, config.num_classes)
    if names:
        meta["class_names"] = names
    if not (folder / PREPROCESSOR).is_file():
        notes.append(f"no {PREPROCESSOR}: assumed mean = std = 0.5")
    if notes:
        meta["notes"] = notes
    return Checkpoint(config, from_hf_state_dict(tensors, config, base), source="hf", meta=meta)


def hf_architecture(hf: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path,
                    classes: tuple[str, str] = (CLASSIFIER, BACKBONE), base: str = "vit.") -> str:
    """The transformers class of a folder, one of (classifier, backbone): its config's `architectures`, else
    whether the tensors sit under the classifier's `base` prefix."""
    classifier, backbone = classes
    archs = hf.get("architectures") or []
    if archs:
        if archs[0] not in classes:
            raise WeightsError(path, f"architecture {archs[0]!r} is not supported",
                               f"vitlab reads {classifier} and {backbone} weights")  # fmt: skip
        return archs[0]
    return classifier if any(k.startswith(base) for k in tensors) else backbone


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
    num_classes = 0
    if arch == CLASSIFIER:
        num_classes = len(hf["id2label"]) if isinstance(hf.get("id2label"), dict) else int(hf.get("num_labels", 2))
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


def _class_names(hf: dict[str, Any], num_classes: int) -> list[str] | None:
    """id2label's names in index order, unless they are HF's placeholders LABEL_0, LABEL_1, …"""
    id2label = hf.get("id2label")
    if not num_classes or not isinstance(id2label, dict):
        return None
    names = [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(num_classes)]  # JSON keys are strings
    return None if names == [f"LABEL_{i}" for i in range(num_classes)] else names


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


def label_maps(num_classes: int, class_names: list[str] | None) -> dict[str, Any]:
    """transformers' id2label / label2id (its own LABEL_i names when the model has none)."""
    if not num_classes:
        return {}
    names = list(class_names or [f"LABEL_{i}" for i in range(num_classes)])
    return {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}


def write_hf_folder(folder: str | Path, config_json: dict[str, Any], preprocessor: dict[str, Any], card: str,
                    tensors: dict[str, torch.Tensor]) -> None:
    """config.json, the image processor's config, the model card and model.safetensors, into a temporary folder
    renamed into place; an existing folder is replaced only if it holds nothing but an earlier export."""

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        (tmp / PREPROCESSOR).write_text(json.dumps(preprocessor, indent=2) + "\n", encoding="utf-8")
        (tmp / CARD).write_text(card, encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    write_folder_atomically(folder, write, owned=HF_FILES)


def write_hf(model: nn.Module, folder: str | Path, source: str | Path | None = None) -> None:
    """A folder `transformers.ViTForImageClassification.from_pretrained` loads (a model without classifier is
    written as a ViTModel: pooler = pre_logits if it has one, else load it with add_pooling_layer=False).
    A model card (README.md) names `source`, the file converted. Written into a temporary folder and renamed
    into place; an existing folder is replaced only if it holds nothing but an earlier export. A BiT model is
    written as a BitForImageClassification / BitModel folder."""
    config = model.config
    if isinstance(config, BiTConfig):
        from .hf_bit import write_hf_bit

        return write_hf_bit(model, folder, source)
    check_hf_representable(config, folder)
    base = "vit." if config.num_classes else ""
    # clone: q, k and v are views of one qkv tensor, and safetensors refuses tensors that share memory
    tensors = {k: v.detach().to("cpu").clone() for k, v in to_hf_state_dict(model.state_dict(), config, base).items()}
    cfg = hf_config(config, getattr(model, "class_names", None))
    h, w = config.image_size
    pre = {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": h, "width": w},
           "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
           "image_mean": list(config.mean), "image_std": list(config.std)}  # fmt: skip

    write_hf_folder(folder, cfg, pre, model_card(model, "hf", folder, source), tensors)

"""Model cards: the README.md written into every exported folder (and, on request, `<name>.md` beside a file).

A card says what the weights are (architecture, parameters), where they came from (the file converted), how
images must be prepared (size, resize, mean/std) and how to load them in vitlab, timm or transformers, so that
an export copied elsewhere or uploaded to a model hub explains itself.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch import nn

from vitlab.constants import resize_before_crop, timm_resize
from vitlab.files.outputs import atomic_write, mark_text
from vitlab.models.config import BiTConfig, ModelConfig, ViTConfig
from vitlab.models.registry import bit_name, vitlab_name
from vitlab.models.timm_compat import eval_resize_of

CARD = "README.md"
_FORMAT_WORDS = {
    "vitlab": "vitlab safetensors (config and class names in the metadata)",
    "jax-npz": "the official JAX .npz layout (google-research/vision_transformer)",
    "bit-npz": "big_transfer's .npz layout (google-research/big_transfer)",
    "timm": "a timm model folder (config.json + model.safetensors)",
    "hf": "a Hugging Face transformers folder (config.json, preprocessor_config.json, model.safetensors)",
}
# vitlab's evaluation resizes (data/transforms.py) in words, with the official code each follows.
_RESIZE_WORDS = {
    "official": "the whole image resized to {h}×{w}, aspect ratio ignored, no crop (vit_jax input_pipeline)",
    "big_vision": "shorter side resized to {r}, then the central {h}×{w} crop (big_vision evaluation)",
    "resize-short-crop": "shorter side resized to {h}, then the central {h}×{w} crop",
}
_PAPERS = {
    "vit": "Dosovitskiy et al., *An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale*, "
    "ICLR 2021 (code: google-research/vision_transformer)",
    "bit": "Kolesnikov et al., *Big Transfer (BiT): General Visual Representation Learning*, ECCV 2020 "
    "(code: google-research/big_transfer)",
}


def architecture_words(config: ModelConfig) -> str:
    """"ViT-B/16" for a registry variant; the dimensions for anything else (a custom depth is no ViT-B)."""
    if isinstance(config, BiTConfig):
        return bit_name(config) or f"BiT ResNetV2 (units per stage {list(config.layers)}, width ×{config.width_factor})"
    name = vitlab_name(config)
    if name:
        return name
    stem = " with a ResNet stem" if config.resnet is not None else ""
    return (f"custom ViT{stem} (patch {config.patch_size}, width {config.width}, depth {config.depth}, "
            f"{config.num_heads} heads, MLP {config.mlp_dim})")  # fmt: skip


_MARKDOWN_SPECIAL = "\\`*_{}[]()#+-.!|~"
_HTML_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}


def markdown_text(text: str) -> str:
    """`text` (a class name from the user's data) as literal Markdown text: on one line, HTML's special
    characters as entities and Markdown's backslash-escaped, so that a name like `<script>`, `[x](javascript:…)`
    or `a | b` shows as written instead of becoming markup, a link or a table cell."""
    flat = " ".join(text.split())  # newlines and tabs would end the paragraph or the table row
    return "".join(_HTML_ENTITIES.get(c) or (f"\\{c}" if c in _MARKDOWN_SPECIAL else c) for c in flat)


def _model_rows(model: nn.Module) -> list[tuple[str, str]]:
    config = model.config
    h, w = config.image_size
    rows = [("architecture", architecture_words(config)),
            ("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
            ("input", f"{config.in_chans}×{h}×{w}")]  # fmt: skip
    if isinstance(config, ViTConfig):
        rows += [("patch / width / depth / heads / MLP",
                  f"{config.patch_size} / {config.width} / {config.depth} / {config.num_heads} / {config.mlp_dim}"),
                 ("classifier", f"{config.classifier} ({'class token' if config.classifier == 'token' else 'GAP'})"
                  + (f", representation layer {config.representation_size}" if config.representation_size else "")),
                 ("position embedding", config.pos_embed), ("GELU", config.gelu),
                 ("LayerNorm eps", f"{config.ln_eps:g}")]
        if config.resnet is not None:
            rows.append(("ResNet stem", f"units {list(config.resnet.layers)}, width ×{config.resnet.width_factor}"))
    else:
        rows += [("GroupNorm eps / weight-standardisation eps", f"{config.gn_eps:g} / {config.ws_eps:g}")]
    rows.append(("classes", str(config.num_classes) if config.num_classes else "none (features only)"))
    return rows  # fmt: skip


def preprocessing_lines(config: ModelConfig, eval_resize: str, fmt: str) -> list[str]:
    h, w = config.image_size
    resize = _RESIZE_WORDS.get(eval_resize, eval_resize).format(h=h, w=w, r=resize_before_crop(max(h, w)))
    interpolation = "bilinear"
    if (timm := timm_resize(eval_resize)) is not None:  # timm's evaluation transform, in its own terms
        interpolation, crop_pct, crop_mode = timm
        scaled = f"{math.floor(h / crop_pct)}" if h == w else f"{math.floor(h / crop_pct)}×{math.floor(w / crop_pct)}"
        resize = (f"{'the whole image' if crop_mode == 'squash' else 'shorter side'} resized to {scaled} "
                  f"(the input size / crop_pct {crop_pct:g}), then the central {h}×{w} crop (timm's evaluation)")
    lines = [
        "- RGB; " + resize + f"; {interpolation} resampling.",
        f"- Values: x / 255, then (x − mean) / std with mean {list(config.mean)} and std {list(config.std)}.",
        "- In Python: `vitlab.transforms(model)` is exactly this pipeline (what `vitlab eval` feeds the model).",
    ]
    if fmt == "timm":
        lines.append("- timm: `config.json` states it (interpolation, crop_pct, crop_mode, mean, std) for "
                     "`timm.data.resolve_data_config`.")
    if fmt == "hf":
        if eval_resize == "official":
            lines.append("- transformers: `preprocessor_config.json` does the same resize and normalisation.")
        else:
            lines.append("- transformers: `preprocessor_config.json` resizes the whole image (its image processor "
                         "has no central crop); use `vitlab.transforms` to reproduce the evaluation exactly.")
    return lines  # fmt: skip


def _loading(model: nn.Module, fmt: str, name: str) -> list[str]:
    lines = ["```python", "import vitlab", "", f'model = vitlab.load("{name}")',
             'x = vitlab.transforms(model)("image.jpg")  # float (3, H, W)',
             "probs = model(x[None]).softmax(-1)[0]", "```"]  # fmt: skip
    if fmt == "timm":
        k = model.config.num_classes
        lines += ["", "timm:", "", "```python", "import timm", "",
                  f'model = timm.create_model("local-dir:{name}", pretrained=True).eval()',
                  "transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))",
                  "```", "",
                  "By architecture name, with these weights as the pretrained file: `pretrained_cfg_overlay` needs "
                  f"`num_classes` ({k} here). Without it timm takes the name's default (1000 classes) for the file's "
                  "and, seeing the model's differ, silently leaves the file's head out: a random classifier.", "",
                  "```python", "import json", "", "import timm", "",
                  f'cfg = json.load(open("{name}/config.json"))',
                  'model = timm.create_model(cfg["architecture"], pretrained=True, **cfg.get("model_args", {}),',
                  f'                          pretrained_cfg_overlay=dict(file="{name}/model.safetensors", '
                  f"num_classes={k})).eval()",
                  "```"]  # fmt: skip
    elif fmt == "hf":
        auto = "AutoModelForImageClassification" if model.config.num_classes else "AutoModel"
        # a ViTModel written without pre_logits has no pooler (write_hf)
        plain = isinstance(model.config, ViTConfig) and not model.config.num_classes
        extra = ", add_pooling_layer=False" if plain and not model.config.representation_size else ""
        lines += ["", "transformers:", "", "```python", f"from transformers import AutoImageProcessor, {auto}", "",
                  f'processor = AutoImageProcessor.from_pretrained("{name}")',
                  f'model = {auto}.from_pretrained("{name}"{extra}).eval()', "```"]  # fmt: skip
    elif fmt in ("jax-npz", "bit-npz"):
        code = "big_transfer's bit_jax / bit_pytorch `load_from`" if fmt == "bit-npz" else "vit_jax `checkpoint.load`"
        lines += ["", f"The official code reads it too ({code})."]
    return lines


def model_card(model: nn.Module, fmt: str, dest: str | Path, source: str | Path | None = None) -> str:
    """The card's Markdown for `model` exported as `fmt` to `dest`; `source` is the file it was converted from."""
    config = model.config
    dest = Path(dest)
    eval_resize = eval_resize_of(model)
    family = "bit" if isinstance(config, BiTConfig) else "vit"
    front = {"timm": ["library_name: timm"], "hf": ["library_name: transformers"]}.get(fmt, [])
    tags = ["image-classification" if config.num_classes else "image-feature-extraction", "vitlab",
            "bit" if family == "bit" else "vision-transformer"]  # fmt: skip
    # the mark after the front matter (which must come first): an earlier export may be replaced, a user's README not
    out = ["---", *front, "tags:", *[f"- {t}" for t in tags], "---", mark_text(), "", f"# {dest.name}", "",
           f"{architecture_words(config)} weights, written by vitlab as {_FORMAT_WORDS.get(fmt, fmt)}.", "",
           "## Model", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in _model_rows(model)], ""]  # fmt: skip
    names = getattr(model, "class_names", None)
    if names:
        shown = ", ".join(markdown_text(n) for n in names[:10]) + (
            f", … ({len(names)} in all)" if len(names) > 10 else "")
        out += [f"Classes in label order: {shown}.", ""]
    src = f"Converted from `{source}`." if source else "Saved from a model in memory (no source file recorded)."
    out += ["## Source", "", src, "", "## Pre-processing", "", *preprocessing_lines(config, eval_resize, fmt), "",
            "## How to load", "", *_loading(model, fmt, dest.name), "", "## Reference", "", _PAPERS[family], ""]
    return "\n".join(out)


def write_card(model: nn.Module, fmt: str, dest: str | Path, source: str | Path | None = None) -> Path:
    """`<dest stem>.md` beside a file export (folders get README.md from their writer); written atomically."""
    dest = Path(dest)
    card = dest.with_suffix(".md")
    text = model_card(model, fmt, dest, source)
    atomic_write(card, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return card


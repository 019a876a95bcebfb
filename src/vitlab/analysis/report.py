"""`analyze`: every Section 4.5 analysis of one model on a batch of images, written to a folder as PNG figures,
`summary.json` (the numbers) and `index.html` (the figures with captions)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.analysis import figures
from vitlab.analysis.attention import (
    attention_distance_from_attention,
    class_token_attention_from_attention,
    inference,
    pooled_row,
    require_vit,
    rollout_from_attention,
    run_attention,
)
from vitlab.analysis.embeddings import (
    diagnostic_messages,
    embedding_filters,
    filter_diagnostics,
    position_embedding_similarity,
    row_column_summary,
)
from vitlab.analysis.images import dataset_inputs, image_file_inputs, is_grey, to_display
from vitlab.data.hf_split import is_hf_source
from vitlab.files.outputs import WRITTEN_BY, atomic_write, check_replaceable, mark_text
from vitlab.models import VisionTransformer
from vitlab.progress import progress
from vitlab.runtime.precision import Precision
from vitlab.runtime.session import compile_session, open_session

CHUNK = 16  # images per forward pass: bounds the (L, N, H, T, T) attention tensor held at once

# The summary.json of vitlab analyze from before it said so (replaced by the next analysis).
SUMMARY_KEYS = frozenset({"model", "input", "rollout", "notes", "figures"})
# Every figure analyze may write: held to the output rule with summary.json before any work.
FIGURE_FILES = ("embedding_filters.png", "position_similarity.png", "attention_distance.png",
                "attention_rollout.png", "last_layer_heads.png")


@dataclass
class AttentionStats:
    grid: tuple[int, int]
    distance: torch.Tensor  # (L, H) pixels, averaged over all images
    rollout: torch.Tensor  # (N, gh, gw)
    last_layer_heads: torch.Tensor  # (N, H, gh, gw) class-token attention of the last layer


def collect_attention(model: nn.Module, x: torch.Tensor, head_fusion: str, discard_ratio: float) -> AttentionStats:
    """One explicit-attention forward per chunk of images; rollout, head maps and distances from the same
    weights. Distances are summed weighted by chunk size so the result is the mean over all images."""
    cfg = require_vit(model).config
    prefix, stride = cfg.num_prefix_tokens, cfg.total_stride
    rollouts, heads, dist_sum = [], [], None
    for chunk in progress(x.split(CHUNK), desc="attention", unit="batch"):
        attn, grid = run_attention(model, chunk)  # (L, n, H, T, T)
        rolled = rollout_from_attention(attn, head_fusion, discard_ratio, prefix)  # (n, T, T)
        rollouts.append(pooled_row(rolled, prefix)[:, prefix:].reshape(-1, *grid))
        heads.append(class_token_attention_from_attention(attn[-1], grid, prefix))
        dist = torch.stack([attention_distance_from_attention(a, grid, stride, prefix) for a in attn])  # (L, H)
        dist_sum = dist * len(chunk) if dist_sum is None else dist_sum + dist * len(chunk)
    return AttentionStats(grid, dist_sum / len(x), torch.cat(rollouts), torch.cat(heads))


def _model_summary(model: nn.Module) -> dict[str, Any]:
    cfg = model.config
    return {
        "name": cfg.name, "native_image_size": list(cfg.image_size), "patch_size": cfg.patch_size,
        "effective_patch_px": cfg.total_stride, "depth": cfg.depth, "heads": cfg.num_heads, "width": cfg.width,
        "classifier": cfg.classifier, "pos_embed": cfg.pos_embed, "hybrid": cfg.resnet is not None,
    }


def _embedding_figures(model: nn.Module, grid: tuple[int, int], out: Path, summary: dict, k: int,
                       grey_inputs: bool) -> list:
    """Fig. 7 left and centre; each is skipped with a note where the model lacks what it draws."""
    entries = []
    try:
        filt = embedding_filters(model, k)
        diag = filter_diagnostics(model)
        notes = diagnostic_messages(diag)
        if grey_inputs:
            notes.append("The analysed images are grey (R = G = B). If the model was trained on such images, the "
                         "colour differences of its filters never received a gradient and keep their initial noise.")
        figures.plot_embedding_filters(filt, out / "embedding_filters.png", notes=notes)
        ratios = [round(float(r), 6) for r in filt.explained_variance_ratio]
        summary["embedding_filters"] = {"explained_variance_ratio": ratios,
                                        "diagnostics": {key: v if isinstance(v, bool) else round(v, 6)
                                                        for key, v in diag.items()}}
        summary["notes"] += notes
        entries.append(("embedding_filters.png", f"First {len(ratios)} principal components of the patch-embedding"
                        f" filters (paper Fig. 7 left); together they explain {sum(ratios):.1%} of the variance."
                        + "".join(f" {note}" for note in notes)))
    except ValueError as err:
        summary["embedding_filters"] = None
        summary["notes"].append(f"embedding filters skipped: {err}")
    try:
        sim = position_embedding_similarity(model, grid)
        figures.plot_position_similarity(sim, out / "position_similarity.png")
        rc = {key: None if v is None else round(v, 4) for key, v in row_column_summary(sim).items()}
        summary["position_embedding_similarity"] = {"grid": list(grid), **rc}
        fmt = {key: "n/a" if v is None else f"{v:.2f}" for key, v in rc.items()}
        entries.append(("position_similarity.png", "Cosine similarity of each patch's position embedding with all "
                        f"others (paper Fig. 7 centre). Mean similarity of pairs in the same row {fmt['same_row']}, "
                        f"same column {fmt['same_column']}, neither {fmt['other']}."))
    except ValueError as err:
        summary["position_embedding_similarity"] = None
        summary["notes"].append(f"position-embedding similarity skipped: {err}")
    return entries


def _attention_figures(model: nn.Module, x: torch.Tensor, stats: AttentionStats, out: Path, summary: dict,
                       labels: Sequence[figures.RowLabel] = ()) -> list:
    cfg, size = model.config, tuple(x.shape[-2:])
    g = stats.grid[0] * stats.grid[1]
    uniform = float(attention_distance_from_attention(torch.ones(1, 1, g, g), stats.grid, cfg.total_stride, 0)[0])
    figures.plot_attention_distance(stats.distance, out / "attention_distance.png", size, uniform)
    per_layer = stats.distance.mean(dim=1)
    shown = min(len(x), figures.MAX_DRAWN_IMAGES)
    images = to_display(x[:shown], cfg)
    fusion, ratio = summary["rollout"]["head_fusion"], summary["rollout"]["discard_ratio"]
    figures.plot_rollout(images, stats.rollout, out / "attention_rollout.png",
                         f"Attention rollout ({fusion} over heads, discard ratio {ratio:g})", labels)
    pooled = "class-token" if cfg.classifier == "token" else "mean-over-tokens"
    figures.plot_head_maps(images, stats.last_layer_heads, out / "last_layer_heads.png",
                           f"Last layer (layer {cfg.depth}): {pooled} attention per head", labels)
    summary["uniform_attention_distance_px"] = round(uniform, 4)
    summary["mean_attention_distance_px"] = [[round(float(v), 4) for v in row] for row in stats.distance]
    summary["mean_attention_distance_per_layer_px"] = [round(float(v), 4) for v in per_layer]
    return [
        ("attention_distance.png", f"Mean attention distance of each head against depth (paper Fig. 7 right), "
         f"{size[0]}×{size[1]} input, {len(x)} images. Layer means go from {per_layer[0]:.1f} px (layer 1) to "
         f"{per_layer[-1]:.1f} px (layer {len(per_layer)}); uniform attention would give {uniform:.1f} px."),
        ("attention_rollout.png", f"Attention rollout of the {pooled} output over all layers, laid over the "
         f"input (first {shown} images)."),
        ("last_layer_heads.png", f"{pooled.capitalize()} attention of each head in the last layer "
         f"(first {shown} images)."),
    ]


def write_index(out: Path, summary: dict, entries: list[tuple[str, str]]) -> Path:
    """A self-contained page: the figures with captions, the notes, a link to the numbers. A note a caption
    already carries (the embedding filters' diagnosis) is not listed again: each says its point once."""
    m = summary["model"]
    title = f"vitlab analyze: {m['name'] or 'model'}"
    parts = [f"<!doctype html>{mark_text('vitlab analyze')}<meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:100%}"
             "figure{margin:2em 0}figcaption{color:#333}</style>", f"<h1>{html.escape(title)}</h1>",
             f"<p>{html.escape(summary['input']['description'])}. Numbers: <a href='summary.json'>summary.json</a>"
             "</p>"]
    for name, caption in entries:
        parts.append(f"<figure><img src='{name}' alt='{name}'><figcaption>{html.escape(caption)}</figcaption>"
                     "</figure>")
    notes = [n for n in summary["notes"] if not any(n in caption for _, caption in entries)]
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    path = out / "index.html"
    text = "\n".join(parts) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


@torch.no_grad()
def predict_classes(model: nn.Module, x: torch.Tensor, class_names: Sequence[str] | None = None) -> list[dict | None]:
    """Per image the model's top class and its softmax probability; None for models without a classifier
    (a self-supervised encoder)."""
    k = model.config.num_classes
    if not k:
        return [None] * len(x)
    names = list(class_names) if class_names is not None and len(class_names) == k else [str(i) for i in range(k)]
    p = next(model.parameters())
    with inference(model):
        logits = [model(c.to(device=p.device, dtype=p.dtype)).float().cpu() for c in x.split(CHUNK)]
    probs = torch.cat(logits).softmax(-1)
    top = probs.max(dim=-1)
    return [{"class": names[j], "index": j, "probability": round(float(v), 6)}
            for v, j in zip(top.values.tolist(), top.indices.tolist(), strict=True)]


def describe_images(model: nn.Module, x: torch.Tensor, images: Sequence[dict] | None,
                    class_names: Sequence[str] | None) -> tuple[list[dict], list[figures.RowLabel]]:
    """(summary records, figure labels): file, true class (None: unknown), prediction, and whether it is right."""
    images = list(images) if images is not None else [{"file": f"image {i + 1}", "true_class": None}
                                                       for i in range(len(x))]
    records, labels = [], []
    for item, pred in zip(images, predict_classes(model, x, class_names), strict=True):
        true = item.get("true_class")
        correct = None if pred is None or true is None else pred["class"] == true
        records.append({"file": item["file"], "true_class": true,
                        "predicted_class": None if pred is None else pred["class"],
                        "probability": None if pred is None else pred["probability"], "correct": correct})
        text = None if pred is None else f"{pred['class']} {100 * pred['probability']:.0f}%"
        labels.append(figures.RowLabel(item["file"], true, text, correct))
    return records, labels


def analyze(
    model: nn.Module, x: torch.Tensor, out_dir: str | Path, *, head_fusion: str = "mean",
    discard_ratio: float = 0.0, components: int = 28, source: str = "images",
    images: Sequence[dict] | None = None, class_names: Sequence[str] | None = None,
    inputs: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """All analyses on normalised images x (N, C, H, W): figures, summary.json and index.html in out_dir.
    `images`: per image {"file", "true_class"} (see analysis.images); `class_names`: the classifier's (default:
    the model's own, else indices); `inputs`: the files and folders read, which no output may replace. Returns the
    summary dict."""
    vit = require_vit(model)
    out = Path(out_dir)
    # before any work: a summary.json or index.html of the user's is never replaced
    check_replaceable(out, "summary.json", "vitlab analyze", ("index.html", *FIGURE_FILES), legacy_keys=SUMMARY_KEYS,
                      inputs=inputs)
    out.mkdir(parents=True, exist_ok=True)
    stats = collect_attention(vit, x, head_fusion, discard_ratio)
    records, labels = describe_images(vit, x, images, class_names or getattr(vit, "class_names", None))
    size = list(x.shape[-2:])
    summary: dict[str, Any] = {
        WRITTEN_BY: "vitlab analyze",
        "model": _model_summary(vit),
        "input": {"image_size": size, "grid": list(stats.grid), "num_images": len(x), "source": source,
                  "description": f"{len(x)} {source}, {size[0]}×{size[1]} pixels, {stats.grid[0]}×"
                                 f"{stats.grid[1]} patches of {vit.config.total_stride} px",
                  "images": records},
        "rollout": {"head_fusion": head_fusion, "discard_ratio": discard_ratio,
                    "maps": [[[round(float(v), 6) for v in row] for row in m] for m in stats.rollout]},
        "notes": [],
    }
    entries = _embedding_figures(vit, stats.grid, out, summary, components, is_grey(x, vit.config))
    entries += _attention_figures(vit, x, stats, out, summary, labels)
    summary["figures"] = {name: caption for name, caption in entries}
    text = json.dumps(summary, indent=2) + "\n"
    atomic_write(out / "summary.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    write_index(out, summary, entries)
    return summary


def analyze_weights(
    weights: str | Path, out_dir: str | Path, *, images: Sequence[str] | None = None, data: str = "digits",
    image_size: tuple[int, int] | None = None, num_images: int = 8, head_fusion: str = "mean",
    discard_ratio: float = 0.0, components: int = 28, device: str = "auto", precision: str = "auto",
    compile: bool | str = "auto",
) -> tuple[dict[str, Any], Precision]:
    """`vitlab analyze`: `analyze` of saved weights (a ViT or hybrid) on image files, or on `num_images` held-out
    images of `data` (an image file there: that image), at `image_size` (default: the model's native size).
    `compile`: auto, on or off (True / False): the path the analysis reads (`forward_inspect`: tokens and
    attention weights) compiled with frozen weights, auto deciding from the number of images (`compile_session`).
    Returns (the summary, the precision it computed in: bf16 under autocast, float32 weights)."""
    session = open_session(weights, device=device, precision=precision, cast_weights=False, compile="auto")
    model = session.model
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"{weights} holds a {type(model).__name__}; analyze needs a ViT or hybrid (attention)")
    cfg = model.config
    size = tuple(image_size or cfg.image_size)
    stride = cfg.total_stride
    if size[0] % stride or size[1] % stride:
        raise ValueError(f"image size {size[0]}x{size[1]} is not a multiple of the effective patch size {stride}")
    model.dynamic_img_size = size != tuple(cfg.image_size)  # asked for: the position embedding resampled
    class_names = getattr(model, "class_names", None)
    if images:
        picked = image_file_inputs(images, cfg, size, class_names or ())
    elif Path(data).is_file() and not is_hf_source(data):  # --data photo.jpg: the image itself
        picked = image_file_inputs([data], cfg, size, class_names or ())
    else:
        picked = dataset_inputs(data, cfg, size, num_images)
    session = compile_session(session, compile, len(picked.x), method="forward_inspect")
    with session.autocast():
        summary = analyze(model, picked.x, out_dir, head_fusion=head_fusion, discard_ratio=discard_ratio,
                          components=components, source=picked.source, images=picked.images, class_names=class_names,
                          inputs=(weights, data, *(images or ())))
    return summary, session.precision

"""What is measured on a finished run, each stored in the run's result.json under its name so it is computed once:

- `fewshot/<data>`: few-shot linear accuracy of the frozen representation (paper Section 4.1: closed-form ridge,
  big_vision's protocol, 3 draws per shot count), read at `pre_logits` as the paper does;
- `fewshot-encoder/<data>`: the same on the pooled encoder output, before a ViT's tanh representation layer (which
  pre-training fits to its own classes: at small scale it can cost transfer what the encoder learnt);
- `attention/<data>`: mean attention distance per layer and head (paper Appendix D.7, Fig. 7 right) on held-out
  images of <data>, with the distance uniform attention would give;
- `upstream/<data>`: top-1 of the model's own classifier on <data>'s validation split (data-scaling scores every
  nested pre-training set's model on the largest set's held-out images: the classes are the same);
- `curve/<data>`: 5-shot accuracy of the weights at each checkpoint the run kept (paper Fig. 9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vitlab.eval import evaluate_weights, fewshot_weights
from vitlab.runtime import open_session

CURVE_SHOTS = 5


def parse(name: str) -> tuple[str, str]:
    """'fewshot/mnist' -> ('fewshot', 'mnist')."""
    kind, _, data = name.partition("/")
    if kind not in EVALS or not data:
        raise ValueError(f"unknown evaluation {name!r}; use one of {', '.join(k + '/<data>' for k in EVALS)}")
    return kind, data


def evaluate(name: str, run_dir: Path, scale: Any) -> Any:
    kind, data = parse(name)
    return EVALS[kind](run_dir, data, scale)


def _load(weights: Path) -> torch.nn.Module:
    return open_session(weights, device="auto", precision="fp32").model


def fewshot(run_dir: Path, data: str, scale: Any, representation: str = "pre_logits") -> dict[str, Any]:
    """{shots: {"mean", "per_seed"}} of the run's final weights."""
    result = fewshot_weights(_load(run_dir / "model.safetensors"), data, tuple(scale.shots), seeds=scale.fewshot_seeds,
                             representation=representation)
    return {"accuracy": result.table, "test_images": result.splits["test_images"], "representation": representation}


def fewshot_encoder(run_dir: Path, data: str, scale: Any) -> dict[str, Any]:
    return fewshot(run_dir, data, scale, representation="encoder")


def attention(run_dir: Path, data: str, scale: Any) -> dict[str, Any]:
    """(L, H) mean attention distance in pixels over held-out images of `data`, one per class in turn."""
    from vitlab.analysis import attention_distance_from_attention, dataset_inputs, mean_attention_distance  # (start-up)

    model = _load(run_dir / "model.safetensors")
    cfg = model.config
    inputs = dataset_inputs(data, cfg, cfg.image_size, scale.attention_images)
    distance = torch.stack([mean_attention_distance(model, chunk) * len(chunk)
                            for chunk in inputs.x.split(32)]).sum(0) / len(inputs.x)  # (L, H)
    g = cfg.grid_size()[0] * cfg.grid_size()[1]
    uniform = attention_distance_from_attention(torch.ones(1, 1, g, g), cfg.grid_size(), cfg.total_stride, 0)
    return {"distance_px": [[round(float(v), 4) for v in row] for row in distance],
            "uniform_px": round(float(uniform[0]), 4), "images": len(inputs.x), "source": inputs.source}


def upstream(run_dir: Path, data: str, scale: Any) -> dict[str, Any]:
    """{"top1", "top5", "loss", "count"} of the run's final weights on `data`'s validation split, as `vitlab eval`
    computes them."""
    metrics = evaluate_weights(run_dir / "model.safetensors", data, "val", workers=0, progress=False,
                               precision="fp32").metrics  # the designs pin float32
    return {k: round(float(v), 6) for k, v in metrics.items()}


def curve(run_dir: Path, data: str, scale: Any) -> dict[str, Any]:
    """[[step, 5-shot mean accuracy]] of the weights kept at the run's checkpoints (runner.keep_curve_weights)."""
    files = sorted((run_dir / "curve").glob("step_*.safetensors"))
    if not files:
        raise ValueError(f"{run_dir} kept no checkpoint weights to draw a curve from; delete the run directory to "
                         "train it again")
    points = []
    for path in files:
        table = fewshot_weights(_load(path), data, (CURVE_SHOTS,), seeds=scale.fewshot_seeds).table
        points.append([int(path.stem.split("_")[1]), table[str(CURVE_SHOTS)]["mean"]])
    return {"shots": CURVE_SHOTS, "points": points}


EVALS = {"fewshot": fewshot, "fewshot-encoder": fewshot_encoder, "attention": attention, "upstream": upstream,
         "curve": curve}

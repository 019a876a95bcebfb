"""`vitlab models`: the named variants with their size and cost (`--pretrained`: the published checkpoints)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vitlab.cli.types import image_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the named models with parameters and multiply-adds",
                       description="Every name vitlab.create_model accepts, with its parameter count (1000 "
                                   "classes) and multiply-adds per image (the paper's 'FLOPs').")
    p.add_argument("--image-size", type=image_size, default=224,
                   help="input size for the multiply-add count (default 224)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--pretrained", action="store_true", help="list the published checkpoints vitlab fetches by name")
    p.add_argument("--model", help="with --pretrained: only this architecture (e.g. ViT-B/16)")
    p.add_argument("--dataset", help="with --pretrained: pre-training or fine-tuning data (i21k, i1k)")
    p.add_argument("--resolution", type=image_size, help="with --pretrained: only this input size")
    p.set_defaults(func=run_models)


def model_rows(image_size: int = 224) -> list[dict[str, Any]]:
    """One row per registry name: parameters at 1000 classes, multiply-adds per image at image_size, both counted
    from the config (no model is built)."""
    from vitlab.models import count_macs, count_parameters, model_config, variant_names

    rows = []
    for name in variant_names():
        cfg = model_config(name, num_classes=1000)
        params = count_parameters(cfg)
        try:
            gmacs: float | None = count_macs(cfg.replace(image_size=image_size)).total / 1e9
        except ValueError:  # the model's patch size (times its stem's stride) does not divide image_size
            gmacs = None
        rows.append({"name": name, "params": params, "gmacs": gmacs, "image_size": image_size})
    return rows


def run_models(args: argparse.Namespace) -> int:
    from vitlab.cli import UserError

    if args.pretrained:
        from vitlab.cli.download import run_pretrained

        return run_pretrained(args)
    if args.image_size < 1:
        raise UserError(f"--image-size must be positive, not {args.image_size}")
    rows = model_rows(args.image_size)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    size = args.image_size
    print(f"{'name':<16} {'params':>13}  {f'GMACs@{size}':>11}")
    for r in rows:
        gmacs = "-" if r["gmacs"] is None else f"{r['gmacs']:.2f}"
        print(f"{r['name']:<16} {r['params']:>13,}  {gmacs:>11}")
    print("GMACs: multiply-adds per image, the unit the paper calls FLOPs (1 MAC = 2 FLOPs); "
          "'-': the size is not a multiple of the model's patch size.")
    return 0

"""`vitlab info` and `vitlab convert`."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.types import class_count, force_help, image_size

USE_EMA = ("a training checkpoint's exponential-moving-average weights (timm's train.py state_dict_ema), as timm's "
           "use_ema; default: its trained weights")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="show the format and architecture of a weights file or folder",
                       description="Show what a weights file holds: format, inferred architecture, sizes.")
    p.add_argument("path", help="official .npz, timm folder/state dict, HF folder, vitlab .safetensors, a run or "
                   "checkpoint directory (its model.safetensors) or a published checkpoint's name")
    p.add_argument("--arch", help="architecture name for a bare timm state dict (e.g. vit_small_patch16_224)")
    p.add_argument("--use-ema", action="store_true", help=USE_EMA)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_info)

    p = sub.add_parser("convert", help="convert weights between formats",
                       description="Convert weights: official .npz, timm, HF and vitlab in any direction.")
    p.add_argument("src", help="weights to read: any format vitlab.load accepts, a run or checkpoint directory "
                   "(its model.safetensors; a run without one: its newest intact checkpoint) or a published "
                   "checkpoint's name")
    p.add_argument("dst", help="output path: .safetensors (vitlab), .npz (official JAX) or a folder (--to)")
    p.add_argument("--to", choices=["vitlab", "jax-npz", "bit-npz", "timm", "hf"],
                   help="output format (default: by suffix; .npz of a BiT is big_transfer's layout)")
    p.add_argument("--image-size", type=image_size, help="resample the position embedding to this input size")
    p.add_argument("--num-classes", type=class_count, help="replace the head (zero-initialised) with this many classes")
    p.add_argument("--arch", help="architecture name for a bare timm state dict")
    p.add_argument("--use-ema", action="store_true", help=USE_EMA)
    p.add_argument("--numbering", choices=["pre-linen", "linen"], default="pre-linen",
                   help="module numbering of a written .npz (2020 releases: pre-linen; default: %(default)s)")
    p.add_argument("--card", action="store_true",
                   help="also write a model card <name>.md beside a file export (architecture, source, "
                   "pre-processing, how to load); folder exports (timm, hf) always hold one as README.md")
    p.add_argument("--force", action="store_true",
                   help=force_help("the output") + "; an export folder holding other files is never replaced")
    p.set_defaults(func=run_convert)


def run_info(args: argparse.Namespace) -> int:
    from vitlab.weights.convert import describe

    info = describe(args.path, arch=args.arch, use_ema=args.use_ema)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    cfg = info.pop("config")
    for key, value in info.items():
        print(f"{key:>20}: {value}")
    fields = ["image_size", "patch_size", "width", "depth", "num_heads", "mlp_dim", "num_classes", "classifier",
              "representation_size", "pos_embed", "gelu", "ln_eps", "resnet", "layers", "width_factor", "gn_eps",
              "ws_eps"]
    for key in fields:
        if key in cfg:
            print(f"{key:>20}: {cfg[key]}")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from vitlab.weights.convert import convert

    options = {"numbering": args.numbering} if (args.to == "jax-npz" or str(args.dst).endswith(".npz")) else {}
    fmt = convert(args.src, args.dst, to=args.to, image_size=args.image_size, num_classes=args.num_classes,
                  arch=args.arch, use_ema=args.use_ema, card=args.card, force=args.force, **options)
    print(f"wrote {args.dst} ({fmt})")
    return 0

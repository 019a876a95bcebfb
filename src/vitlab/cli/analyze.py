"""`vitlab analyze`: the paper's Section 4.5 figures for a weights file (see `vitlab.analysis.analyze`)."""

from __future__ import annotations

import argparse

from vitlab.cli.types import (
    DATA_SOURCES,
    PRECISION_HELP,
    add_compile_flags,
    device_name,
    float_range,
    image_size,
    int_range,
    new_or_folder,
    precision_name,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="figures of attention, attention distance and embeddings (paper Section 4.5)",
        description="Write the paper's Section 4.5 figures for a ViT or hybrid: PCA of the embedding filters, "
        "position-embedding similarity, mean attention distance per head against depth, attention rollout and "
        "last-layer per-head attention, as PNG files with index.html and summary.json.",
    )
    p.add_argument("--weights", required=True, help="weights (any format vitlab.load reads) or a run directory")
    p.add_argument("--images", nargs="+", metavar="IMG",
                   help="image files (default: --num-images held-out images of --data). A file in a folder named "
                        "after one of the model's classes is labelled with that class")
    p.add_argument("--out", required=True, type=new_or_folder, help="output folder (created if needed)")
    p.add_argument("--image-size", type=image_size, nargs="+", metavar="PX",
                   help="input size H [W] (default: the model's native size); a multiple of the patch size")
    p.add_argument("--data", default="digits",
                   help="without --images: its val or test split (a plain folder tree: the whole tree) of "
                        + DATA_SOURCES + ", or an image file (default digits)")
    p.add_argument("--num-images", type=int_range(1, 1024), default=8,
                   help="images of --data to use, one per class in turn (default 8; figures show the first 8)")
    p.add_argument("--head-fusion", choices=["mean", "max", "min"], default="mean",
                   help="how rollout combines heads (default mean, as in the paper)")
    p.add_argument("--discard-ratio", type=float_range(0.0, 1.0, high_open=True), default=0.0,
                   help="share of the lowest attention weights rollout drops per layer (default 0)")
    p.add_argument("--components", type=int_range(1, 1024), default=28,
                   help="principal components of the filters (default 28)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="cpu, cuda or cuda:N (default auto: CUDA when available)")
    p.add_argument("--precision", type=precision_name(int8=False), default="auto", help=PRECISION_HELP)
    add_compile_flags(p)
    p.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    from vitlab.analysis import analyze_weights
    from vitlab.cli import UserError

    if args.image_size and len(args.image_size) > 2:
        raise UserError("--image-size takes one or two positive numbers: H [W]")
    size = (args.image_size[0], args.image_size[-1]) if args.image_size else None
    summary, chosen = analyze_weights(
        args.weights, args.out, images=args.images, data=args.data, image_size=size, num_images=args.num_images,
        head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, components=args.components,
        device=args.device, precision=args.precision, compile=args.compile)
    print(f"analysed {summary['input']['description']} (precision {chosen.name}: {chosen.reason})")
    for name in summary["figures"]:
        print(f"wrote {args.out}/{name}")
    for note in summary["notes"]:
        print(f"note: {note}")
    print(f"wrote {args.out}/summary.json and {args.out}/index.html")
    return 0

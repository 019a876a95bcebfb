"""`vitlab shards SRC OUT`: pack an image folder or a Hugging Face dataset into WebDataset tar shards that
`--data OUT` reads."""

from __future__ import annotations

import argparse

from vitlab.cli.types import fraction


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shards", help="pack an image folder or Hugging Face dataset into WebDataset tar shards",
                       description="Pack SRC (root/<class>/*.jpg, root/train|val/<class>/*.jpg, or a Hugging Face "
                                   "dataset on disk: a save_to_disk folder or .parquet files, SRC#image=COL,label=COL "
                                   "choosing columns) into tar shards "
                                   "OUT/<split>-000000.tar… holding each image's original bytes (JPEG, PNG, WebP; "
                                   "other formats as lossless PNG) and its class index, "
                                   "plus OUT/_info.json (classes, shard counts, byte offsets). Shards are written "
                                   "atomically one by one; re-running resumes after the last complete shard. "
                                   "Images (or rows) that do not decode are reported and left out. Train with "
                                   "--data OUT.")
    p.add_argument("src", metavar="SRC", help="the image folder or Hugging Face dataset to pack")
    p.add_argument("out", metavar="OUT", help="the folder the shards go to (created; resumed if it holds shards)")
    p.add_argument("--shard-size", default="1GB",
                   help="bytes per shard: 1GB, 256MB, 512MiB or a number of bytes (default 1GB)")
    p.add_argument("--val-fraction", type=fraction,
                   help="pack a stratified share of each class of train/ as the val split (seed 0) instead of "
                        "SRC/val/")
    p.set_defaults(func=run_shards)


def run_shards(args: argparse.Namespace) -> int:
    from vitlab.data.pack import pack_shards, parse_size

    result = pack_shards(args.src, args.out, parse_size(args.shard_size), args.val_fraction)
    for split, count in result.counts.items():
        print(f"{split}: {count} images in {result.shards[split]} shard(s)")
    state = f"{result.written} shard(s) written" if result.written else "nothing to do: every shard was complete"
    skipped = f"; {len(result.skipped)} undecodable image(s) skipped" if result.skipped else ""
    print(f"{result.out}: {state}{skipped}")
    return 0

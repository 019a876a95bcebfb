"""`vitlab download NAME…` (fetch published checkpoints ahead of time) and the `vitlab models --pretrained` table."""

from __future__ import annotations

import argparse
import json
from typing import Any

EPILOG = ("Names: TAG:MODEL (augreg-i21k:ViT-B/16; `vitlab models --pretrained` lists them), hf-hub:owner/name, "
          "augreg:FILENAME (any run of the AugReg index) and augreg-index. Files go to $VITLAB_CACHE (default "
          "~/.cache/vitlab), Hugging Face repositories to huggingface_hub's cache; VITLAB_OFFLINE=1 or "
          "HF_HUB_OFFLINE=1 forbid downloads.")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("download", help="fetch published checkpoints into the cache",
                       description="Download published checkpoints once (resumable, verified, shared by concurrent "
                                   "processes) so that later runs, offline ones too, load them by name.",
                       epilog=EPILOG)
    p.add_argument("names", nargs="+", metavar="NAME", help="catalogue names, e.g. augreg-i21k:ViT-B/16")
    p.add_argument("--force", action="store_true", help="download again even if the cached file is whole")
    p.add_argument("--verify", action="store_true",
                   help="re-check cached files in full (sha256 recorded at download, zip CRCs); download nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_download)


def run_download(args: argparse.Namespace) -> int:
    from vitlab.cli import UserError
    from vitlab.hub import find
    from vitlab.hub.fetch import fetch, verify_cached

    picked = [find(name) for name in args.names]  # every name checked before the first download starts
    failed = 0
    for entry in picked:
        if args.verify:
            why = verify_cached(entry)
            print(f"{entry.name}: {'ok' if why is None else why}")
            failed += why is not None
            continue
        path = fetch(entry, force=args.force, progress=not args.quiet)
        size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.iterdir())
        print(f"{entry.name} -> {path} ({format_size(size)})")
    if failed:
        raise UserError(f"{failed} cached file(s) failed the check; fetch them again with `vitlab download --force`")
    return 0


def format_size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _cached(entry: Any) -> bool:
    from vitlab.hub import entry_path
    from vitlab.hub.cache import problem

    if entry.repo is None:
        return problem(entry_path(entry)) is None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(entry.repo, "config.json"), str)


def run_pretrained(args: argparse.Namespace) -> int:
    """`vitlab models --pretrained`: the catalogue, filtered."""
    from vitlab.hub import select, tags

    rows = select(model=args.model, dataset=args.dataset, resolution=args.resolution)
    if args.json:
        print(json.dumps([{**e.summary(), "cached": _cached(e)} for e in rows], indent=2))
        return 0
    print(f"{'name':<58} {'data':<10} {'res':>4} {'size':>10}  {'top1':>6}  cached")
    for e in rows:
        data = (e.pretrain or "?") + (f">{e.finetune}" if e.finetune else "")
        size = format_size(e.size) + ("*" if e.size_source.startswith("derived") else " ")
        top1 = f"{e.top1:.2f}" if e.top1 is not None else "-"
        print(f"{e.name:<58} {data:<10} {e.resolution or '-':>4} {size:>10}  {top1:>6}  {'yes' if _cached(e) else ''}")
    print("size*: 4 bytes x parameters (no size published); top1: ImageNet-1k top-1 (%) as its publisher reports it.")
    for tag, about in tags().items():
        print(f"  {tag}: {about}")
    print("load: vitlab.load('ViT-B/16', pretrained='augreg-i21k'); fetch ahead: vitlab download augreg-i21k:ViT-B/16")
    return 0

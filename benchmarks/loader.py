"""The data-loading protocol of BENCHMARKS.md: vitlab's training loader on one image set stored four ways, and
timm's loader on the same shards. Run it on a quiet machine; it prints markdown tables.

    python benchmarks/loader.py                      # 50,000 JPEGs in /tmp/vitlab-50k (about 2 GB), then all
    python benchmarks/loader.py --root /tmp/vitlab-2k --count 2000 --images 1024   # the same, small

1. `make_jpegs.py`: `--count` photograph-like 500x375 JPEGs (quality 90, 2 % of each class in val/), with their
   size histogram.
2. `vitlab shards` packs them twice, into about 100 and about 2000 training shards (490 and 24.5 images per
   shard; for another --count the shard counts scale with it, so that the shards keep those sizes).
3. With `vitlab.data.hf_split` and `datasets` installed: a Hugging Face copy (DatasetDict, Image and ClassLabel
   features, the original JPEG bytes embedded) written with `save_to_disk`.
4. Every source is read once (page cache warm: the figures are decoding and loading, not the disk).
5. Per source (folder, 100 shards, 2000 shards, HF), `vitlab bench --data SRC --workers 1`, one repeat per call,
   the sources taking turns, --repeats rounds: images/s of one worker and time to first batch, medians.
6. `vitlab bench --data <100 shards> --compare timm` with 1 and 2 workers, and on the 2000 shards with 1 worker:
   vitlab and timm repeats alternating inside each call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FULL_COUNT = 50_000  # --shards counts are for this many images
TAR_OVERHEAD = 3 * 512  # per sample as `vitlab shards` counts it: two tar headers and padding


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str]) -> str:
    """Run a command, its stderr passed through; returns its stdout."""
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


def bench(args: list[str], out: Path) -> dict:
    out.unlink(missing_ok=True)
    run([sys.executable, "-m", "vitlab", "-q", "bench", *args, "--json", str(out)])
    return json.loads(out.read_text())


def shard_size_for(root: Path, shards: int) -> int:
    """Bytes per shard that make `vitlab shards` write about `shards` training shards: a shard closes at the first
    image that reaches the budget, overshooting by half an image on average."""
    sizes = [f.stat().st_size + TAR_OVERHEAD for f in (root / "train").rglob("*.jpg")]
    total, mean = sum(sizes), sum(sizes) / len(sizes)
    return max(1, int(total / (shards - 0.5) - mean / 2))


def pack(root: Path, shards: int) -> Path:
    out = root.with_name(f"{root.name}-shards{shards}")
    size = shard_size_for(root, shards)
    log(f"packing {out} (--shard-size {size} bytes)")
    run([sys.executable, "-m", "vitlab", "-q", "shards", str(root), str(out), "--shard-size", str(size)])
    return out


def make_hf(root: Path) -> Path | None:
    """A save_to_disk DatasetDict (train, validation) with the JPEG bytes embedded; None without vitlab.data.hf_split
    or datasets."""
    if importlib.util.find_spec("vitlab.data.hf_split") is None or importlib.util.find_spec("datasets") is None:
        log("no vitlab.data.hf_split or no datasets package: the Hugging Face row is left out")
        return None
    import datasets as hf

    hf.disable_progress_bars()
    out = root.with_name(f"{root.name}-hf")
    if (out / "dataset_dict.json").is_file():
        return out
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=classes)})

    def rows(split: str):
        for c, name in enumerate(classes):
            for f in sorted((root / split / name).glob("*.jpg")):
                yield {"image": {"bytes": f.read_bytes(), "path": f.name}, "label": c}

    log(f"writing the Hugging Face copy {out}")
    cache = str(out) + ".cache"
    splits = {name: hf.Dataset.from_generator(rows, gen_kwargs={"split": split}, features=features, cache_dir=cache)
              for name, split in (("train", "train"), ("validation", "val"))}
    hf.DatasetDict(splits).save_to_disk(str(out))
    run(["rm", "-rf", cache])
    return out


def warm(path: Path) -> None:
    """Read every file once, so that every measurement finds the source in the page cache."""
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(1 << 22):
                pass


def _med(values: list[float]) -> float:
    return statistics.median(values)


def per_source(sources: dict[str, Path], images: int, repeats: int, results: Path) -> list[str]:
    """Step 5: one repeat per call, the sources taking turns (the first one rotating)."""
    runs: dict[str, list[dict]] = {name: [] for name in sources}
    meta: dict[str, dict] = {}
    names = list(sources)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            log(f"round {r + 1}/{repeats}: {name}")
            res = bench(["--data", str(sources[name]), "--workers", "1", "--images", str(images), "--repeats", "1"],
                        results / "source.json")
            runs[name] += res["measurements"][0]["runs"]
            meta[name] = res["source"]
    lines = ["| source | training shards | img/s, 1 worker (median) | min-max | first batch s (median) | min-max "
             "| decode failures |", "|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        ips, first = [x["images_per_s"] for x in rs], [x["first_batch_s"] for x in rs]
        lines.append(f"| {name} | {meta[name].get('shards', '-')} | {_med(ips):.1f} | {min(ips):.1f}-{max(ips):.1f} "
                     f"| {_med(first):.2f} | {min(first):.2f}-{max(first):.2f} | {sum(x['failures'] for x in rs)} |")
    return lines


def versus_timm(cases: list[tuple[str, Path, int]], images: int, repeats: int, results: Path) -> list[str]:
    """Step 6: vitlab and timm alternating inside each call."""
    lines = ["| shards | workers | vitlab img/s | timm img/s | vitlab/timm img/s (median of pairs) | vitlab first "
             "batch s | timm first batch s | timm/vitlab first batch |", "|---|---|---|---|---|---|---|---|"]
    notes = set()
    for name, path, workers in cases:
        log(f"vitlab vs timm: {name}, {workers} worker(s)")
        res = bench(["--data", str(path), "--workers", str(workers), "--images", str(images), "--repeats",
                     str(repeats), "--compare", "timm"], results / "timm.json")
        ours, theirs = res["measurements"]
        ratio = res["ratios"]
        lines.append(f"| {name} | {workers} | {ours['images_per_s']:.1f} | {theirs['images_per_s']:.1f} | "
                     f"{ratio['images/s']['median']:.3f} ({ratio['images/s']['vitlab_ahead_in']} of {repeats} "
                     f"faster) | {ours['first_batch_s']:.2f} | {theirs['first_batch_s']:.2f} | "
                     f"{ratio['first batch']['median']:.2f} |")
        notes.update(res["source"]["notes"])
    return lines + [f"\n{n}" for n in sorted(notes)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("/tmp/vitlab-50k"))
    p.add_argument("--count", type=int, default=FULL_COUNT)
    p.add_argument("--shards", default="100,2000", help=f"training shard counts at {FULL_COUNT} images")
    p.add_argument("--images", type=int, default=10_000, help="images per repeat (default 10000)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    started = time.perf_counter()
    root = args.root
    log(f"generating {args.count} JPEGs in {root}")
    made = run([sys.executable, str(HERE / "make_jpegs.py"), str(root), "--count", str(args.count), "--report"])
    sizes = made.split("\n", 1)[1]  # after the "written" line: the size histogram
    counts = [max(2, round(int(n) * args.count / FULL_COUNT)) for n in args.shards.split(",")]
    packed = {n: pack(root, n) for n in counts}
    sources = {"image folder": root, **{f"shards ({packed_path.name})": packed_path
                                        for packed_path in packed.values()}}
    hf_copy = make_hf(root)
    if hf_copy is not None:
        sources["Hugging Face (save_to_disk)"] = hf_copy
    for path in sources.values():
        log(f"reading {path} once (page cache)")
        warm(path)
    results = root.with_name(f"{root.name}-results")
    results.mkdir(exist_ok=True)
    prepared = time.perf_counter()
    table1 = per_source(sources, args.images, args.repeats, results)
    few, many = packed[counts[0]], packed[counts[-1]]
    table2 = versus_timm([(few.name, few, 1), (few.name, few, 2), (many.name, many, 1)], args.images, args.repeats,
                         results)
    done = time.perf_counter()
    from vitlab.bench import BenchSettings, environment

    env = environment(BenchSettings(compare="timm"))
    print(f"## Data loading: {args.count} JPEGs 500x375 ({env['cpu']}, {os.cpu_count()} CPUs, torch {env['torch']}, "
          f"timm {env['timm']}, {env['date'][:10]})\n")
    print("Images (train split, from make_jpegs.py):\n\n```\n" + sizes.strip() + "\n```\n")
    print(f"vitlab's training loader, 1 worker, {args.images} images per repeat, the sources taking turns "
          f"({args.repeats} rounds):\n")
    print("\n".join(table1) + "\n")
    print(f"vitlab vs timm (`vitlab bench --data SRC --compare timm`), {args.images} images per repeat, "
          f"{args.repeats} repeats alternating:\n")
    print("\n".join(table2) + "\n")
    print(f"Preparation {prepared - started:.0f} s, measurements {done - prepared:.0f} s, "
          f"in all {done - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

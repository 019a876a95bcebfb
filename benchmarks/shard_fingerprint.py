"""What the shard fingerprint (vitlab.data.shardindex.fingerprint: SHA-256 of the size and the first and last 64 KiB,
checked for every shard each time a split is opened) costs, from a cold page cache and a warm one, against a full
SHA-256 of the shards, which a content check of every byte would need at every start.

    .venv/bin/python benchmarks/shard_fingerprint.py DIR [--shards 200] [--mib 16]

Writes DIR/train-NNNNNN.tar (distinct content; reused when present) and prints milliseconds per shard. The cost is
per shard, whatever the shard's size (two reads of 64 KiB); the full hash grows with the bytes (seconds per GiB).
The page cache is emptied per file with posix_fadvise(DONTNEED), which needs no privileges.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from vitlab.data import fingerprint
from vitlab.files import sha256_file


def _write(root: Path, shards: int, size: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    for i in range(shards):
        path = root / f"train-{i:06d}.tar"
        if path.is_file() and path.stat().st_size == size:
            continue
        with open(path, "wb") as f:
            for k in range(size >> 20):  # every MiB of every shard differs
                f.write(i.to_bytes(8, "little") + k.to_bytes(8, "little") + block[16:])
    return sorted(root.glob("train-*.tar"))[:shards]


def _evict(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)  # pages not yet written back stay cached
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    files = _write(args.dir, args.shards, args.mib << 20)
    _evict(files)
    t = time.perf_counter()
    for path in files:
        fingerprint(path)
    cold = (time.perf_counter() - t) / len(files)
    t = time.perf_counter()
    for path in files:
        fingerprint(path)
    warm = (time.perf_counter() - t) / len(files)
    sample = files[:20]
    _evict(sample)
    t = time.perf_counter()
    for path in sample:
        sha256_file(path)
    full = (time.perf_counter() - t) / len(sample)
    print(f"{len(files)} shards x {args.mib} MiB: fingerprint {1e3 * cold:.2f} ms/shard cold, {1e3 * warm:.3f} "
          f"ms/shard warm; full SHA-256 {1e3 * full:.0f} ms/shard cold ({full / (args.mib / 1024):.1f} s per GiB)")


if __name__ == "__main__":
    main()

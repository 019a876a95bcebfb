"""Content digests: the SHA-256 of a file, read in 1 MiB chunks so a checkpoint of any size hashes in constant
memory. Run-directory manifests and the download cache both check files by it."""

from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """The file's SHA-256 as 64 hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()

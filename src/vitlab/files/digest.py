"""Content digests: the SHA-256 of a file, read in 1 MiB chunks so a checkpoint of any size hashes in constant
memory (run-directory manifests and the download cache both check files by it), and a cheap fingerprint of a
model's tensors in memory (a run records the model object it was given by it)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from vitlab.files.reading import open_regular

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """The file's SHA-256 as 64 hex digits."""
    h = hashlib.sha256()
    with open_regular(path) as f:  # a FIFO named like a checkpoint's file is refused, never waited on
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


FINGERPRINT_VALUES = 64  # elements hashed at each end of every tensor


def tensors_fingerprint(tensors: Mapping[str, Any]) -> str:
    """16 hex digits of SHA-256 over every tensor's name, shape, dtype, first and last FINGERPRINT_VALUES elements
    and float64 sum: one pass over memory, no copy of the model, and any trained or swapped tensor changes it."""
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].detach()
        flat = t.reshape(-1).double()
        h.update(f"{key} {tuple(t.shape)} {t.dtype} {float(flat.sum())!r}".encode())
        for end in (flat[:FINGERPRINT_VALUES], flat[-FINGERPRINT_VALUES:]):
            h.update(end.cpu().numpy().tobytes())
    return h.hexdigest()[:16]

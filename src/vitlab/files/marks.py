"""vitlab's mark on what it writes, and reading it back: how `outputs.check_output` tells a file vitlab may
replace (an earlier output of its own) from one it must not (the user's).

The mark is `written_by: vitlab…` (the writer, e.g. "vitlab eval"), put where each format keeps text that its
readers ignore: safetensors metadata, the first key of a JSON record, a PNG tEXt chunk, the zip comment of an .npz
or torch.save file, a comment line in Markdown or HTML. vitlab safetensors from before the mark are recognised by
their `format: vitlab` metadata.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from pathlib import Path

WRITTEN_BY = "written_by"  # the key of a verb's JSON record that names the verb: its outputs may be replaced
_TEXT_MARK = re.compile(rb"<!-- written_by: (vitlab[^>\n]{0,80}?) -->")  # Markdown (model cards), HTML
_JSON_MARK = re.compile(rb'\A\s*\{\s*"written_by"\s*:\s*"(vitlab[^"\n]{0,80})"')  # the record's first key
_HEAD = 4096  # bytes read to recognise a mark: marks sit at the start (JSON, text) or in a bounded header


def mark(writer: str = "vitlab") -> dict[str, str]:
    """The mark that makes a file recognisably vitlab's: {"written_by": writer}, the first key of a JSON record,
    an entry of safetensors metadata or a PNG text chunk (matplotlib's `savefig(metadata=mark(...))`)."""
    return {WRITTEN_BY: writer}


def mark_text(writer: str = "vitlab") -> str:
    """The mark as a comment line for Markdown and HTML (within their first 4 KiB)."""
    return f"<!-- written_by: {writer} -->"


def mark_zip(path: str | Path, writer: str = "vitlab") -> None:
    """The mark as the zip comment of a written .npz or torch.save file (np.load and torch.load ignore it)."""
    with zipfile.ZipFile(path, "a") as archive:
        archive.comment = f"written_by: {writer}".encode()


def written_by(path: str | Path) -> str | None:
    """The writer a regular file's mark names ("vitlab convert", …), None when it has none. Reads at most a bounded
    header and never blocks (a FIFO is not opened for reading). vitlab safetensors from before the mark count as
    vitlab's by their `format` metadata."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return _mark_in(f, f.read(_HEAD))
        except (OSError, ValueError, AttributeError, zipfile.BadZipFile, RecursionError, EOFError):
            return None  # unreadable or not a format with a mark: not recognisably vitlab's


def _mark_in(f, head: bytes) -> str | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png_mark(f)
    if head.startswith(b"PK"):
        comment = zipfile.ZipFile(f).comment
        return comment.split(b": ", 1)[1].decode() if comment.startswith(b"written_by: vitlab") else None
    if len(head) > 8 and head[8:9] == b"{" and (size := int.from_bytes(head[:8], "little")) < 1 << 27:
        f.seek(8)  # safetensors: 8 bytes of header size, then the JSON header (metadata included)
        meta = json.loads(f.read(size)).get("__metadata__") or {}
        if str(meta.get(WRITTEN_BY, "")).startswith("vitlab") or meta.get("format") == "vitlab":
            return str(meta.get(WRITTEN_BY) or "vitlab")
        return None
    found = _JSON_MARK.match(head) or _TEXT_MARK.search(head)
    return found.group(1).decode(errors="replace") if found else None


def _png_mark(f) -> str | None:
    """The `written_by` tEXt chunk of a PNG, looked for among its first chunks (matplotlib writes text first)."""
    f.seek(8)
    for _ in range(64):
        header = f.read(8)
        if len(header) < 8:
            return None
        size, kind = int.from_bytes(header[:4], "big"), header[4:]
        if kind == b"IEND":
            return None
        if kind == b"tEXt" and size < _HEAD:
            key, _, value = f.read(size).partition(b"\0")
            f.seek(4, os.SEEK_CUR)
            if key == WRITTEN_BY.encode() and value.startswith(b"vitlab"):
                return value.decode("latin-1")
        else:
            f.seek(size + 4, os.SEEK_CUR)
    return None

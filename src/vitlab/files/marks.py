"""vitlab's mark on what it writes, and reading it back: how `outputs.check_output` tells a file vitlab may
replace (an earlier output of its own) from one it must not (the user's).

The mark is `written_by: vitlab…` (the writer, e.g. "vitlab eval"), put where each format keeps text that its
readers ignore: safetensors metadata, the first key of a JSON record, a PNG tEXt chunk, the zip comment of an .npz
or torch.save file, a comment line in Markdown or HTML. vitlab safetensors from before the mark are recognised by
their `format: vitlab` metadata. A CSV has no such place (a comment line would be a row to a spreadsheet or
pandas), so its header row is its mark: the exact columns a vitlab verb writes (`CSV_HEADERS`).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import NamedTuple

WRITTEN_BY = "written_by"  # the key of a verb's JSON record that names the verb: its outputs may be replaced
_TEXT_MARK = re.compile(rb"<!-- written_by: (vitlab[^>\n]{0,80}?) -->")  # Markdown (model cards), HTML
_JSON_MARK = re.compile(rb'\A\s*\{\s*"written_by"\s*:\s*"(vitlab[^"\n]{0,80})"')  # the record's first key
_HEAD = 4096  # bytes read to recognise a mark: marks sit at the start (JSON, text) or in a bounded header
# The header rows of the CSV files vitlab writes, by writer: `vitlab predict --csv` (image, then class_i and
# probability_i for i = 1…k) and `vitlab eval --errors` (the misclassified images).
CSV_HEADERS = {"vitlab predict": re.compile(rb"image(,class_(\d+),probability_\2)+\r?\n"),
               "vitlab eval": re.compile(rb"image,true,predicted,confidence\r?\n")}


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


# What a file holds, read from its first bytes: the kinds of output a verb writes.
WEIGHTS = "weights"  # safetensors, a zip archive (torch.save, .npz) or a legacy torch.save pickle: only weights replace
PNG, JSON, ONNX, CSV, TEXT, OTHER = "png", "json", "onnx", "csv", "text", "other"


class Kind(NamedTuple):
    """A kind of output: who writes it and in what format, e.g. Kind("vitlab eval", PNG) for a confusion matrix.
    An existing file is replaced without --force only by an output of its own kind (`outputs.check_output`);
    for weights any vitlab writer will do (the writer then only tells vitlab's weights from others')."""

    writer: str | None
    format: str

    def __str__(self) -> str:
        what = "weights" if self.format == WEIGHTS else f"{'an' if self.format in (ONNX, OTHER) else 'a'} " \
            f"{self.format.upper() if self.format in (PNG, JSON, ONNX, CSV) else self.format} file"
        return what + (f" written by {self.writer}" if self.writer and self.format != WEIGHTS else "")


def written_by(path: str | Path) -> str | None:
    """The writer a regular file's mark names ("vitlab convert", …), None when it has none. Reads at most a bounded
    header and never blocks (a FIFO is not opened for reading). vitlab safetensors from before the mark count as
    vitlab's by their `format` metadata."""
    found = _read(path, _mark_in)
    return found if isinstance(found, str) else None


def kind_of(path: str | Path) -> Kind | None:
    """The kind of the regular file at `path` (its writer None when it carries no mark), None when there is no
    readable regular file. Weights are recognised by format, whoever wrote them: a safetensors header, or a zip
    archive (what torch.save and numpy's .npz write)."""
    found = _read(path, _kind_in)
    return found if isinstance(found, Kind) else None


def _read(path: str | Path, parse) -> object:
    """`parse(file, head)` on the regular file at `path`, opened without following a link or blocking on a FIFO;
    None when it cannot be read or parsed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return parse(f, f.read(_HEAD))
        except (OSError, ValueError, AttributeError, zipfile.BadZipFile, RecursionError, EOFError):
            return None  # unreadable or not a format with a mark: not recognisably vitlab's


def _kind_in(f, head: bytes) -> Kind:
    try:
        writer = _mark_in(f, head)
    except (OSError, ValueError, AttributeError, zipfile.BadZipFile, RecursionError, EOFError):
        writer = None
    if head.startswith((b"PK", _LEGACY_TORCH)) or _is_safetensors(head):
        return Kind(writer, WEIGHTS)
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return Kind(writer, PNG)
    if _JSON_MARK.match(head) or head.lstrip()[:1] in (b"{", b"["):
        return Kind(writer, JSON)
    if writer is not None and head[:1] == b"\x08":  # an ONNX ModelProto opens with its ir_version field
        return Kind(writer, ONNX)
    if writer is not None and _csv_mark(head) == writer:
        return Kind(writer, CSV)
    try:  # the head may end inside a character: an incremental decoder waits for the rest instead of failing
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return Kind(writer, OTHER)
    return Kind(writer, TEXT)


# torch.save's format before its zip archives (and `_use_new_zipfile_serialization=False`): a pickle that opens
# with torch's magic number, 0x1950a86a20f9469cfc6c
_LEGACY_TORCH = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def _is_safetensors(head: bytes) -> bool:
    """8 bytes of little-endian header size, then the header's JSON object."""
    return len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 27


def _mark_in(f, head: bytes) -> str | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png_mark(f)
    if head.startswith(b"PK"):
        comment = zipfile.ZipFile(f).comment
        return comment.split(b": ", 1)[1].decode() if comment.startswith(b"written_by: vitlab") else None
    if _is_safetensors(head):
        size = int.from_bytes(head[:8], "little")
        f.seek(8)  # safetensors: 8 bytes of header size, then the JSON header (metadata included)
        meta = json.loads(f.read(size)).get("__metadata__") or {}
        if str(meta.get(WRITTEN_BY, "")).startswith("vitlab") or meta.get("format") == "vitlab":
            return str(meta.get(WRITTEN_BY) or "vitlab")
        return None
    found = _JSON_MARK.match(head) or _TEXT_MARK.search(head)
    return found.group(1).decode(errors="replace") if found else _csv_mark(head)


def _csv_mark(head: bytes) -> str | None:
    """The writer whose CSV header row (`CSV_HEADERS`) the file opens with, None for any other first line."""
    return next((writer for writer, header in CSV_HEADERS.items() if header.match(head)), None)


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

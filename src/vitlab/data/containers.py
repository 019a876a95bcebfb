"""Image files that hold other image files: the pixels Pillow decodes are a member's, whose own header may declare a
size the container's header does not.

An ICO file's directory gives each icon's size in one byte per side (at most 256 x 256), an ICNS file's size comes
from its members' type codes; the member Pillow decodes (a PNG, a BMP without its file header, a JPEG 2000 stream)
says its own size, and Pillow holds it only to its own limit (179 M pixels). Pillow decodes an ICO's largest icon as
it opens the file (+660 MB for a 493 KB icon). `largest_member` reads the directory and every member's header from
the bytes, before Pillow opens the file, so that the image budget applies to what would be decoded.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import IO

from PIL import Jpeg2KImagePlugin, PngImagePlugin

ICO_MAGIC = b"\0\0\1\0"  # reserved 0, type 1 (a cursor, type 2, is one bitmap whose header Pillow reads)
ICNS_MAGIC = b"icns"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG2000_MAGICS = (b"\xff\x4f\xff\x51", b"\x0d\x0a\x87\x0a", b"\x00\x00\x00\x0cjP  \x0d\x0a\x87\x0a")
HEADER_BYTES = 4096  # enough of a member for Pillow to read its size (PNG's IHDR, JPEG 2000's SIZ or ihdr box)
MAX_MEMBERS = 4096  # an ICO counts its icons in 16 bits; an ICNS file holds a few dozen members


def largest_member(fp: IO[bytes]) -> tuple[str, int, int] | None:
    """(member, width, height) of the member with the most pixels of the ICO or ICNS file `fp` (a seekable binary
    file, read from its current position, which is restored), None for another format. ValueError for a member
    whose size cannot be read: it would be decoded unchecked."""
    position = fp.tell()
    try:
        return max(_member_sizes(fp, position), key=lambda m: m[1] * m[2], default=None)
    finally:
        fp.seek(position)


def _member_sizes(fp: IO[bytes], base: int) -> Iterator[tuple[str, int, int]]:
    magic = fp.read(8)
    if magic.startswith(ICO_MAGIC):
        count = struct.unpack_from("<H", magic, 4)[0]
        fp.seek(base + 6)  # the directory follows the 6-byte header
        directory = fp.read(16 * count)
        members = [(f"icon {i}", *struct.unpack_from("<II", directory, 16 * i + 8))
                   for i in range(len(directory) // 16)]
        container = "ICO"
    elif magic.startswith(ICNS_MAGIC):
        members, container = _icns_members(fp, base, struct.unpack_from(">I", magic, 4)[0]), "ICNS"
    else:
        return
    for name, length, offset in members:
        fp.seek(base + offset)
        size = _declared_size(fp.read(min(length, HEADER_BYTES)), container)
        if size is not None:
            yield (name, *size)


def _icns_members(fp: IO[bytes], base: int, total: int) -> list[tuple[str, int, int]]:
    """(type code, length, offset of the data) of an ICNS file's members, walked as Pillow walks them."""
    members, offset = [], 8
    while offset + 8 <= total and len(members) < MAX_MEMBERS:
        fp.seek(base + offset)
        head = fp.read(8)
        if len(head) < 8:
            break
        code, length = head[:4], struct.unpack_from(">I", head, 4)[0]
        if length < 8:
            break  # Pillow refuses such a block itself
        members.append((f"member {code.decode('latin-1')!r}", length - 8, offset + 8))
        offset += length
    return members


def _declared_size(head: bytes, container: str) -> tuple[int, int] | None:
    """(width, height) a member's header declares; None for ICNS's raw members (sized by their type code)."""
    if head.startswith(PNG_MAGIC) or head.startswith(JPEG2000_MAGICS):
        plugin = PngImagePlugin.PngImageFile if head.startswith(PNG_MAGIC) else Jpeg2KImagePlugin.Jpeg2KImageFile
        try:
            with plugin(io.BytesIO(head)) as member:  # the header only (no Pillow size check: it is made here)
                return member.size
        except (OSError, SyntaxError, ValueError, struct.error) as err:
            raise ValueError(f"an {container} member whose size cannot be read ({err})") from None
    if container == "ICO":  # a BMP's info header: its height counts the colour and the mask rows
        if len(head) < 12:
            raise ValueError("an ICO member too short to hold an image header")
        if struct.unpack_from("<I", head)[0] == 12:  # OS/2 BITMAPCOREHEADER
            return struct.unpack_from("<HH", head, 4)
        width, height = struct.unpack_from("<ii", head, 4)
        return abs(width), abs(height)
    return None

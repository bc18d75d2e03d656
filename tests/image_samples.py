"""Images for the image tests of both tiers, made here from first principles (Pillow for ordinary images, the
PNG format by hand for the decompression bomb), so no test depends on a file or on the code under test."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image

COLOURS = {"red": (220, 20, 20), "green": (20, 200, 40), "blue": (20, 40, 220), "yellow": (240, 220, 20),
           "white": (250, 250, 250), "black": (5, 5, 5)}


def solid(width: int, height: int, colour: str, fmt: str = "PNG") -> bytes:
    """A `width` x `height` image of one named colour (COLOURS), encoded as `fmt`."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), COLOURS[colour]).save(buf, format=fmt)
    return buf.getvalue()


def mostly(width: int, height: int, colour: str, other: str) -> bytes:
    """A PNG mostly of `colour` with a stripe (a quarter of the width) of `other`: a dominant colour to find."""
    im = Image.new("RGB", (width, height), COLOURS[colour])
    im.paste(COLOURS[other], (0, 0, max(1, width // 4), height))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bomb(width: int = 10_000, height: int = 10_000) -> bytes:
    """A valid 1-bit greyscale PNG of `width` x `height` all-black pixels: ~12 KB on the wire for 10,000 x
    10,000 (100 million pixels, 300 MB once decoded to RGB). Written chunk by chunk (RFC 2083), each row
    a filter byte 0 then width/8 zero bytes, deflated as one stream."""
    row = b"\x00" * (1 + (width + 7) // 8)
    packer = zlib.compressobj(9)
    parts = [packer.compress(row * 1000) for _ in range(height // 1000)]
    parts.append(packer.compress(row * (height % 1000)))
    parts.append(packer.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"".join(parts)) + _chunk(b"IEND", b"")

"""Proving that bytes are an image the gateway will hand a model, with Pillow, whatever type they claimed.

`verify_image(data, max_pixels)`:

1. opens the bytes with Pillow restricted to `FORMATS` (PNG, JPEG, WebP, GIF, BMP): only the header is
   read, so the dimensions are known before a single pixel is decoded;
2. refuses an image over `max_pixels` (width x height) there: a 10,000 x 10,000 PNG of a few KB (a
   decompression bomb) is refused without allocating its 300 MB of pixels. Pillow's own bomb guard
   (`DecompressionBombError`, past twice `Image.MAX_IMAGE_PIXELS`) reads as the same refusal;
3. decodes the whole image (`load()`, the first frame of an animation), so truncated or corrupt data is
   refused here and not inside the model's backend.

The declared type (a data URL's media type, a server's Content-Type) is never trusted: the format is
what Pillow found. CPU-bound: callers run it off the event loop.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from openai_api.images import ImageRefused

# Pillow format name -> media type: the common formats clients send (OpenAI takes PNG, JPEG, WebP, GIF).
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}


@dataclass(frozen=True, slots=True)
class VerifiedImage:
    format: str  # Pillow's name: PNG, JPEG, ...
    mime: str
    width: int
    height: int


def verify_image(data: bytes, max_pixels: int) -> VerifiedImage:
    """The image's format and size; ImageRefused (`not_image`, `too_many_pixels`) otherwise."""
    if not data:
        raise ImageRefused("not_image", "the image is empty")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap decides, just below
        try:
            im = Image.open(io.BytesIO(data), formats=list(FORMATS))
        except Image.DecompressionBombError:
            raise ImageRefused("too_many_pixels", f"the image has more than {max_pixels:,} pixels") from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
            raise ImageRefused("not_image", "the bytes are not an image in a supported format (PNG, JPEG, WebP, "
                                            "GIF, BMP)") from None
        with im:
            width, height = im.size
            fmt = str(im.format)
            if width <= 0 or height <= 0:
                raise ImageRefused("not_image", "the image has no pixels")
            if width * height > max_pixels:
                raise ImageRefused("too_many_pixels", f"the image is {width} x {height} = {width * height:,} pixels, "
                                                      f"over the cap of {max_pixels:,}")
            try:
                im.load()
            except Exception:  # noqa: BLE001 - any decoder failure means: not a usable image
                raise ImageRefused("not_image", f"the {fmt} image could not be decoded (truncated or corrupt)"
                                   ) from None
    return VerifiedImage(fmt, FORMATS.get(fmt, "application/octet-stream"), width, height)

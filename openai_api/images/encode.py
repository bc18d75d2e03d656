"""An image as a backend takes it when that is not the client's own file: TensorRT-LLM's multimodal ensemble.

* `jpeg_data_url(data, mime, b64)` -> `data:image/jpeg;base64,...` (bytes). TensorRT-LLM's `preprocessing` model
  decodes an `image_url_input` element itself only when it starts with exactly that prefix; any other
  string, a PNG data URL included, it hands to `requests.get` (no timeout, no size cap, any host). So the
  gateway always sends this form: the client's JPEG as it is (already verified, RGB or grey), anything
  else (PNG, WebP, GIF's first frame, BMP, a CMYK JPEG) decoded and re-encoded as JPEG, quality 95.
* `rgb_pixels(data)` -> uint8 [height, width, 3], the layout `image_bytes_input` takes per image.
* `prompt_table_id(digests)` -> a stable id of a request's images, 1 .. 2**63 - 1, for the ensemble's
  `prompt_table_extra_id` (UINT64, at least 1): with KV-cache reuse on, requests whose images are the same
  reuse the blocks of their prompt table, and different images never share them.

CPU-bound (a decode and an encode): callers run these off the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from PIL import Image

JPEG_PREFIX = b"data:image/jpeg;base64,"
JPEG_QUALITY = 95


def _rgb(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")  # first frame of an animation; alpha dropped, palette expanded


def jpeg_data_url(data: bytes, mime: str, b64: bytes) -> bytes:
    """`data:image/jpeg;base64,<JPEG>` for a verified image: its bytes, the media type its decoding found
    and the bytes base64-encoded (module docstring)."""
    if mime == "image/jpeg":
        with Image.open(io.BytesIO(data)) as im:
            as_is = im.mode in ("RGB", "L")
        if as_is:
            return JPEG_PREFIX + b64
    buf = io.BytesIO()
    _rgb(data).save(buf, format="JPEG", quality=JPEG_QUALITY)
    return JPEG_PREFIX + base64.b64encode(buf.getvalue())


def rgb_pixels(data: bytes) -> NDArray[np.uint8]:
    """A verified image's pixels, uint8 [height, width, 3] (RGB)."""
    return np.asarray(_rgb(data), dtype=np.uint8)


def prompt_table_id(digests: Sequence[str]) -> int:
    """A stable id of the images with these content digests, in this order (SHA-256 of them), never 0."""
    h = hashlib.sha256("\n".join(digests).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") % (2**63 - 1) + 1

"""Images for multimodal models: a fetcher that only reaches what it may (`fetch`), a decoder that verifies
the bytes are an image within the caps (`decode`). Knows nothing of HTTP requests, services or Triton."""

from __future__ import annotations


class ImageRefused(Exception):
    """An image the gateway will not take. `reason` is a short stable word (the metrics label, and the
    code a client can match: `loopback`, `private`, `too_large`, `timeout`, `not_image`, ...); the
    message says why in words, without the gateway's internals."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

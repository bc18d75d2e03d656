"""What a dialect is: one API's wire shapes at the HTTP edge, over the gateway's one typed pipeline.

A dialect parses its own request bodies into the services' typed requests, encodes their results and deltas
into its own responses and events, and is the one writer of its errors: every layer raises the gateway's one
error taxonomy (`openai_api.errors`), and whoever answers an error - a route's exception handler, the API-key
and quota middleware, the guard (drain, body limit), a drain cutting a stream short - asks `dialect_for(path)`
for the bytes, so an error is written once, in the client's own shape, and never rewritten on its way out.
"""

from __future__ import annotations

from typing import Protocol

import orjson

from openai_api.errors import GatewayError, error_body


class ErrorWriter(Protocol):
    """The error side of a dialect."""

    name: str

    def error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes]:
        """The HTTP status and JSON body of `err` (`request_id`: the request's id, where the shape carries one)."""
        ...

    def stream_error(self, err: GatewayError) -> bytes:
        """`err` as the last event of a stream that had started (the status was sent already)."""
        ...


class OpenAIErrors:
    """OpenAI's errors, for every OpenAI surface: the gateway's status and
    `{"error": {"message", "type", "param", "code"}}`; in a stream, a `data:` event of the same object."""

    name = "openai"

    def error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes]:
        return err.status, orjson.dumps(error_body(err))

    def stream_error(self, err: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(error_body(err)) + b"\n\n"


OPENAI_ERRORS = OpenAIErrors()

"""What a dialect is: one API's wire shapes at the HTTP edge, over the gateway's one typed pipeline.

A dialect module (one per API: `openai_chat`, `openai_completions`, `openai_responses`, `anthropic_messages`)
has three parts:

* **parse**: its module's `parse(body, ...)` turns the validated body into the services' typed call (for
  OpenAI's chat and completions the body *is* that call; Anthropic's Messages is checked block by block into
  typed parts), naming the client's own fields in every 400;
* **encode**: a streamed answer comes from its service as a plan (`services.streaming.StreamPlan`: the prepared
  generation and what the API's events need); the dialect's stream encoder turns the pipeline's text events
  into its own events, driven by the one envelope (`StreamPlan.sse`), so each API's wire shapes live here;
* **respond** (`Dialect.respond`): a service's answer on the wire - a dict as JSON, a stream of the service's
  events as SSE, primed with its first event so that errors raised before anything was sent still get a
  proper status, with the dialect's keepalive on quiet streams (Anthropic's `ping`);
* **errors** (`Dialect.error`, `Dialect.stream_error`): the one writer of its error shape. Every layer raises
  the gateway's one error taxonomy (`openai_api.errors`), and whoever answers an error - a route's exception
  handler, the API-key and quota middleware, the guard (drain, body limit), the connection guard, a drain
  cutting a stream short - asks `table.dialect_for(path)` for the bytes, so an error is written once, in the
  client's own shape, and never rewritten on its way out.

A new API is one module with a `Dialect`, its `parse` and its stream encoder, plus a row in `table.ROUTES` and
its route.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

import orjson
from starlette.responses import Response, StreamingResponse

from openai_api.errors import GatewayError, error_body, error_response_bytes
from openai_api.http.sse import coalesced

DONE = b"data: [DONE]\n\n"  # the end of OpenAI's chat and completions streams
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# What a service answers: a whole answer, or the bytes of its SSE events.
ServiceResult = dict[str, Any] | AsyncGenerator[bytes, None]


class Dialect(Protocol):
    """The part of a dialect the edge uses without knowing which it is (see the module docstring)."""

    name: str

    def error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes]:
        """The HTTP status and JSON body of `err` (`request_id`: the request's id, where the shape carries one)."""
        ...

    def stream_error(self, err: GatewayError) -> bytes:
        """`err` as the last event of a stream that had started (the status was sent already)."""
        ...

    async def respond(self, result: ServiceResult, flush_interval_s: float = 0.0) -> Response:
        """`result` on the wire (see the module docstring); stream events arriving within `flush_interval_s` of
        the previous write share the next write (`http.sse`)."""
        ...


class Wire:
    """`respond` for every dialect: JSON, or SSE with the dialect's `keepalive` (an SSE event written after
    `keepalive_s` without a write; none by default)."""

    keepalive = b""
    keepalive_s = 0.0

    async def respond(self, result: ServiceResult, flush_interval_s: float = 0.0) -> Response:
        if isinstance(result, dict):
            return Response(orjson.dumps(result), media_type="application/json")
        try:
            first = await anext(result)
        except StopAsyncIteration:
            first = b""
        return StreamingResponse(coalesced(first, result, flush_interval_s, self.keepalive, self.keepalive_s),
                                 media_type="text/event-stream", headers=SSE_HEADERS)


def error_event(err: GatewayError) -> bytes:
    """An error after the stream started, as OpenAI's chat/completions streams carry it."""
    return b"data: " + error_response_bytes(err) + b"\n\n"


class OpenAIDialect(Wire):
    """OpenAI's wire, for every OpenAI surface: errors as the gateway's status and
    `{"error": {"message", "type", "param", "code"}}` (in a stream, a `data:` event of the same object)."""

    name = "openai"

    def error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes]:
        return err.status, orjson.dumps(error_body(err))

    def stream_error(self, err: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(error_body(err)) + b"\n\n"


OPENAI = OpenAIDialect()

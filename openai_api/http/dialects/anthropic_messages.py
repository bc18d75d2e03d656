"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) at the HTTP edge.

Errors (https://docs.anthropic.com/en/api/errors): Anthropic's status and error type for the gateway's status
(`errors.ANTHROPIC_ERRORS`: a 503 - Triton unavailable, the gateway draining - is a 529 overloaded_error, which
Anthropic's SDKs retry; a Triton failure is a 500 api_error) and `{"type": "error", "error": {"type",
"message"}, "request_id"}`; in a started stream, `event: error` with the same object (no request id).
"""

from __future__ import annotations

import orjson

from openai_api.errors import GatewayError, anthropic_error

PREFIX = "/v1/messages"


class AnthropicErrors:
    name = "anthropic"

    def error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes]:
        status, payload = anthropic_error(err.status, err.message)
        if request_id:
            payload["request_id"] = request_id
        return status, orjson.dumps(payload)

    def stream_error(self, err: GatewayError) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(anthropic_error(err.status, err.message)[1]) + b"\n\n"


ANTHROPIC_ERRORS = AnthropicErrors()

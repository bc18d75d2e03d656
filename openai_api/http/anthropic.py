"""Anthropic's Messages API at the HTTP edge: its error shape on its routes.

Every layer raises the gateway's one error taxonomy (`openai_api.errors`) and the layers that answer
early (API keys, the guard's body limit, in-flight limits and drain, request validation, the routes'
exception handlers) write it in OpenAI's shape. On the Messages routes this middleware, outside all of
them, turns each such JSON error into Anthropic's (`errors.anthropic_error`: its status and
`{"type": "error", "error": {"type", "message"}, "request_id"}`) and the final `data: {"error": ...}` event a
drain writes into a stream into Anthropic's `event: error`. Successful answers pass through untouched
(one call per message; the Messages encoder writes Anthropic's own events).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import anthropic_error

MESSAGES_PREFIX = "/v1/messages"
_OPENAI_STREAM_ERROR = b'data: {"error":'


def _to_anthropic(status: int, body: bytes, request_id: str | None) -> tuple[int, bytes]:
    try:
        data: Any = orjson.loads(body)
        message = data["error"]["message"]
        if not isinstance(message, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace") or "Error."
    new_status, payload = anthropic_error(status, message)
    if request_id:
        payload["request_id"] = request_id
    return new_status, orjson.dumps(payload)


class AnthropicErrorMiddleware:
    """Errors in Anthropic's shape on `/v1/messages*` (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(MESSAGES_PREFIX):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        parts: list[bytes] = []
        stream = False

        async def send_wrapper(message: Message) -> None:
            nonlocal start, stream
            kind = message["type"]
            if kind == "http.response.start":
                headers = message.get("headers", [])
                ctype = next((v for k, v in headers if k == b"content-type"), b"")
                if message["status"] >= 400 and ctype.startswith(b"application/json"):
                    start = message  # held until the body is whole
                    return
                stream = ctype.startswith(b"text/event-stream")
            elif kind == "http.response.body":
                if start is not None:
                    parts.append(message.get("body", b""))
                    if message.get("more_body", False):
                        return
                    rid = scope.get("state", {}).get("request_id")
                    status, body = _to_anthropic(start["status"], b"".join(parts), rid)
                    headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
                    await send({**start, "status": status,
                                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
                body = message.get("body", b"")
                if stream and body.startswith(_OPENAI_STREAM_ERROR):  # a drain cutting the stream short
                    _, payload = _to_anthropic(503, body[len(b"data: "):].strip(), None)
                    message = {**message, "body": b"event: error\ndata: " + payload + b"\n\n"}
            await send(message)

        await self.app(scope, receive, send_wrapper)

"""Pure ASGI middleware (BaseHTTPMiddleware would break client-disconnect detection for streams)."""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import AuthenticationError, GatewayError, error_response_bytes


async def send_error(send: Send, err: GatewayError, extra_headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = error_response_bytes(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *extra_headers, *((k.lower().encode(), v.encode()) for k, v in err.headers.items())]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    """Every route except the explicitly open ones needs `Authorization: Bearer <key>` when keys are set.

    Default-deny: a route added later is guarded without anyone remembering to guard it. Each
    presented key is compared with every configured key in constant time, and all comparisons run,
    so timing reveals neither which key nor how much of it matched.
    """

    def __init__(self, app: ASGIApp, keys: list[str], open_paths: frozenset[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys if k]
        self.open_paths = open_paths

    def _authorized(self, header: bytes | None) -> bool:
        if header is None or not header[:7].lower() == b"bearer ":
            return False
        presented = header[7:].strip()
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(presented, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if not self._authorized(auth):
            msg = ("You didn't provide an API key. Provide it as 'Authorization: Bearer YOUR_KEY'."
                   if auth is None else "Incorrect API key provided.")
            await send_error(send, AuthenticationError(msg), [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class RequestIdMiddleware:
    """Take `X-Request-Id` from the request or make one; echo it on the response and expose it to
    handlers (scope["state"]["request_id"]) so it is also Triton's request id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        rid_s = rid.decode("latin-1")[:128] if rid else ""
        if not rid_s or not rid_s.isprintable():
            rid_s = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid_s
        header = (b"x-request-id", rid_s.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)

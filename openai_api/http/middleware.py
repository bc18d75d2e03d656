"""Pure ASGI middleware (BaseHTTPMiddleware would break client-disconnect detection for streams), and the
access log.

`RequestRecorder` records each finished request: the request counter and latency histogram, then one
access-log record (`logs.AccessLine`): `method path status duration_ms request_id [object_id] [model]
[prompt_tokens completion_tokens] [client_disconnected] [key] [ttft_ms] [trace_id span_id]`, a line of text or
(`--log-format json`) fields of a JSON object. Neither prompt text nor API keys are ever part of it (`key` is the
keys file's name for the key).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import AuthenticationError, GatewayError
from openai_api.http.dialects.table import dialect_for
from openai_api.logs import AccessLine
from openai_api.observability import Metrics, RequestStats, bind_stats, unbind_stats
from openai_api.quota.caller import Caller

access_logger = logging.getLogger("openai_api.access")


async def send_error(scope: Scope, send: Send, err: GatewayError,
                     extra_headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer `err` from a middleware, written by the dialect of the request's path (`http.dialects`)."""
    status, body = dialect_for(scope["path"]).error(err, scope.get("state", {}).get("request_id"))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *extra_headers, *((k.lower().encode(), v.encode()) for k, v in err.headers.items())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# scope["state"] key: on an open path with keys configured, whether the request presented a valid key.
AUTHORIZED_KEY = "authorized"
# scope["state"] key: the `quota.caller.Caller` of an in-process call (the batch runner, `http.batch_runner`), which
# runs as the key that made its job without that key's secret. Only code in this process can set it.
INTERNAL_CALLER = "internal_caller"
# Pages people open in a browser, which cannot add a bearer header: there the key may also come as the password
# of HTTP basic auth (any user name), and a 401 asks for it, so the browser prompts.
BROWSER_PAGES = frozenset({"/status", "/docs", "/redoc", "/openapi.json"})
_BROWSER_PREFIX = "/docs/static/"


def browser_page(path: str) -> bool:
    return path in BROWSER_PAGES or path.startswith(_BROWSER_PREFIX)


def basic_password(header: bytes) -> bytes | None:
    """The password of `Authorization: Basic base64(user:password)` (b"" when malformed); None for another
    scheme."""
    if header[:6].lower() != b"basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return b""
    return decoded.partition(b":")[2]


def challenges(path: str) -> list[tuple[bytes, bytes]]:
    """A 401's `WWW-Authenticate` headers: bearer, and basic on a browser page."""
    out = [(b"www-authenticate", b"Bearer")]
    if browser_page(path):
        out.append((b"www-authenticate", b'Basic realm="openai-api", charset="UTF-8"'))
    return out


class APIKeyMiddleware:
    """Every route except the explicitly open ones needs `Authorization: Bearer <key>` (or `x-api-key: <key>`,
    as Anthropic's clients send it) when keys are set.

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
        if scope["type"] != "http" or not self.keys or scope["method"] == "OPTIONS" or \
                isinstance(scope.get("state", {}).get(INTERNAL_CALLER), Caller):
            await self.app(scope, receive, send)
            return
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if auth is None:  # Anthropic's clients send the key as `x-api-key`
            key = next((v for k, v in scope["headers"] if k == b"x-api-key"), None)
            auth = None if key is None else b"Bearer " + key
        elif browser_page(scope["path"]):
            password = basic_password(auth)
            if password is not None:
                auth = b"Bearer " + password
        if scope["path"] in self.open_paths:
            # Open, but what it may say depends on the key: readiness names models only to key holders.
            scope.setdefault("state", {})[AUTHORIZED_KEY] = self._authorized(auth)
            await self.app(scope, receive, send)
            return
        if not self._authorized(auth):
            msg = ("You didn't provide an API key. Provide it as 'Authorization: Bearer YOUR_KEY' (or 'x-api-key')."
                   if auth is None else "Incorrect API key provided.")
            await send_error(scope, send, AuthenticationError(msg), challenges(scope["path"]))
            return
        await self.app(scope, receive, send)


class RequestContextMiddleware:
    """Outermost: per request, its id, its `RequestStats`, its metrics and its access-log line.

    The id is the request's `X-Request-Id` when that is printable (cut to 128 characters), else 32 new
    hex digits; it is echoed as `X-Request-Id` on every response (a 401 included) and exposed to
    handlers as scope["state"]["request_id"], so it is also Triton's request id.

    This is the stack's one `send` wrapper that looks at messages: it records the status and, in
    `RequestStats.complete`, when the last body message went out, which `GuardMiddleware` reads to tell
    a disconnect mid-response from a normal close. Every wrapper costs a call per SSE chunk, so the
    middleware below it should not add their own.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.recorder = RequestRecorder(metrics, access_log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        rid = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        rid_s = rid.decode("latin-1")[:128] if rid else ""
        if not rid_s or not rid_s.isprintable():
            rid_s = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid_s
        header = (b"x-request-id", rid_s.encode("latin-1"))
        stats = RequestStats(start, rid_s)
        token = bind_stats(stats)

        async def send_wrapper(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.body":
                if not message.get("more_body", False):
                    stats.complete = True
            elif kind == "http.response.start":
                stats.status = message["status"]
                headers = message.get("headers", [])
                stats.event_stream = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                         for k, v in headers)
                message["headers"] = [*headers, header]
            await send(message)

        in_flight = self.metrics.in_flight
        in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            if not stats.status:
                stats.status = 500
            raise
        finally:
            unbind_stats(token)
            in_flight.dec()
            self.recorder.record(scope, stats)


def _route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


def access_fields(method: str, path: str, status: int, duration_s: float, request_id: str, object_id: str = "",
                  model: str = "") -> dict[str, Any]:
    """The fields every access-log line starts with (`logs.AccessLine`); the object id and model when known."""
    fields: dict[str, Any] = {"method": method, "path": path, "status": status,
                              "duration_ms": round(duration_s * 1000, 1), "request_id": request_id}
    if object_id:
        fields["object_id"] = object_id
    if model:
        fields["model"] = model
    return fields


class RequestRecorder:
    """Records each finished request: the request counter and latency histogram, then the access log.

    Label children are cached per label set: `.labels()` validates and locks on every call, and the
    sets are as few as Prometheus's own (route templates x configured models x statuses).
    """

    def __init__(self, metrics: Metrics, access_log: bool = True) -> None:
        self.metrics = metrics
        self.access_log = access_log
        self._requests: dict[tuple[str, str, str], Any] = {}
        self._latency: dict[tuple[str, str], Any] = {}

    def record(self, scope: Scope, stats: RequestStats) -> None:
        duration = time.perf_counter() - stats.start
        # 499 (nginx's "client closed request") when the client left before the response was complete.
        label = "499" if stats.disconnected else str(stats.status or 500)
        route = _route_of(scope)
        key = (route, stats.model, label)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.metrics.requests.labels(*key)
        counter.inc()
        lkey = (route, stats.model)
        latency = self._latency.get(lkey)
        if latency is None:
            latency = self._latency[lkey] = self.metrics.latency.labels(*lkey)
        latency.observe(duration)
        if not self.access_log or not access_logger.isEnabledFor(logging.INFO):
            return
        fields = access_fields(scope["method"], scope["path"], int(label), duration, stats.request_id,
                               stats.object_id, stats.model)
        if stats.prompt_tokens or stats.completion_tokens:
            fields["prompt_tokens"], fields["completion_tokens"] = stats.prompt_tokens, stats.completion_tokens
        if stats.disconnected:
            fields["client_disconnected"] = True
        caller = scope.get("state", {}).get("caller")
        if caller is not None:  # the keys file's name for the key (never the key)
            fields["key"] = caller.name
        if stats.ttft:
            fields["ttft_ms"] = round(stats.ttft * 1000, 1)
        if stats.trace_id:
            fields["trace_id"], fields["span_id"] = stats.trace_id, stats.span_id
        access_logger.info(AccessLine(fields))

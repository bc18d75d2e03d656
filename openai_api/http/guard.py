"""The guard: the pure-ASGI middleware right outside the routes that every HTTP request passes.

For each request, in order:

1. while the gateway drains (`http.lifecycle`), anything but health and metrics gets 503 (`shutting_down`);
2. the whole body is read before the route runs: a malformed `Content-Length` is a 400, a body over
   `max_body_bytes` a 413, whether announced by `Content-Length` or counted while a chunked body streams in
   (a client that leaves mid-body ends the request here);
3. the request gets its in-flight `Ticket` (`http.inflight`), which the route fills once it knows the model
   (`http.admission`) and the guard releases when the response is done;
4. the route runs while a watcher task reads `receive()`: when the client disconnects before the response is
   complete, the route's task is cancelled, which closes the Triton gRPC stream in the adapter's `finally`.
   Starlette alone never cancels a non-streaming handler, and notices a dropped stream only at its next write.
   When the drain's grace is over (`Lifecycle.cut`), the guard ends the response itself: a 503 if nothing was
   sent yet, else a final SSE error event and the end of the body.

With `--log-prompts` (and debug logging) it logs the start of each body: request bodies hold prompts.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import InvalidRequestError, PayloadTooLargeError, ShuttingDownError
from openai_api.http.connections import EDGE_STATUS
from openai_api.http.dialects.table import dialect_for
from openai_api.http.inflight import TICKET_KEY, InFlightLimiter, Ticket
from openai_api.http.lifecycle import DRAINING_OPEN_PATHS, Lifecycle
from openai_api.http.middleware import send_error
from openai_api.observability import Metrics, RequestStats, current_stats

prompt_logger = logging.getLogger("openai_api.prompts")
_CLOSE = [(b"connection", b"close")]


def _content_length(scope: Scope) -> bytes | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    return next((v for k, v in headers if k == b"content-length"), None)


class GuardMiddleware:
    """Drain refusal, the body read, the in-flight ticket and disconnect cancellation (module docstring)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, limiter: InFlightLimiter, lifecycle: Lifecycle,
                 metrics: Metrics | None = None, log_prompts: bool = False) -> None:
        self.app = app
        self.log_prompts = log_prompts
        self.max_body_bytes = max_body_bytes
        self.limiter = limiter
        self.lifecycle = lifecycle
        self.metrics = metrics

    def _rejected(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.lifecycle.draining and scope["path"] not in DRAINING_OPEN_PATHS:
            self._rejected("draining")
            await send_error(scope, send,
                             ShuttingDownError("The server is shutting down; retry on another instance."), _CLOSE)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:
            return
        if self.log_prompts and body and prompt_logger.isEnabledFor(logging.DEBUG):
            # Only when asked for (--verbose --log-prompts): request bodies hold prompts.
            prompt_logger.debug("request_id=%s body=%s", scope.get("state", {}).get("request_id", ""),
                                body[:4096].decode("utf-8", "replace"))
        ticket = Ticket(self.limiter)
        scope.setdefault("state", {})[TICKET_KEY] = ticket
        try:
            await self._run(scope, body, receive, send)
        finally:
            ticket.release()

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None when the request was answered here (or the client left)."""
        limit = self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None:
            text = declared.strip()
            if not text.isdigit():
                self._rejected("bad_content_length")
                await send_error(scope, send, InvalidRequestError("The Content-Length header is malformed.",
                                                                  code="invalid_content_length"), _CLOSE)
                return None
            if int(text) > limit:
                self._rejected("body_too_large")
                await send_error(scope, send, self._too_large(), _CLOSE)
                return None
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stats = current_stats()
                if stats is not None:  # the access log's status: the connection guard's answer (408), or 499
                    stats.status = scope.get("state", {}).get(EDGE_STATUS, 0)
                    stats.disconnected = not stats.status
                return None
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    self._rejected("body_too_large")
                    await send_error(scope, send, self._too_large(), _CLOSE)
                    return None
                parts.append(chunk)
            if not message.get("more_body", False):
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _too_large(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"The request body is larger than this server's limit of "
                                    f"{self.max_body_bytes} bytes.")

    async def _run(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = asyncio.Event()
        body_sent = False
        disconnected = False
        # Whether the response is complete comes from the outer request-context middleware, whose `send`
        # wrapper sees every message anyway; only without one (this middleware used alone) do we wrap
        # `send` ourselves, so an SSE chunk passes one wrapper fewer.
        stats = current_stats()
        if stats is None:
            stats = RequestStats(0.0)
            send = _completion_tracking(send, stats)

        async def app_receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            if not stats.complete:
                disconnected = True
                stats.disconnected = True
                gone.set()
                task.cancel()
            else:
                gone.set()

        watcher = asyncio.create_task(watch(), name="disconnect-watcher")
        tasks = self.lifecycle.tasks
        tasks.add(task)
        try:
            await self.app(scope, app_receive, send)
        except asyncio.CancelledError:
            # Our own cancellations (client gone, or the drain's grace over) end here; anyone else's goes on up.
            if not (disconnected or self.lifecycle.cutting) or task.uncancel() > 0:
                raise
            if not disconnected:
                await _cut_short(scope, stats, send)
        finally:
            tasks.discard(task)
            watcher.cancel()


async def _cut_short(scope: Scope, stats: RequestStats, send: Send) -> None:
    """End a response the shutdown cut: 503 before it started, else a final SSE error event (streams)."""
    err = ShuttingDownError("The server shut down before this response was complete; retry on another instance.")
    if not stats.status:
        await send_error(scope, send, err, _CLOSE)
        return
    if stats.complete:
        return
    if stats.event_stream:
        await send({"type": "http.response.body", "body": dialect_for(scope["path"]).stream_error(err),
                    "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _completion_tracking(send: Send, stats: RequestStats) -> Send:
    """`send`, recording in `stats.complete` when the last body message goes out."""

    async def tracking_send(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            stats.complete = True
        await send(message)

    return tracking_send

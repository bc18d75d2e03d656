"""Request limits, overload protection, draining and client-disconnect cancellation (pure ASGI).

`GuardMiddleware` sits innermost, just outside the routes, and for every HTTP request:

1. refuses new work with 503 while the gateway drains after SIGTERM (`Lifecycle.draining`);
2. reads the whole body before the route runs, refusing a malformed `Content-Length` (400) and a
   body over `max_body_bytes` (413), whether announced by `Content-Length` or counted while a
   chunked body streams in;
3. admits the request against the global in-flight limit (POSTs only; 429 with `Retry-After` past
   it, never a queue); routes then admit it against its model's limit with `admit_*` below;
4. runs the route while a watcher task reads `receive()`: when the client disconnects before the
   response is complete, the route's task is cancelled, which closes the Triton gRPC stream in the
   adapter's `finally`. Starlette alone never cancels a non-streaming handler, and notices a dropped
   stream only at its next write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ShuttingDownError,
    error_response_bytes,
)
from openai_api.http.connections import EDGE_STATUS
from openai_api.http.middleware import send_error
from openai_api.observability import Metrics, RequestStats, current_stats
from openai_api.quota.caller import current_caller
from openai_api.schemas.dialects import RankingRequest, RootRerankRequest, TEIEmbedRequest
from openai_api.schemas.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    RerankRequest,
    ResponsesRequest,
)
from openai_api.services.bounds import check_body_depth
from openai_api.settings import Settings
from openai_api.tracing import child_span

prompt_logger = logging.getLogger("openai_api.prompts")
TICKET_KEY = "admission_ticket"
# Reachable while draining: liveness and metrics (readiness answers 503, so balancers stop routing).
DRAINING_OPEN_PATHS = frozenset({"/health", "/metrics"})
_CLOSE = [(b"connection", b"close")]


class Lifecycle:
    """Process state shared between the server (signals) and the middleware.

    `draining`: new requests get 503 (after SIGTERM). `cut()`: the drain's grace is over, so every request
    still in flight is ended by the gateway itself, in OpenAI's shape: a 503 if nothing was sent yet,
    else a final SSE error event and the end of the body. Left to uvicorn, they would be cancelled
    mid-write and logged as tracebacks, and a streaming client would see the stream just stop."""

    def __init__(self) -> None:
        self.draining = False
        self.cutting = False
        self.tasks: set[asyncio.Task[Any]] = set()

    def cut(self) -> int:
        """End every request in flight now; returns how many there were."""
        self.cutting = True
        for task in self.tasks:
            task.cancel()
        return len(self.tasks)


class InFlightLimiter:
    """Counts requests in flight, globally and per model. Event-loop only: no locks needed."""

    def __init__(self, max_total: int, max_per_model: int, retry_after_s: int, models: set[str],
                 metrics: Metrics | None = None) -> None:
        self.max_total = max_total
        self.max_per_model = max_per_model
        self.retry_after_s = retry_after_s
        self.models = models
        self.metrics = metrics
        self.total = 0
        self.per_model: dict[str, int] = {}
        # Gauge children cached per model (`.labels()` validates and locks on every call); made on first
        # use, as `.labels()` would, so /metrics lists a model once it has served a request.
        self._model_gauges: dict[str, Any] = {}

    def model_gauge(self, model: str) -> Any:
        """`model`'s in-flight gauge child, or None without metrics."""
        gauge = self._model_gauges.get(model)
        if gauge is None and self.metrics is not None:
            gauge = self._model_gauges[model] = self.metrics.model_in_flight.labels(model)
        return gauge

    def overloaded(self, message: str, reason: str) -> OverloadedError:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()
        return OverloadedError(message, headers={"Retry-After": str(self.retry_after_s)})


class Ticket:
    """One request's admission: the slots it holds, taken at once by `admit` and given back by the guard
    middleware when the response is done. A slot is one Triton sequence: a request that fans out
    (completions with several prompts, `n` > 1) takes one per sequence, from its model's limit and from
    the global one, because each is a request Triton works on and a stream the gateway holds open."""

    __slots__ = ("limiter", "model", "sequences")

    def __init__(self, limiter: InFlightLimiter) -> None:
        self.limiter = limiter
        self.model: str | None = None
        self.sequences = 0

    def admit(self, model: str, sequences: int = 1, param: str = "n", share: float = 1.0) -> None:
        """Take `sequences` slots of `model` and of the gateway. More than a limit could ever grant is the
        client's error (400 naming `param`); more than is free now is a 429. `share` (a key's priority, from
        the keys file) is the part of each limit this request may fill: lower priorities are refused first."""
        lim = self.limiter
        if self.sequences or model not in lim.models:
            return  # unknown models get their 404 from the service; they never become a metric label
        most = min(lim.max_per_model, lim.max_total)
        if sequences > most:
            raise InvalidRequestError(
                f"This request asks for {sequences} generations at once (prompts x n); this server runs at most "
                f"{most} per model. Send fewer prompts or a smaller n per request.", param=param,
                code="too_many_sequences")
        if lim.total + sequences > (lim.max_total if share >= 1 else max(int(lim.max_total * share), 1)):
            raise lim.overloaded(f"The server is serving its maximum of {lim.max_total} requests; retry shortly.",
                                 "global_limit")
        n = lim.per_model.get(model, 0)
        if n + sequences > (lim.max_per_model if share >= 1 else max(int(lim.max_per_model * share), 1)):
            raise lim.overloaded(f"The model {model!r} is serving its maximum of {lim.max_per_model} generations; "
                                 "retry shortly.", "model_limit")
        lim.per_model[model] = n + sequences
        lim.total += sequences
        self.model = model
        self.sequences = sequences
        gauge = lim.model_gauge(model)
        if gauge is not None:
            gauge.inc(sequences)

    def release(self) -> None:
        if self.model is not None:
            lim = self.limiter
            lim.per_model[self.model] -= self.sequences
            lim.total -= self.sequences
            gauge = lim.model_gauge(self.model)
            if gauge is not None:
                gauge.dec(self.sequences)
            self.model = None
            self.sequences = 0


class Admission:
    """One request's admission, decided once by its route after the body was validated (see the module
    docstring). Without the guard middleware (a bare app in a test) there is no ticket: nothing is counted."""

    __slots__ = ("settings", "ticket")

    def __init__(self, ticket: Ticket | None, settings: Settings) -> None:
        self.ticket = ticket
        self.settings = settings

    @staticmethod
    def allowed(model: str) -> None:
        """The key's allow-list alone (with a keys file): a model it may not use does not exist for it, the same 404
        as an unknown one. Every `_admit` checks it; a route that must look at the model before it can be admitted
        (Anthropic's Messages: whether the model takes images) calls this first, so nothing it answers tells
        whether a model it may not use exists."""
        caller = current_caller()
        if caller is not None and not caller.allows(model):
            raise ModelNotFoundError(f"The model {model!r} does not exist.", param="model")

    def _admit(self, model: str, sequences: int = 1, param: str = "n") -> None:
        self.allowed(model)
        caller = current_caller()
        share = caller.share if caller is not None else 1.0
        stats = current_stats()
        if stats is not None and not stats.model and (self.ticket is None or model in self.ticket.limiter.models):
            stats.model = model
        if self.ticket is not None:
            with child_span("admission", **{"gen_ai.request.model": model, "openai_api.sequences": sequences}):
                self.ticket.admit(model, sequences, param, share)  # traced requests only: a refusal ends it in error

    def chat(self, body: ChatCompletionRequest) -> None:
        _check_count(len(body.messages), self.settings.max_messages, "messages", "messages")
        check_body_depth(body)  # before anything walks its JSON (templates, schema checks, copies)
        self._admit(body.model, body.n, "n")

    def completions(self, body: CompletionRequest) -> None:
        prompts = _prompt_count(body.prompt)
        check_body_depth(body)
        self._admit(body.model, prompts * body.n, "prompt" if prompts > 1 else "n")

    def responses(self, body: ResponsesRequest) -> None:
        check_body_depth(body)
        self._admit(body.model)

    def embeddings(self, body: EmbeddingRequest) -> None:
        _check_count(_embedding_inputs(body), self.settings.max_embedding_inputs, "input", "inputs")
        self._admit(body.model)

    def rerank(self, body: RerankRequest) -> None:
        _check_count(len(body.documents), self.settings.max_rerank_documents, "documents", "documents")
        self._admit(body.model)

    def tei_embed(self, body: TEIEmbedRequest, model: str) -> None:
        """TEI `/embed`; `model` is the one serving it (TEI's body names none)."""
        count = 1 if isinstance(body.inputs, str) else len(body.inputs)
        _check_count(count, self.settings.max_embedding_inputs, "inputs", "inputs")
        self._admit(model)

    def ranking(self, body: RankingRequest) -> None:
        """NIM `/v1/ranking`."""
        _check_count(len(body.passages), self.settings.max_rerank_documents, "passages", "passages")
        self._admit(body.model)

    def root_rerank(self, body: RootRerankRequest, model: str) -> None:
        """`/rerank`: TEI's `texts` or Infinity's `documents`; `model` is the one serving it."""
        param = "texts" if body.texts is not None else "documents"
        count = len(body.texts if body.texts is not None else body.documents or [])
        _check_count(count, self.settings.max_rerank_documents, param, param)
        self._admit(model)

    def tokenize(self, model: str, messages: int = 0, body: BaseModel | None = None) -> None:
        """`/tokenize` and `/detokenize`: tokenizer work only, but a request in flight like any other."""
        _check_count(messages, self.settings.max_messages, "messages", "messages")
        if body is not None:
            check_body_depth(body)
        self._admit(model)


def _content_length(scope: Scope) -> bytes | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    return next((v for k, v in headers if k == b"content-length"), None)


class GuardMiddleware:
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
            await send_error(send, ShuttingDownError("The server is shutting down; retry on another instance."),
                             _CLOSE)
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
                await send_error(send, InvalidRequestError("The Content-Length header is malformed.",
                                                           code="invalid_content_length"), _CLOSE)
                return None
            if int(text) > limit:
                self._rejected("body_too_large")
                await send_error(send, self._too_large(), _CLOSE)
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
                    await send_error(send, self._too_large(), _CLOSE)
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
                await _cut_short(stats, send)
        finally:
            tasks.discard(task)
            watcher.cancel()


async def _cut_short(stats: RequestStats, send: Send) -> None:
    """End a response the shutdown cut: 503 before it started, else a final SSE error event (streams)."""
    err = ShuttingDownError("The server shut down before this response was complete; retry on another instance.")
    if not stats.status:
        await send_error(send, err, _CLOSE)
        return
    if stats.complete:
        return
    if stats.event_stream:
        await send({"type": "http.response.body", "body": b"data: " + error_response_bytes(err) + b"\n\n",
                    "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _completion_tracking(send: Send, stats: RequestStats) -> Send:
    """`send`, recording in `stats.complete` when the last body message goes out."""

    async def tracking_send(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            stats.complete = True
        await send(message)

    return tracking_send


def request_ticket(scope: Scope) -> Ticket | None:
    """The request's ticket, given by the guard middleware (None without it)."""
    state: dict[str, Any] = scope.get("state", {})
    return state.get(TICKET_KEY)


def _check_count(count: int, limit: int | None, param: str, what: str) -> None:
    if limit is not None and count > limit:
        raise InvalidRequestError(f"'{param}' has {count} {what}; this server accepts at most {limit}.",
                                  param=param, code="too_many_items")


def _embedding_inputs(body: EmbeddingRequest) -> int:
    inp = body.input
    if isinstance(inp, str) or (inp and all(isinstance(x, int) for x in inp)):
        return 1
    return len(inp)


def _prompt_count(prompt: Any) -> int:
    """How many prompts a completions `prompt` holds: a string or one list of token ids is one."""
    if isinstance(prompt, str) or not prompt or all(isinstance(x, int) for x in prompt):
        return 1
    return len(prompt)

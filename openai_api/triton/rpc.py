"""Triton's inference RPCs over `grpc.aio` directly: the per-request and per-token hot path.

`tritonclient.grpc.aio` builds every request from numpy-backed `InferInput`s, feeds it through an
async request generator and a consumer task, and wraps every response in an `InferResult`; against
a real Triton that costs ~0.3 ms of CPU per request over a bare `grpc.aio` call, on the same core
that relays the tokens. Here a request is one `ModelInferRequest` protobuf built straight from
Python values, and responses are the protobufs themselves. `tritonclient` stays for everything off
the hot path (model configs, health, the encoders' HTTP client).

Wire contract (the KServe v2 gRPC protocol, `inference.GRPCInferenceService`):

* `ModelInfer` (unary): one `ModelInferRequest` -> one `ModelInferResponse`; models that are not
  decoupled.
* `ModelStreamInfer` (bidirectional): one request at a time per stream, sent with
  `triton_enable_empty_final_response` so the last response carries `triton_final_response: true`
  (an empty one if the model flagged FINAL without data). Each `ModelStreamInferResponse` holds
  either an `error_message` (which ends the request) or an `infer_response`. Cancelling the call
  cancels the request in Triton (the only per-request cancellation gRPC offers, which is why a
  stream never carries two requests at once); a stream whose request ended cleanly is reused.
* Tensors travel as `raw_input_contents` / `raw_output_contents` (see `wire`).

A request's whole life on a stream is one generator (`TritonRPC.stream`): borrow a stream, send, read
each response under the `StallGuard` and the request's deadline, raise failures as the gateway's
errors, and hand the stream back (or cancel it). Per token that is the only layer below the adapter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import grpc
from opentelemetry.trace import Tracer
from tritonclient.grpc import InferResult, service_pb2

from openai_api.errors import BackendTimeoutError, GatewayError
from openai_api.tracing import current_tracer, end_with, mark_first_token, start_triton_span, traceparent_metadata
from openai_api.triton.errors import map_triton_error
from openai_api.triton.wire import InferRequest

_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_INFER = "/inference.GRPCInferenceService/ModelInfer"
_LIVE = "/inference.GRPCInferenceService/ServerLive"
# How long a stall probe waits for Triton's `ServerLive` (at most the idle timeout itself).
_PROBE_TIMEOUT_S = 10.0


class ResponseError(Exception):
    """An error Triton sent as a stream response (`error_message`) rather than as the RPC status."""


class StallGuard:
    """Ends an iteration that stops making progress while waiting on Triton.

    `async with StallGuard(idle_s, model, probe=...) as g:` around a loop over a Triton stream that calls
    `g.hold()` as soon as an item arrived and `g.touch()` just before waiting for the next one, so
    time spent while the consumer holds a yielded chunk (a slow HTTP client) never counts.

    Only what can show progress is judged:

    * once the first item arrived, a wait of `idle_s` seconds is a stall: the waiting task is cancelled
      at its await (closing the Triton stream in the adapter's `finally`) and the block raises
      `BackendTimeoutError` (`stream_stalled`) instead;
    * before the first item (a request queued in Triton, a long prefill, or a request answered with one
      response at the very end) silence is normal, so after `idle_s` the guard asks `probe(timeout)`
      whether Triton is responsive at all: a live server means the request is still being worked on and
      the wait goes on (the request's own deadline bounds it); no answer (a frozen or wedged Triton) is
      a stall as above. Without a probe, the first wait is judged like the others.

    Per item it costs a clock read and a task lookup; the one timer is re-armed lazily when it fires,
    never per item.
    """

    __slots__ = ("_fired", "_handle", "_last", "_loop", "_probe", "_probing", "_seen", "_task", "_waiting", "idle_s",
                 "model")

    def __init__(self, idle_s: float | None, model: str,
                 probe: Callable[[float], Awaitable[bool]] | None = None) -> None:
        self.idle_s = idle_s if idle_s and idle_s > 0 else None
        self.model = model
        self._probe = probe
        self._fired = False
        self._waiting = False
        self._seen = False
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._probing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StallGuard:
        if self.idle_s is not None:
            self._loop = asyncio.get_running_loop()
            self.touch()
            self._handle = self._loop.call_at(self._last + self.idle_s, self._check)
        return self

    def hold(self) -> None:
        """An item arrived: the clock stops until `touch`."""
        self._waiting = False
        self._seen = True

    def touch(self) -> None:
        """About to wait for the next item (possibly from another task than before)."""
        if self.idle_s is not None:
            self._last = self._loop.time()
            self._task = asyncio.current_task()
            self._waiting = True

    def _check(self) -> None:
        idle_s = self.idle_s
        if idle_s is None:  # never armed without an idle time
            return
        now = self._loop.time()
        due = self._last + idle_s
        if self._waiting and now >= due and self._task is not None and not self._task.done():
            self._handle = None
            if not self._seen and self._probe is not None:
                self._probing = self._loop.create_task(self._ask(idle_s))
                return
            self._fire()
        else:
            # Not waiting on Triton right now (the consumer holds a chunk): look again a period later.
            self._handle = self._loop.call_at(due if self._waiting else now + idle_s, self._check)

    async def _ask(self, idle_s: float) -> None:
        """Silence before the first item: a stall only if Triton itself does not answer."""
        assert self._probe is not None
        alive = await self._probe(min(idle_s, _PROBE_TIMEOUT_S))
        self._probing = None
        if self._task is None or self._task.done():
            return
        if alive or not self._waiting or self._seen:
            if self._waiting and not self._seen:
                self._last = self._loop.time()  # still working: judge again a period from now
            self._handle = self._loop.call_at(self._last + idle_s, self._check)
            return
        self._fire()

    def _fire(self) -> None:
        assert self._task is not None
        self._fired = True
        self._task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._probing is not None:
            self._probing.cancel()
            self._probing = None
        if self._fired and exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.uncancel() > 0:
                return False  # someone else cancelled this task too: let it go
            raise BackendTimeoutError(
                f"The model {self.model!r} produced no token for {self.idle_s:g} s; the stream was ended.",
                code="stream_stalled")
        return False


class TritonRPC:
    """The inference RPCs of one Triton (one `grpc.aio` channel, shared by every request).

    Streams are pooled: a request borrows an idle `ModelStreamInfer` stream, has it to itself until
    its final response, then hands it back. Setting up and tearing down a gRPC call costs ~0.5 ms of
    CPU per request here (half of all the gateway's work on a short request); writing one more
    request on an open stream costs a fraction of that. Cancelling a borrowed stream still cancels
    exactly one request, so a stream is only returned to the pool after Triton flagged the request's
    final response (`triton_enable_empty_final_response`), and is cancelled (never reused) when its
    request ends any other way: client gone, stop string matched, stall, deadline, error.
    """

    # Idle streams kept per Triton: beyond this a finished stream is closed instead.
    max_idle = 256

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        serialize = service_pb2.ModelInferRequest.SerializeToString
        # Streamed requests go as the bytes `InferRequest.serialized` writes (no serializer).
        self._stream: grpc.aio.StreamStreamMultiCallable[bytes, Any] = channel.stream_stream(
            _STREAM, request_serializer=None, response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        self._infer = channel.unary_unary(_INFER, request_serializer=serialize,
                                          response_deserializer=service_pb2.ModelInferResponse.FromString)
        self._live = channel.unary_unary(_LIVE, request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
                                         response_deserializer=service_pb2.ServerLiveResponse.FromString)
        self._idle: list[Any] = []

    async def live(self, timeout_s: float) -> bool:
        """Whether Triton answers `ServerLive` within `timeout_s` (on the inference channel, so the answer
        says the server that holds the request is responsive; a frozen or wedged process does not answer)."""
        try:
            return bool((await self._live(service_pb2.ServerLiveRequest(), timeout=timeout_s)).live)
        except Exception:  # noqa: BLE001 - any failure means "not answering"
            return False

    async def infer(self, request: InferRequest, *, model: str, timeout_s: float | None) -> InferResult:
        """One unary `ModelInfer`; failures are raised as GatewayErrors naming `model`. In a traced request
        (`openai_api.tracing`) the call is a CLIENT span whose `traceparent` goes in the call's metadata."""
        tracer = current_tracer()
        span = None if tracer is None else start_triton_span(tracer, "ModelInfer", model)
        error: BaseException | None = None
        try:
            metadata = None if span is None else traceparent_metadata(span)
            return InferResult(await self._infer(request.pb, timeout=timeout_s, metadata=metadata))
        except Exception as e:  # noqa: BLE001 - every transport failure maps to one taxonomy
            error = map_triton_error(e, model)
            raise error from None
        finally:
            if span is not None:
                end_with(span, error)

    def _borrow(self, metadata: tuple[tuple[str, str], ...] | None) -> tuple[Any, bool]:
        if metadata is not None:  # Triton reads a stream's trace context once, when it opens: a fresh one
            return self._stream(metadata=metadata), False
        while self._idle:
            call = self._idle.pop()
            if not call.done():  # a stream Triton ended (restart, GOAWAY) is skipped
                return call, True
        return self._stream(), False

    def stream(self, request: InferRequest, *, model: str, timeout_s: float | None = None,
               idle_s: float | None = None) -> AsyncGenerator[InferResult, None]:
        """Send `request` on a stream of its own and yield Triton's responses up to and including the
        final one.

        Every failure is raised as a GatewayError naming `model`: a response carrying an error, a
        transport failure, the deadline (`timeout_s`, the whole request) and a stall (`StallGuard` with
        `idle_s`, probing Triton before the first response). Closing this iterator early cancels the
        stream, and so the request in Triton. A pooled stream that turns out dead before any response
        is replaced once, transparently.

        In a traced request (`openai_api.tracing`) the RPC is a CLIENT span, sent on a new stream (never
        pooled) whose gRPC metadata carries the span's `traceparent`; untraced requests take the pool as
        before, and neither path does anything more per response.
        """
        tracer = current_tracer()
        if tracer is None:
            return self._stream_call(request, model, timeout_s, idle_s, None)
        return self._traced_stream(tracer, request, model, timeout_s, idle_s)

    async def _traced_stream(self, tracer: Tracer, request: InferRequest, model: str, timeout_s: float | None,
                             idle_s: float | None) -> AsyncGenerator[InferResult, None]:
        span = start_triton_span(tracer, "ModelStreamInfer", model)
        error: BaseException | None = None
        responses = self._stream_call(request, model, timeout_s, idle_s, traceparent_metadata(span))
        try:
            first = True
            async for result in responses:
                if first:
                    first = False
                    mark_first_token(span)
                yield result
        except BaseException as e:
            error = e
            raise
        finally:
            await responses.aclose()
            end_with(span, error if not isinstance(error, GeneratorExit) else None)

    async def _stream_call(self, request: InferRequest, model: str, timeout_s: float | None, idle_s: float | None,
                           metadata: tuple[tuple[str, str], ...] | None) -> AsyncGenerator[InferResult, None]:
        request.bool_parameter("triton_enable_empty_final_response", True)
        payload = request.serialized()
        loop = asyncio.get_running_loop()
        call, pooled = self._borrow(metadata)
        expired = False
        reusable = False

        def expire() -> None:
            nonlocal expired
            expired = True
            call.cancel()

        timer = loop.call_later(timeout_s, expire) if timeout_s else None
        try:
            async with StallGuard(idle_s, model, probe=self.live) as guard:
                while True:
                    try:
                        await call.write(payload)
                        resp = await call.read()
                        if resp is grpc.aio.EOF:
                            raise grpc.aio.UsageError("Triton closed the stream")
                        break
                    except (grpc.aio.AioRpcError, grpc.aio.UsageError, grpc.aio.AbortError):
                        if not pooled or expired:
                            raise
                        call.cancel()
                        call, pooled = self._stream(), False  # (a traced request's stream is never pooled)
                while True:
                    guard.hold()
                    if resp.error_message:
                        raise map_triton_error(ResponseError(resp.error_message), model)
                    params = resp.infer_response.parameters
                    if "triton_final_response" in params and params["triton_final_response"].bool_param:
                        reusable = True
                        yield InferResult(resp.infer_response)
                        return
                    yield InferResult(resp.infer_response)
                    guard.touch()
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise grpc.aio.UsageError("Triton closed the stream before the final response")
        except GatewayError:
            raise
        except (asyncio.CancelledError, grpc.aio.AioRpcError) as e:
            # Cancelling the call at the deadline surfaces as either, depending on where the read was.
            if expired:
                raise BackendTimeoutError(f"The model {model!r} did not answer in time.") from None
            if isinstance(e, asyncio.CancelledError):
                raise  # the request's own task was cancelled (client gone): not an error of Triton's
            raise map_triton_error(e, model) from None
        except Exception as e:  # noqa: BLE001
            raise map_triton_error(e, model) from None
        finally:
            if timer is not None:
                timer.cancel()
            if reusable and not expired and metadata is None and len(self._idle) < self.max_idle:
                self._idle.append(call)
            else:
                call.cancel()

    async def close(self) -> None:
        for call in self._idle:
            call.cancel()
        self._idle.clear()
        await self.channel.close()

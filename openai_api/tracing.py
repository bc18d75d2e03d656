"""OpenTelemetry tracing (docs/operations/tracing.md): off unless asked for, and then one trace per request that goes on
into Triton.

**On** with `--otlp-traces-endpoint URL`, or when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (`OTEL_SDK_DISABLED=true` wins over both). Spans go out in batches
(`BatchSpanProcessor`, tuned by `OTEL_BSP_*`) over OTLP/HTTP protobuf; `OTEL_SERVICE_NAME` /
`OTEL_RESOURCE_ATTRIBUTES` name the service (default `openai-api-gateway`), `OTEL_TRACES_SAMPLER[_ARG]` choose
the sampler (default: parent-based, always on). The provider is this app's own, not the process-global one.

**Spans** (what `TracingMiddleware` and the Triton RPCs create):
- a SERVER span per HTTP request, `POST /v1/chat/completions` (method and path), continuing an incoming W3C
  `traceparent`; set when the response is over: `http.request.method`, `url.path`,
  `http.response.status_code`, `gen_ai.request.model`, `gen_ai.response.id` (a response's `resp_` id),
  `gen_ai.usage.prompt_tokens`,
  `gen_ai.usage.completion_tokens`, `gen_ai.latency.time_to_first_token` (s, streamed and not), and who called:
  `openai_api.key.name`, `openai_api.key.team` (the keys file's names, never the key itself);
- `chat template` (rendering the messages and tokenizing the prompt: `gen_ai.request.model`, the prompt's
  `gen_ai.usage.prompt_tokens`), child of the server span, with `tokenize` (the tokenization alone) as its child;
- `quota` (the key's limits checked, a Redis round trip with `--redis-url`), `admission` (the in-flight limits)
  and `routing` (a replica set's choice: `openai_api.routing.policy`, `.reason`, `.replica`), and `output
  parsing` (per parsed choice, its first output to its last: the parsers and what they found), children of
  the server span;
- a CLIENT span per Triton inference RPC (generation and the encoders' calls), `triton ModelStreamInfer` /
  `triton ModelInfer`, child of the server span (`gen_ai.request.model`, `triton.model_name`, `rpc.system`
  grpc). Its context goes to Triton as `traceparent` in the RPC's gRPC metadata (an encoder's HTTP call: a
  header), so Triton started with `--trace-config mode=opentelemetry`
  exports its spans (`InferRequest`, the model, `compute`) as children of it, in the same trace. Triton reads
  a stream's trace context once, from the metadata that opened the stream: a traced request therefore gets a
  stream of its own instead of a pooled one (the one cost tracing adds to the Triton call).

**Zero cost when off**: no middleware is installed, and the only check on the Triton path is one context
variable read per request (`current_tracer()`); nothing runs per token in either case.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

from openai_api.observability import current_stats

logger = logging.getLogger("openai_api.tracing")
SERVICE_NAME = "openai-api-gateway"
ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROPAGATOR = TraceContextTextMapPropagator()
# The request's tracer while a traced request runs (set by TracingMiddleware); None when tracing is off.
_TRACER: ContextVar[Tracer | None] = ContextVar("openai_api_tracer", default=None)


def current_tracer() -> Tracer | None:
    return _TRACER.get()


_OFF = contextlib.nullcontext()


def child_span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span for one step of a traced request (current while the step runs), else a shared no-op context: one
    context variable read when tracing is off. For code that runs once per request, never per token."""
    tracer = _TRACER.get()
    if tracer is None:
        return _OFF
    return tracer.start_as_current_span(name, attributes=attributes)


def traced_step(name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
    """A span for a step that already ran (elsewhere, e.g. on a CPU worker thread) from `start_ns` to `end_ns`
    (`time.time_ns`), a child of the current span; nothing when tracing is off or the times are unset."""
    tracer = _TRACER.get()
    if tracer is not None and start_ns:
        tracer.start_span(name, attributes=attributes, start_time=start_ns).end(end_time=end_ns)


def tracing_wanted(endpoint: str | None, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(endpoint) or any(env.get(name) for name in ENDPOINT_ENV)


class Tracing:
    """This app's tracer provider and OTLP exporter. `shutdown()` flushes what is still batched."""

    def __init__(self, endpoint: str | None) -> None:
        # Imported here: the SDK and the exporter load only when tracing is on.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
        resource = resource.merge(OTELResourceDetector().detect())  # OTEL_RESOURCE_ATTRIBUTES win
        self.provider = TracerProvider(resource=resource)
        # The exporter reads OTEL_EXPORTER_OTLP_*_ENDPOINT itself when no endpoint is given here.
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint or None)))
        self.tracer = self.provider.get_tracer("openai_api")
        logger.info("OpenTelemetry tracing on: OTLP/HTTP to %s",
                    endpoint or next(os.environ[n] for n in ENDPOINT_ENV if os.environ.get(n)))

    def shutdown(self) -> None:
        self.provider.shutdown()


def build_tracing(endpoint: str | None) -> Tracing | None:
    return Tracing(endpoint) if tracing_wanted(endpoint) else None


def traceparent_metadata(span: trace.Span) -> tuple[tuple[str, str], ...]:
    """The W3C trace context of `span` as gRPC metadata (also valid as HTTP headers)."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return tuple(carrier.items())


def start_triton_span(tracer: Tracer, rpc: str, model: str) -> trace.Span:
    """The CLIENT span of one Triton RPC, child of the request's current span."""
    return tracer.start_span(f"triton {rpc}", kind=SpanKind.CLIENT, attributes={
        "rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService", "rpc.method": rpc,
        "gen_ai.request.model": model, "triton.model_name": model})


def end_with(span: trace.Span, error: BaseException | None) -> None:
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        message = getattr(error, "message", None)
        span.set_attribute("error.type", str(getattr(error, "code", None) or type(error).__name__))
        if message:
            span.set_attribute("error.message", str(message)[:500])
    span.end()


def mark_first_token(span: trace.Span) -> None:
    """`gen_ai.latency.time_to_first_token` on the request's server span (from the request's start), once."""
    stats = current_stats()
    server = trace.get_current_span()
    if stats is not None and server.is_recording():
        server.set_attribute("gen_ai.latency.time_to_first_token", time.perf_counter() - stats.start)
    span.add_event("first_response")


class TracingMiddleware:
    """The server span of every HTTP request (installed only when tracing is on); inside the request context
    (so `RequestStats` has the status, the model and the token counts when the span ends) and outside the
    keys (whose caller it reads from `scope["state"]["caller"]` at the end)."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracer = tracing.tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        parent = PROPAGATOR.extract(carrier) if carrier else None
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER,
                                      attributes={"http.request.method": method, "url.path": path})
        stats = current_stats()
        if stats is not None:  # the access log names the request's trace
            ids = span.get_span_context()
            stats.trace_id, stats.span_id = f"{ids.trace_id:032x}", f"{ids.span_id:016x}"
        ctx_token = otel_context.attach(trace.set_span_in_context(span, parent))
        tracer_token: Token[Tracer | None] = _TRACER.set(self.tracer)
        error: BaseException | None = None
        try:
            await self.app(scope, receive, send)
        except BaseException as e:
            error = e
            raise
        finally:
            _TRACER.reset(tracer_token)
            otel_context.detach(ctx_token)
            self._finish(span, scope, error)

    @staticmethod
    def _finish(span: trace.Span, scope: Scope, error: BaseException | None) -> None:
        stats = current_stats()
        attrs: dict[str, Any] = {}
        if stats is not None:
            status = 499 if stats.disconnected else stats.status
            if status:
                attrs["http.response.status_code"] = status
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            if stats.model:
                attrs["gen_ai.request.model"] = stats.model
            if stats.object_id:
                attrs["gen_ai.response.id"] = stats.object_id
            if stats.prompt_tokens or stats.completion_tokens:
                attrs["gen_ai.usage.prompt_tokens"] = stats.prompt_tokens
                attrs["gen_ai.usage.completion_tokens"] = stats.completion_tokens
        caller = scope.get("state", {}).get("caller")
        if caller is not None:
            attrs["openai_api.key.name"] = caller.name
            team = getattr(caller, "team", "")
            if team:
                attrs["openai_api.key.team"] = team
        span.set_attributes(attrs)
        end_with(span, error)


__all__ = ["Tracing", "TracingMiddleware", "build_tracing", "child_span", "current_tracer", "end_with",
           "mark_first_token", "start_triton_span", "traced_step", "traceparent_metadata", "tracing_wanted"]

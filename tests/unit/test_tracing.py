"""Tracing's contract at the Triton RPC layer (openai_api/tracing.py, openai_api/triton/rpc.py), against a fake
gRPC channel that records what each call was opened with:

- untraced requests (no tracer in the context: tracing off) open their streams with no metadata and share
  the pool, exactly as before;
- a traced request's RPC is a CLIENT span, child of the request's span, and its `traceparent` (that span's
  trace and span id) is in the metadata the stream / the unary call was opened with; its stream is never
  pooled (Triton reads a stream's trace context once);
- tracing is wanted only with an endpoint (flag or OTEL_EXPORTER_OTLP_*ENDPOINT), and never with
  OTEL_SDK_DISABLED=true.

The oracle for ids is the in-memory exporter of the OpenTelemetry SDK, not the code under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from tritonclient.grpc import service_pb2

import openai_api.tracing as tracing
from openai_api.triton.rpc import TritonRPC
from openai_api.triton.wire import InferRequest


def final_response() -> Any:
    resp = service_pb2.ModelStreamInferResponse()
    resp.infer_response.parameters["triton_final_response"].bool_param = True
    return resp


class FakeCall:
    def __init__(self, metadata: Any) -> None:
        self.metadata = metadata
        self.pending: list[Any] = []
        self.cancelled = False

    async def write(self, pb: Any) -> None:
        self.pending.append(final_response())

    async def read(self) -> Any:
        return self.pending.pop(0) if self.pending else grpc.aio.EOF

    def cancel(self) -> None:
        self.cancelled = True

    def done(self) -> bool:
        return self.cancelled


class FakeChannel:
    def __init__(self) -> None:
        self.streams: list[FakeCall] = []
        self.unary_metadata: list[Any] = []

    def stream_stream(self, *_: Any, **__: Any) -> Any:
        def open_stream(metadata: Any = None) -> FakeCall:
            call = FakeCall(metadata)
            self.streams.append(call)
            return call
        return open_stream

    def unary_unary(self, *_: Any, **__: Any) -> Any:
        async def infer(pb: Any, timeout: Any = None, metadata: Any = None) -> Any:
            self.unary_metadata.append(metadata)
            return service_pb2.ModelInferResponse()
        return infer


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    token = tracing._TRACER.set(None)
    exp.tracer = provider.get_tracer("test")  # type: ignore[attr-defined]
    yield exp
    tracing._TRACER.reset(token)


async def drain(rpc: TritonRPC) -> int:
    return len([r async for r in rpc.stream(InferRequest("m"), model="m")])


def test_untraced_requests_share_pooled_streams_opened_without_metadata(exporter: InMemorySpanExporter) -> None:
    channel = FakeChannel()
    rpc = TritonRPC(channel)  # type: ignore[arg-type]

    async def main() -> None:
        assert await drain(rpc) == 1 and await drain(rpc) == 1
        await rpc.infer(InferRequest("m"), model="m", timeout_s=None)

    asyncio.run(main())
    assert len(channel.streams) == 1 and channel.streams[0].metadata is None  # one stream, reused
    assert channel.unary_metadata == [None]
    assert exporter.get_finished_spans() == ()


def test_a_traced_request_sends_its_triton_span_as_traceparent_on_a_stream_of_its_own(
        exporter: InMemorySpanExporter) -> None:
    channel = FakeChannel()
    rpc = TritonRPC(channel)  # type: ignore[arg-type]
    tracer = exporter.tracer  # type: ignore[attr-defined]

    async def main() -> None:
        await drain(rpc)  # an untraced request first: its stream goes to the pool
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER):
            tracing._TRACER.set(tracer)
            assert await drain(rpc) == 1
            await rpc.infer(InferRequest("m"), model="m", timeout_s=None)
            tracing._TRACER.set(None)
        await drain(rpc)  # untraced again: the pooled stream, not the traced one

    asyncio.run(main())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    server = spans["POST /v1/chat/completions"]
    stream_span, unary_span = spans["triton ModelStreamInfer"], spans["triton ModelInfer"]
    for span in (stream_span, unary_span):
        assert span.kind == SpanKind.CLIENT and span.parent is not None
        assert span.parent.span_id == server.context.span_id
        assert span.attributes is not None and span.attributes["gen_ai.request.model"] == "m"

    def traceparent(span: Any) -> tuple[tuple[str, str]]:
        c = span.context
        return (("traceparent", f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"),)

    pooled, traced = channel.streams
    assert pooled.metadata is None and not pooled.cancelled
    assert traced.metadata == traceparent(stream_span) and traced.cancelled  # never back in the pool
    assert channel.unary_metadata == [traceparent(unary_span)]
    assert stream_span.events and stream_span.events[0].name == "first_response"


@pytest.mark.parametrize(("endpoint", "env", "wanted"), [
    (None, {}, False),
    ("http://collector:4318/v1/traces", {}, True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ("http://collector:4318/v1/traces", {"OTEL_SDK_DISABLED": "true"}, False),
])
def test_tracing_is_on_only_with_an_endpoint(endpoint: str | None, env: dict[str, str], wanted: bool) -> None:
    assert tracing.tracing_wanted(endpoint, env) is wanted


def test_off_means_no_tracer_in_the_request_context() -> None:
    assert tracing.current_tracer() is None
    assert not trace.get_current_span().is_recording()


class FakeEncoderClient:
    """tritonclient's `infer` as the encoder adapter calls it (gRPC or HTTP): records the headers it was given."""

    def __init__(self) -> None:
        self.headers: list[Any] = []

    async def infer(self, model: str, inputs: Any, **kw: Any) -> Any:
        self.headers.append(kw.get("headers"))

        class Result:
            @staticmethod
            def as_numpy(name: str) -> Any:
                import numpy as np

                return np.zeros((1, 4), dtype=np.float32)
        return Result()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_an_encoder_call_is_a_client_span_whose_traceparent_reaches_triton(
        exporter: InMemorySpanExporter, transport: str) -> None:
    import numpy as np

    from openai_api.triton.encoder import EncoderAdapter

    client = FakeEncoderClient()

    class Pool:
        def grpc(self, url: str) -> FakeEncoderClient:
            return client

        http = grpc

    adapter = EncoderAdapter(Pool(), transport=transport, url="t:1", model="emb", triton_model="emb-triton",  # type: ignore[arg-type]
                             version="", input_config={"input_ids": "input_ids"}, input_dtype="INT64",
                             output_name="out", timeout_s=5.0)
    adapter._inputs = {"input_ids": "INT64"}  # as read from Triton's model config
    tracer = exporter.tracer  # type: ignore[attr-defined]
    features = {"input_ids": np.ones((1, 3), dtype=np.int64)}

    async def main() -> None:
        await adapter.infer(features)  # untraced: no trace header
        with tracer.start_as_current_span("POST /v1/embeddings", kind=SpanKind.SERVER):
            tracing._TRACER.set(tracer)
            await adapter.infer(features)
            tracing._TRACER.set(None)

    asyncio.run(main())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    call, server = spans["triton ModelInfer"], spans["POST /v1/embeddings"]
    assert call.kind == SpanKind.CLIENT and call.parent is not None and call.parent.span_id == server.context.span_id
    assert call.attributes is not None and call.attributes["triton.model_name"] == "emb-triton"
    c = call.context
    want = f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
    untraced, traced = client.headers
    assert traced["traceparent"] == want
    if transport == "grpc":
        assert untraced is None
    else:  # HTTP keeps its own header (no compressed answers) beside the trace's
        assert untraced == {"Accept-Encoding": "identity"} and traced["Accept-Encoding"] == "identity"

"""A real OTLP/HTTP trace receiver for the tests: `http.server` on loopback, `POST /v1/traces`, the body decoded
with `opentelemetry-proto` (binary protobuf, as the Python SDK's exporter sends it) or read as OTLP/JSON (hex
ids, as OpenTelemetry C++ may send it from Triton). From an exporter's point of view it is a collector: it
answers 200 with an empty `ExportTraceServiceResponse`.

Every span received is kept as a `Span` (ids in lowercase hex, attributes as plain Python values) so that a test
can assert names, attributes and parent/child links across the services that exported them.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return None if which is None else getattr(v, which)


def _json_value(v: dict[str, Any]) -> Any:
    for key, raw in v.items():
        return int(raw) if key == "intValue" else raw
    return None


def spans_of_proto(body: bytes) -> list[Span]:
    req = ExportTraceServiceRequest.FromString(body)
    out = []
    for rs in req.resource_spans:
        service = next((str(_value(a.value)) for a in rs.resource.attributes if a.key == "service.name"), "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(Span(service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                                {a.key: _value(a.value) for a in s.attributes}))
    return out


def spans_of_json(body: bytes) -> list[Span]:
    req = json.loads(body)
    out = []
    for rs in req.get("resourceSpans", []):
        attrs = rs.get("resource", {}).get("attributes", [])
        service = next((str(_json_value(a["value"])) for a in attrs if a["key"] == "service.name"), "")
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                kind = s.get("kind", 0)
                out.append(Span(service, s["name"], s["traceId"].lower(), s["spanId"].lower(),
                                s.get("parentSpanId", "").lower(), kind if isinstance(kind, int) else 0,
                                {a["key"]: _json_value(a["value"]) for a in s.get("attributes", [])}))
    return out


class OTLPReceiver:
    """`with OTLPReceiver() as r:` ... `r.url` (the traces endpoint), `r.spans`, `r.wait_for(predicate)`."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.errors: list[str] = []
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding", "") == "gzip":
                    body = gzip.decompress(body)
                json_body = "json" in self.headers.get("Content-Type", "")
                try:
                    spans = spans_of_json(body) if json_body else spans_of_proto(body)
                except (DecodeError, ValueError, KeyError, TypeError) as e:  # kept for wait_for's message
                    with receiver._lock:
                        receiver.errors.append(f"{type(e).__name__}: {e} ({self.headers.get('Content-Type')})")
                    self.send_error(400)
                    return
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver._lock.notify_all()
                answer = b"{}" if json_body else ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/json" if json_body else "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def __enter__(self) -> OTLPReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, predicate: Callable[[list[Span]], bool], timeout: float = 15.0) -> list[Span]:
        """All spans so far, once `predicate(spans)` holds; an AssertionError naming what came after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(list(self.spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"spans received: {[(s.service, s.name) for s in self.spans]}; "
                                         f"{self.requests} exports, bodies refused: {self.errors}")
                self._lock.wait(left)
            return list(self.spans)

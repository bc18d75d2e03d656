"""Triton faults injected for real, against this module's own tritonserver on fixed ports:

- not running when the gateway starts (the gateway starts anyway: readiness 503, requests a fast 503),
  then started: the next request succeeds with no gateway restart;
- a model unloaded (Triton's explicit model control): 503 naming the model, until it is loaded again;
- a per-request deadline (`timeout_s` in the model config): 504, or an SSE error event mid-stream;
- a stalled Triton (SIGSTOP): the stream idle timeout ends it (504 before the first byte, an SSE
  error event after), and SIGCONT brings service back;
- Triton killed mid-stream: the stream ends with an SSE error event and closes cleanly, the gateway
  keeps serving, and a Triton restarted on the same ports is used by the next request.

The tests run in file order and share the Triton instance (started once late, restarted once).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openai_api.config import BUNDLED_CONFIG, GatewayConfig, load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.embedded.prepare import prepare_models
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, LLM, STATS_ENV, GatewayServer, read_ref_stats
from tests.helpers import free_port, stop_now

EMBEDDING = "all-minilm-l6-v2"
MODELS = [LLM, EMBEDDING]
IDLE_S = 2.0
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"max_tokens": 300, "min_tokens": 300, "temperature": 0}


class FaultTriton:
    """A tritonserver that the tests stop, kill, freeze and restart, always on the same ports."""

    def __init__(self, stats_dir: Path) -> None:
        self.ports = (free_port(), free_port(), free_port())
        self.stats_dir = stats_dir
        self.server: EmbeddedTriton | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    def start(self) -> None:
        prepare_models()
        old = os.environ.get(STATS_ENV)
        os.environ[STATS_ENV] = str(self.stats_dir)  # not the session Triton's counters
        try:
            self.server = EmbeddedTriton(models=MODELS, grpc_port=self.ports[0], http_port=self.ports[1],
                                         metrics_port=self.ports[2]).start()
        finally:
            if old is None:
                os.environ.pop(STATS_ENV, None)
            else:
                os.environ[STATS_ENV] = old

    def kill(self) -> None:
        assert self.server is not None and self.server.pid is not None
        os.killpg(self.server.pid, signal.SIGKILL)  # the whole group: tritonserver and its model stubs
        self.server.stop()

    def signal(self, sig: int) -> None:
        assert self.server is not None and self.server.pid is not None
        os.kill(self.server.pid, sig)

    def control(self, action: str, model: str) -> int:
        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/models/{model}/{action}", data=b"{}",
                                     method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            return int(r.status)

    def stats(self) -> dict[str, Any]:
        return read_ref_stats(self.stats_dir)

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGCONT)
            stop_now(self.server)


@pytest.fixture(scope="module")
def fault_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultTriton]:
    t = FaultTriton(tmp_path_factory.mktemp("fault-stats"))
    yield t  # not started: the first test starts it after the gateway
    t.stop()


def config_for(t: FaultTriton, timeout_s: float | None = None) -> GatewayConfig:
    config = load_config(BUNDLED_CONFIG)
    # This Triton serves the reference LLM and the embedding model only.
    config.llm = [m for m in config.llm if m.name == LLM]
    config.rerank = []
    config.with_triton_endpoint(t.grpc_url, t.http_url)
    if timeout_s is not None:
        config.llm[0].timeout_s = timeout_s
    return config


def serve(config: GatewayConfig, **settings: Any) -> GatewayServer:
    return GatewayServer(config, [API_KEY], Settings(config_file=Path("."), api_keys=[API_KEY], **settings)).start()


@pytest.fixture(scope="module")
def gw(fault_triton: FaultTriton) -> Iterator[GatewayServer]:
    server = serve(config_for(fault_triton), stream_idle_timeout_s=IDLE_S)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.url, headers=AUTH, timeout=120) as c:
        yield c


def chat(content: str = "Say hi.", **kw: Any) -> dict[str, Any]:
    return {"model": LLM, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **kw}


def wait_ready(client: httpx.Client, timeout: float = 60) -> None:
    """Until every model is ready (the pod is ready once one is: --ready-models any)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get("/health/ready")
        if r.status_code == 200 and set(r.json()["models"].values()) == {"ready"}:
            return
        time.sleep(0.2)
    raise AssertionError(f"never ready: {client.get('/health/ready').text}")


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if code is not None:
        assert err["code"] == code, err
    return dict(err)


def stream_events(r: httpx.Response) -> Iterator[dict[str, Any] | str]:
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


def test_gateway_starts_without_triton_and_recovers_when_it_comes(gw: GatewayServer, client: httpx.Client,
                                                                 fault_triton: FaultTriton) -> None:
    assert client.get("/health").status_code == 200
    r = client.get("/health/ready")
    assert r.status_code == 503 and r.json()["ready"] is False
    for path, body in (("/v1/chat/completions", chat()), ("/v1/chat/completions", chat(stream=True)),
                       ("/v1/embeddings", {"model": EMBEDDING, "input": "hello"})):
        t0 = time.monotonic()
        err = assert_error(client.post(path, json=body), 503, "backend_unavailable")
        assert time.monotonic() - t0 < 5, "a down Triton must fail fast"
        assert err["type"] == "server_error"
    fault_triton.start()
    wait_ready(client)
    r = client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200, r.text
    assert client.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hello"}).status_code == 200


def test_unloaded_model_is_503_naming_it_until_loaded_again(client: httpx.Client, fault_triton: FaultTriton) -> None:
    assert fault_triton.control("unload", EMBEDDING) == 200
    try:
        err = assert_error(client.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hello"}), 503)
        assert EMBEDDING in err["message"]
        ready = client.get("/health/ready")  # the pod still serves the others (--ready-models any), and says which
        assert ready.status_code == 200 and ready.json()["models"][EMBEDDING] == "not ready"
        assert client.post("/v1/chat/completions", json=chat()).status_code == 200  # the others still serve
    finally:
        assert fault_triton.control("load", EMBEDDING) == 200
    assert client.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hello"}).status_code == 200


def test_request_deadline_is_504_and_triton_stops(fault_triton: FaultTriton) -> None:
    server = serve(config_for(fault_triton, timeout_s=2.5))
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
            before = fault_triton.stats()
            t0 = time.monotonic()
            err = assert_error(c.post("/v1/chat/completions", json=chat(**LONG)), 504, "timeout")
            assert 2.0 < time.monotonic() - t0 < 10
            assert err["type"] == "server_error"
            # Streamed: the deadline ends the stream with an error event (or a 504 if it came before the first token).
            with c.stream("POST", "/v1/chat/completions", json=chat(stream=True, **LONG)) as r:
                if r.status_code == 200:
                    events = list(stream_events(r))
                    assert events[-1] != "[DONE]" and events[-1]["error"]["code"] == "timeout", events[-3:]
                else:
                    r.read()
                    assert_error(r, 504, "timeout")
            deadline = time.monotonic() + 10
            while fault_triton.stats()["cancelled"] < before["cancelled"] + 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert fault_triton.stats()["cancelled"] >= before["cancelled"] + 2, "Triton kept generating"
    finally:
        server.stop()


def test_stalled_triton_ends_streams_with_504_or_an_sse_error(client: httpx.Client, fault_triton: FaultTriton) -> None:
    # Before the first byte: a 504.
    fault_triton.signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert_error(client.post("/v1/chat/completions", json=chat(stream=True)), 504, "stream_stalled")
        assert_error(client.post("/v1/chat/completions", json=chat()), 504, "stream_stalled")
        assert time.monotonic() - t0 < 4 * IDLE_S + 4
    finally:
        fault_triton.signal(signal.SIGCONT)
    # After the first byte: an SSE error event, then the stream closes.
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True, **LONG)) as r:
        assert r.status_code == 200
        events = stream_events(r)
        first = next(events)
        assert isinstance(first, dict) and first["object"] == "chat.completion.chunk"
        fault_triton.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            rest = list(events)
            waited = time.monotonic() - t0
        finally:
            fault_triton.signal(signal.SIGCONT)
    assert rest and isinstance(rest[-1], dict) and rest[-1]["error"]["code"] == "stream_stalled", rest[-3:]
    assert waited < IDLE_S + 4
    assert client.post("/v1/chat/completions", json=chat()).status_code == 200


def test_triton_dies_mid_stream_then_comes_back_on_the_same_ports(gw: GatewayServer, client: httpx.Client,
                                                                  fault_triton: FaultTriton) -> None:
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True, **LONG)) as r:
        assert r.status_code == 200
        events = stream_events(r)
        assert isinstance(next(events), dict)
        fault_triton.kill()
        rest = list(events)  # ends by itself: the stream closes cleanly after the error event
    assert rest and isinstance(rest[-1], dict), rest[-3:]
    err = rest[-1]["error"]
    assert err["code"] == "backend_unavailable" and LLM in err["message"], err
    assert client.get("/health").status_code == 200
    assert client.get("/health/ready").status_code == 503
    assert_error(client.post("/v1/chat/completions", json=chat()), 503, "backend_unavailable")
    assert_error(client.post("/v1/embeddings", json={"model": EMBEDDING, "input": "x"}), 503, "backend_unavailable")
    metrics = client.get("/metrics").text
    assert 'openai_api_triton_errors_total{code="backend_unavailable",model="smollm2-135m-instruct"}' in metrics

    fault_triton.start()  # same ports, no gateway restart
    wait_ready(client)
    assert client.post("/v1/chat/completions", json=chat()).status_code == 200
    assert client.post("/v1/embeddings", json={"model": EMBEDDING, "input": "x"}).status_code == 200

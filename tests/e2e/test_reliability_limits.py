"""Overload and request limits against the real Triton, each boundary tested at the limit and one past it.

Gateways with small limits run on the session Triton; slots are held by real streams that are still
generating, so the 429 comes from the limiter and not from a slow model.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, LLM, GatewayServer, gateway_config

EMBEDDING = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_BODY = 4096
LONG = {"max_tokens": 300, "min_tokens": 300, "temperature": 0}


def serve(triton: EmbeddedTriton, **settings: Any) -> GatewayServer:
    return GatewayServer(gateway_config(triton), [API_KEY],
                         Settings(config_file=Path("."), api_keys=[API_KEY], **settings)).start()


@pytest.fixture(scope="module")
def limited(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    server = serve(triton, max_body_bytes=MAX_BODY, max_messages=4, max_embedding_inputs=3, max_rerank_documents=3,
                   max_in_flight=100, max_in_flight_per_model=2, retry_after_s=2)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(limited: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=limited.url, headers=AUTH, timeout=120) as c:
        yield c


def hold_stream(server: GatewayServer) -> socket.socket:
    """A streaming chat that is generating (its first chunk arrived) and keeps its slot until closed."""
    body = json.dumps({"model": LLM, "messages": [{"role": "user", "content": "Count."}], "stream": True,
                       **LONG}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    data = b""
    while b"data: " not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return sock


def wait_idle(server: GatewayServer) -> None:
    limiter = server.app.state.gateway.limiter
    deadline = time.monotonic() + 30
    while (limiter.total or any(limiter.per_model.values())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert limiter.total == 0 and not any(limiter.per_model.values()), (limiter.total, limiter.per_model)


def assert_429(r: httpx.Response, retry_after: str) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == retry_after
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "overloaded"
    return dict(err)


def test_per_model_in_flight_limit_is_an_immediate_429(limited: GatewayServer, client: httpx.Client) -> None:
    held = [hold_stream(limited) for _ in range(2)]
    try:
        t0 = time.monotonic()
        err = assert_429(client.post("/v1/chat/completions", json={
            "model": LLM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}), "2")
        assert time.monotonic() - t0 < 2, "a full model must be refused at once, not queued"
        assert LLM in err["message"]
        # Another model still serves.
        assert client.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hi"}).status_code == 200
    finally:
        for s in held:
            s.close()
    wait_idle(limited)
    r = client.post("/v1/chat/completions", json={"model": LLM, "messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_fan_out_counts_every_triton_sequence(limited: GatewayServer, client: httpx.Client) -> None:
    """`prompt: [...] x n` starts one Triton request per sequence: each takes a slot of the model's limit
    (2 here). More than the limit can ever grant is a 400 naming the parameter; more than is free now, 429."""
    short = {"max_tokens": 1}
    r = client.post("/v1/completions", json={"model": LLM, "prompt": ["a", "b", "c"], **short})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert r.json()["error"]["code"] == "too_many_sequences"
    r = client.post("/v1/completions", json={"model": LLM, "prompt": "a", "n": 3, **short})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    r = client.post("/v1/chat/completions", json={"model": LLM, "messages": [{"role": "user", "content": "Hi"}],
                                                  "n": 3, **short})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert client.post("/v1/completions", json={"model": LLM, "prompt": ["a", "b"], **short}).status_code == 200

    # Two sequences streaming take both slots: an ordinary request beside them is refused at once.
    body = json.dumps({"model": LLM, "prompt": ["Count.", "Count again."], "stream": True, **LONG}).encode()
    sock = socket.create_connection(("127.0.0.1", limited.port), timeout=120)
    try:
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        data = b""
        while b"data: " not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        assert limited.app.state.gateway.limiter.per_model[LLM] == 2
        assert_429(client.post("/v1/chat/completions", json={
            "model": LLM, "messages": [{"role": "user", "content": "Hi"}], **short}), "2")
    finally:
        sock.close()
    wait_idle(limited)
    r = client.post("/v1/chat/completions", json={"model": LLM, "messages": [{"role": "user", "content": "Hi"}],
                                                  **short})
    assert r.status_code == 200, r.text


def test_global_in_flight_limit_is_an_immediate_429(triton: EmbeddedTriton) -> None:
    server = serve(triton, max_in_flight=2, max_in_flight_per_model=10, retry_after_s=5)
    try:
        held = [hold_stream(server) for _ in range(2)]
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
            try:
                assert_429(c.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hi"}), "5")
                assert c.get("/v1/models").status_code == 200  # reads are never refused
                metrics = c.get("/metrics").text
                assert 'openai_api_rejected_requests_total{reason="global_limit"} 1.0' in metrics
            finally:
                for s in held:
                    s.close()
            wait_idle(server)
            assert c.post("/v1/embeddings", json={"model": EMBEDDING, "input": "hi"}).status_code == 200
    finally:
        server.stop()


def padded(payload: dict[str, Any], size: int) -> bytes:
    """`payload` as JSON padded with insignificant whitespace to exactly `size` bytes."""
    raw = json.dumps(payload).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def test_body_size_limit_exact_boundary_with_content_length(client: httpx.Client) -> None:
    payload = {"model": EMBEDDING, "input": "hello"}
    headers = {"Content-Type": "application/json"}
    r = client.post("/v1/embeddings", content=padded(payload, MAX_BODY), headers=headers)
    assert r.status_code == 200, r.text
    r = client.post("/v1/embeddings", content=padded(payload, MAX_BODY + 1), headers=headers)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"


def test_body_size_limit_counts_chunked_bodies(client: httpx.Client) -> None:
    payload = {"model": EMBEDDING, "input": "hello"}

    def chunked(data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), 1000):
            yield data[i:i + 1000]

    headers = {"Content-Type": "application/json"}
    r = client.post("/v1/embeddings", content=chunked(padded(payload, MAX_BODY)), headers=headers)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 200, r.text
    r = client.post("/v1/embeddings", content=chunked(padded(payload, MAX_BODY + 1)), headers=headers)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"


def test_malformed_content_length_is_400(limited: GatewayServer) -> None:
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 12abc\r\n\r\n{}")
        head = sock.recv(65536)
    # uvicorn's HTTP parser refuses it before the app (the app's own check, in OpenAI's shape, is unit-tested).
    assert head.startswith(b"HTTP/1.1 400"), head[:200]


def messages(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"turn {i}, answer in one word"} for i in range(n)]


def assert_too_many(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "too_many_items", err


def test_max_messages_boundary(client: httpx.Client) -> None:
    for n, ok in ((4, True), (5, False)):
        msgs = messages(n)
        assert len(msgs) == n
        r = client.post("/v1/chat/completions", json={"model": LLM, "messages": msgs, "max_tokens": 1})
        if ok:
            assert r.status_code == 200, r.text
        else:
            assert_too_many(r, "messages")


def test_max_embedding_inputs_boundary(client: httpx.Client) -> None:
    r = client.post("/v1/embeddings", json={"model": EMBEDDING, "input": ["a", "b", "c"]})
    assert r.status_code == 200 and len(r.json()["data"]) == 3
    assert_too_many(client.post("/v1/embeddings", json={"model": EMBEDDING, "input": ["a", "b", "c", "d"]}), "input")
    # Token-id inputs count per sequence; one flat list of ids is one input (read as cl100k ids, the default).
    flat = client.post("/v1/embeddings", json={"model": EMBEDDING, "input": [1, 2, 3, 4, 5]})
    assert flat.status_code == 200 and len(flat.json()["data"]) == 1
    assert_too_many(client.post("/v1/embeddings", json={"model": EMBEDDING, "input": [[1], [2], [3], [4]]}), "input")


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_max_rerank_documents_boundary(client: httpx.Client, path: str) -> None:
    r = client.post(path, json={"model": RERANK, "query": "q", "documents": ["a", "b", "c"]})
    assert r.status_code == 200, r.text
    assert_too_many(client.post(path, json={"model": RERANK, "query": "q", "documents": ["a", "b", "c", "d"]}),
                    "documents")

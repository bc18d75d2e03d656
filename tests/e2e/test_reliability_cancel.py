"""Client disconnects cancel the Triton request: proven from the model's side (its own counters).

The client is a raw socket, closed for real at the chosen moment: before the first token of a stream,
after it, and during a non-streaming request (which Starlette alone would never cancel).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.e2e.conftest import API_KEY, LLM, GatewayServer

# Long enough that nothing finishes by itself during a test (min_tokens masks EOS).
LONG = {"max_tokens": 400, "min_tokens": 400, "temperature": 0}
# The model polls for cancellation before every decoding step; allow for a busy shared CPU.
CANCEL_WITHIN_S = 3.0


def open_request(gateway: GatewayServer, payload: dict[str, Any], path: str = "/v1/chat/completions") -> socket.socket:
    body = json.dumps(payload).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=60)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 60) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before {marker!r}: {data[-500:]!r}")
        data += chunk
    return data


def wait_cancelled(ref_stats: Callable[[], dict[str, Any]], before: dict[str, Any], since: float) -> float:
    """Seconds from `since` until the model counted one more cancelled request (and nothing active)."""
    deadline = since + 30
    while time.monotonic() < deadline:
        now = ref_stats()
        if now["cancelled"] > before["cancelled"] and now["active"] == before["active"]:
            return time.monotonic() - since
        time.sleep(0.02)
    raise AssertionError(f"the model never saw the cancellation: before {before}, now {ref_stats()}")


def quiet(ref_stats: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The counters once nothing is active and they stopped moving (the model writes them only after a
    request's final response, so right after a previous test's reply they may still be changing)."""
    deadline = time.monotonic() + 30
    last = ref_stats()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = ref_stats()
        if now == last and now["active"] == 0:
            return now
        last = now
    raise AssertionError(f"the model never went quiet: {last}")


def chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": LLM, "messages": [{"role": "user", "content": content}], **kw}


def assert_generation_stopped(ref_stats: Callable[[], dict[str, Any]]) -> None:
    """No token is generated after the cancellation (the counters are written when a request ends, so
    a late completion of the cancelled request would show up here)."""
    settled = ref_stats()
    time.sleep(0.5)
    after = ref_stats()
    assert after["tokens_generated"] == settled["tokens_generated"], (settled, after)
    assert after["completed"] == settled["completed"]


def test_stream_disconnect_after_first_token_cancels_triton(gateway: GatewayServer, http: httpx.Client,
                                                          ref_stats: Callable[[], dict[str, Any]]) -> None:
    before = quiet(ref_stats)
    sock = open_request(gateway, chat("Count from one to a thousand.", stream=True, **LONG))
    read_until(sock, b'"content":"', timeout=60)  # the first chunk comes with the first token
    sock.close()
    took = wait_cancelled(ref_stats, before, time.monotonic())
    print(f"stream, after the first token: Triton cancelled {took:.3f} s after the disconnect")
    assert took < CANCEL_WITHIN_S, f"Triton stopped {took:.2f} s after the disconnect"
    assert ref_stats()["completed"] == before["completed"]
    assert_generation_stopped(ref_stats)
    # The gateway is fine afterwards.
    r = http.post("/v1/chat/completions", json=chat("Hi", max_tokens=2))
    assert r.status_code == 200, r.text


def test_stream_disconnect_before_first_token_cancels_triton(gateway: GatewayServer,
                                                           ref_stats: Callable[[], dict[str, Any]]) -> None:
    before = quiet(ref_stats)
    # A longer prompt: the prefill takes a moment, and the client leaves during it. The model checks for
    # cancellation between steps (the prefill is one step), so it notices right after the prefill.
    sock = open_request(gateway, chat("word " * 400, stream=True, **LONG))
    time.sleep(0.2)
    sock.setblocking(False)
    try:
        early = sock.recv(65536)
    except BlockingIOError:
        early = b""
    assert b'"content"' not in early, "the first token came before the test could disconnect"
    sock.close()
    took = wait_cancelled(ref_stats, before, time.monotonic())
    print(f"stream, before the first token: Triton cancelled {took:.3f} s after the disconnect")
    after = ref_stats()
    assert took < 20, f"Triton stopped {took:.2f} s after the disconnect (prefill included)"
    assert after["completed"] == before["completed"]
    # It stopped at once: at most the token of the prefill step, never the 400 asked for.
    assert after["tokens_generated"] - before["tokens_generated"] <= 2, (before, after)


def test_non_streaming_disconnect_cancels_triton(gateway: GatewayServer, http: httpx.Client,
                                                 ref_stats: Callable[[], dict[str, Any]]) -> None:
    before = quiet(ref_stats)
    sock = open_request(gateway, chat("Tell me a very long story.", stream=False, **LONG))
    # Wait until the model is generating for this request (tokens are being counted), then leave.
    time.sleep(1.5)
    sock.close()
    took = wait_cancelled(ref_stats, before, time.monotonic())
    print(f"non-streaming: Triton cancelled {took:.3f} s after the disconnect")
    assert took < CANCEL_WITHIN_S, f"Triton stopped {took:.2f} s after the disconnect"
    assert ref_stats()["completed"] == before["completed"]
    assert_generation_stopped(ref_stats)
    r = http.post("/v1/chat/completions", json=chat("Hi", max_tokens=2))
    assert r.status_code == 200, r.text

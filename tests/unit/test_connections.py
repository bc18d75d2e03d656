"""The connection guard on a real uvicorn socket (no Triton): silent and slow-header connections are
closed within the header timeout, connections past the cap are closed at once, and ordinary requests
(and the gateway's /health) keep being served throughout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from openai_api.app import create_app
from openai_api.server import uvicorn_config
from openai_api.settings import Settings
from tests.helpers import free_port
from tests.unit.fakes import llm_only_config

HEADER_TIMEOUT = 1.0
MAX_CONNECTIONS = 40
# How much later than the timeout a close may come (timers and scheduling): still a bounded time.
SLACK = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    config = llm_only_config(tmp_path_factory.mktemp("cfg"), url="127.0.0.1:1")
    settings = Settings(config_file=Path("."), header_timeout_s=HEADER_TIMEOUT, max_connections=MAX_CONNECTIONS)
    app = create_app(config, settings)
    port = free_port()
    srv = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    yield "127.0.0.1", port
    srv.should_exit = True
    thread.join(10)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `seconds`."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def health(addr: tuple[str, int]) -> int:
    return httpx.get(f"http://{addr[0]}:{addr[1]}/health", timeout=5).status_code


def test_silent_connections_are_closed_within_the_header_timeout(server: tuple[str, int]) -> None:
    socks = [socket.create_connection(server) for _ in range(20)]
    try:
        assert health(server) == 200  # served meanwhile
        t0 = time.monotonic()
        assert all(closed_within(s, HEADER_TIMEOUT + SLACK) for s in socks)
        assert time.monotonic() - t0 < HEADER_TIMEOUT + SLACK
    finally:
        for s in socks:
            s.close()


def test_headers_sent_slowly_are_cut_at_the_header_timeout(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as s:
        t0 = time.monotonic()
        closed = False
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - t0 > HEADER_TIMEOUT + SLACK:
                break
        assert closed or closed_within(s, 1.0)
        assert time.monotonic() - t0 < HEADER_TIMEOUT + SLACK + 1


def test_connections_past_the_cap_are_closed_at_once_and_service_returns(server: tuple[str, int]) -> None:
    socks = [socket.create_connection(server) for _ in range(MAX_CONNECTIONS + 20)]
    try:
        time.sleep(0.3)
        extra = socks[MAX_CONNECTIONS + 5:]
        assert all(closed_within(s, 0.5) for s in extra), "connections past the cap were kept"
        # Once the silent ones time out, slots are free again.
        time.sleep(HEADER_TIMEOUT + 1)
        assert health(server) == 200
    finally:
        for s in socks:
            s.close()


def test_a_keep_alive_connection_with_a_slow_second_request_is_cut(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b'{"status":"ok"}' not in first:  # headers and body may come in separate segments
            chunk = s.recv(4096)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\nHost")  # the next request starts, and stops
        assert closed_within(s, HEADER_TIMEOUT + SLACK)


def test_rejections_are_counted(server: tuple[str, int]) -> None:
    text = httpx.get(f"http://{server[0]}:{server[1]}/metrics", timeout=5).text
    assert 'openai_api_rejected_requests_total{reason="header_timeout"}' in text
    assert 'openai_api_rejected_requests_total{reason="connection_limit"}' in text

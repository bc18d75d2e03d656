"""The connection guard on a real uvicorn socket (no Triton): silent and slow-header connections are
closed within the header timeout, an oversized head is a 431 before it is complete, a body that does not
arrive is cut (a 408, or a close after an early 401), and at the connection cap a new connection takes the
place of the one waiting longest, so ordinary requests (and the gateway's /health) keep being served."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.server import uvicorn_config
from openai_api.settings import Settings
from tests.helpers import free_port
from tests.unit.fakes import llm_only_config

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
MAX_CONNECTIONS = 40
MAX_HEADER_BYTES = 16 * 1024
KEY = "edge-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# How much later than the timeout a close may come (timers and scheduling): still a bounded time.
SLACK = 2.0


@contextmanager
def serving(tmp: Path, **settings: Any) -> Iterator[tuple[tuple[str, int], FastAPI]]:
    config = llm_only_config(tmp, url="127.0.0.1:1")
    s = Settings(config_file=Path("."), api_keys=[KEY], **settings)
    app = create_app(config, s)
    port = free_port()
    srv = uvicorn.Server(uvicorn_config(app, s, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    try:
        yield ("127.0.0.1", port), app
    finally:
        srv.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with serving(tmp_path_factory.mktemp("cfg"), header_timeout_s=HEADER_TIMEOUT, body_timeout_s=BODY_TIMEOUT,
                 max_connections=MAX_CONNECTIONS, max_header_bytes=MAX_HEADER_BYTES) as (addr, _):
        yield addr


SLOW_S = 2.0


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A gateway whose deadlines are far away and whose cap is small, with a route that takes `SLOW_S`: what
    happens at the cap is then the cap's doing alone."""
    with serving(tmp_path_factory.mktemp("cfg"), header_timeout_s=60, body_timeout_s=60, max_connections=8) as (
            addr, app):
        async def slow() -> dict[str, str]:
            import asyncio

            await asyncio.sleep(SLOW_S)
            return {"status": "slow"}

        app.add_api_route("/slow", slow)
        yield addr


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `seconds`; what it sends first is read past."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            if sock.recv(65536) == b"":
                return True
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def read_response(sock: socket.socket, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from a raw socket: status, headers (lower-case names) and body (by Content-Length)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of a response"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def health(addr: tuple[str, int]) -> int:
    return httpx.get(f"http://{addr[0]}:{addr[1]}/health", timeout=5).status_code


def post_head(path: str, length: int, auth: bool) -> bytes:
    key = f"Authorization: Bearer {KEY}\r\n" if auth else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{key}Content-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


# --- the head: deadline and size ------------------------------------------------------------------------------

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


def test_a_head_over_the_cap_is_a_431_and_one_within_it_is_served(server: tuple[str, int]) -> None:
    for size, wanted in ((MAX_HEADER_BYTES - 200, 200), (MAX_HEADER_BYTES + 1, 431), (4 * MAX_HEADER_BYTES, 431)):
        with socket.create_connection(server) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
            status, headers, body = read_response(s)
            assert status == wanted, (size, body[:200])
            if wanted == 431:
                err = json.loads(body)["error"]
                assert err["code"] == "request_header_fields_too_large" and str(MAX_HEADER_BYTES) in err["message"]
                assert headers["connection"] == "close" and closed_within(s, 5)


def test_a_request_target_over_the_cap_is_a_431_too(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as s:
        s.sendall(b"GET /health?q=" + b"a" * (2 * MAX_HEADER_BYTES) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[0] == 431


def test_a_huge_header_is_refused_before_it_is_complete(server: tuple[str, int]) -> None:
    """The 431 comes while the header is still arriving: the server never holds (or parses) the whole of it.
    Here the header never ends at all, and the answer still comes, long before the header timeout could
    have closed the connection without one."""
    with socket.create_connection(server) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 * MAX_HEADER_BYTES))
        status, _, body = read_response(s, timeout=HEADER_TIMEOUT / 2)
        assert status == 431, body[:200]


def test_the_431_is_readable_while_the_client_is_still_sending(server: tuple[str, int]) -> None:
    """A client that goes on sending its 16 MiB header still reads the 431 (the server half-closes and drops
    the rest instead of resetting the connection under it)."""
    with socket.create_connection(server) as s:
        def send() -> None:
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 20) + b"\r\n\r\n")
            except OSError:
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        status, _, _ = read_response(s)
        assert status == 431
        sender.join(10)
    assert health(server) == 200


# --- the body: deadline, also after an early answer ------------------------------------------------------------

def test_a_body_that_does_not_arrive_is_a_408(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as s:
        s.sendall(post_head("/v1/chat/completions", 1000, auth=True) + b'{"model": ')
        status, headers, body = read_response(s, timeout=BODY_TIMEOUT + SLACK)
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout", body
        assert headers["connection"] == "close" and closed_within(s, 5)
    text = httpx.get(f"http://{server[0]}:{server[1]}/metrics", headers=AUTH, timeout=5).text
    assert 'status="408"} 1.0' in text  # recorded (and access-logged) as a 408, not a 500


def test_a_trickling_body_is_cut_also_after_its_401(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as s:
        s.sendall(post_head("/v1/chat/completions", 100_000, auth=False) + b"{")
        status, _, _ = read_response(s)
        assert status == 401
        t0 = time.monotonic()
        cut = False
        while time.monotonic() - t0 < BODY_TIMEOUT + SLACK + 2:  # 1 byte / 0.1 s: 100,000 bytes take ~3 hours
            try:
                s.sendall(b" ")
            except OSError:
                cut = True
                break
            if closed_within(s, 0.1):
                cut = True
                break
        assert cut, "the trickling body after a 401 was kept"


def test_a_big_body_that_keeps_coming_is_not_cut_at_the_body_timeout(server: tuple[str, int]) -> None:
    """The deadline grows with what arrives (1 s per 64 KiB): 192 KiB at ~96 KiB/s takes twice the body
    timeout and is read whole (the answer is the route's own, about the body, not a 408)."""
    body = b'{"model": "m", "input": "' + b"a" * (192 * 1024 - 30) + b'"}'
    with socket.create_connection(server) as s:
        s.sendall(post_head("/v1/embeddings", len(body), auth=True))
        for i in range(0, len(body), 8192):
            s.sendall(body[i:i + 8192])
            time.sleep(8192 / (96 * 1024))
        status, _, answer = read_response(s)
        assert status != 408 and status < 500, answer[:300]


# --- the cap --------------------------------------------------------------------------------------------------

def test_at_the_cap_a_new_connection_replaces_the_one_waiting_longest(patient: tuple[str, int]) -> None:
    socks = [socket.create_connection(patient) for _ in range(8)]
    try:
        for s in socks:
            s.sendall(b"GET /health HTTP/1.1\r\n")  # a head begun and never finished: waiting, not served
        time.sleep(0.3)
        assert health(patient) == 200  # a ninth connection is served
        assert closed_within(socks[0], 2), "the connection waiting longest made room"
        assert not any(closed_within(s, 0.05) for s in socks[2:])
    finally:
        for s in socks:
            s.close()


def test_at_the_cap_with_every_connection_served_a_new_one_is_closed_at_once(patient: tuple[str, int]) -> None:
    socks = [socket.create_connection(patient) for _ in range(8)]
    try:
        for s in socks:
            s.sendall(f"GET /slow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        time.sleep(0.5)  # each request read and in its route
        with socket.create_connection(patient) as extra:
            assert closed_within(extra, 1.0), "a connection past the cap was kept while every slot was served"
        for s in socks:
            assert read_response(s, timeout=SLOW_S + 10)[0] == 200  # served connections are never cut
        assert health(patient) == 200
    finally:
        for s in socks:
            s.close()


def test_rejections_are_counted(server: tuple[str, int]) -> None:
    text = httpx.get(f"http://{server[0]}:{server[1]}/metrics", headers=AUTH, timeout=5).text
    for reason in ("header_timeout", "header_too_large", "body_timeout"):
        assert f'openai_api_rejected_requests_total{{reason="{reason}"}}' in text, reason


# --- a body over the size limit: the 413 is readable --------------------------------------------------------------

SMALL_BODY = 64 * 1024


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A gateway whose body limit is 64 KiB (the default is 16 MiB: the same code, a cheaper test)."""
    with serving(tmp_path_factory.mktemp("cfg"), max_body_bytes=SMALL_BODY) as (addr, _):
        yield addr


@pytest.mark.parametrize("chunked", [False, True])
def test_an_upload_over_the_body_limit_reads_its_413_through_the_sdks_client(small: tuple[str, int],
                                                                             chunked: bool) -> None:
    """An upload well over the limit (a batch file of 8 MiB here, 27 MB against the default 16 MiB) gets the 413 the
    client can read - not a connection reset while it is still sending (closing a socket with unread input resets
    it; the SDK then retries the whole upload twice and raises a connection error). Both with the size announced
    (Content-Length: answered before any of the body is read) and counted while a chunked body streams in."""
    body = b'{"model": "m", "input": "' + b"a" * (8 << 20) + b'"}'
    content: Any = (body[i:i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    with httpx.Client(base_url=f"http://{small[0]}:{small[1]}", headers=AUTH, timeout=30) as client:
        r = client.post("/v1/embeddings", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "payload_too_large"
    assert health(small) == 200


def test_an_upload_answered_before_its_body_is_read_is_not_reset(small: tuple[str, int]) -> None:
    """The 413 to an announced size goes out before any of the body is read; the client, still sending, must be able
    to send what it announced and then read the answer (a lingering close, as nginx's), not have its upload reset
    half-way - closing a socket with unread input sends a reset, which a client that writes its whole body before
    reading (most do) sees as a connection error. 8 MiB here; a 27 MB batch file met the default 16 MiB limit."""
    size = 8 << 20
    with socket.create_connection(small, timeout=10) as sock:
        sock.sendall(f"POST /v1/files HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n".encode())
        time.sleep(0.2)  # the 413 is written (and, before the fix, the socket closed) while the body is on its way
        chunk = b"a" * 65536
        for _ in range(size // len(chunk)):
            sock.sendall(chunk)  # ConnectionResetError here when the gateway closed with the body unread
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "payload_too_large"

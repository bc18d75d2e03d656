"""The edge against the gateway as users run it (its own process, a real tritonserver behind it), probed
over loopback as an attacker without a key would: one huge header, and hundreds of sockets that trickle a
request body (after their 401) while reconnecting whenever they are closed. Throughout, a prober opens a new
connection for every `/health`: each must be answered, and each trickler must be cut.

The figures (time to refuse the header, `/health` latency under each probe) are printed (`pytest -s`);
nothing here asserts a wall-clock target."""

from __future__ import annotations

import contextlib
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.conftest import API_KEY
from tests.e2e.test_reliability_shutdown import start_cli, stop, wait_healthy, write_config
from tests.helpers import free_port

MAX_CONNECTIONS = 100
BODY_TIMEOUT = 3.0
TRICKLERS = 200


@dataclass
class Gateway:
    host: str
    port: int
    log: Path

    @property
    def addr(self) -> tuple[str, int]:
        return self.host, self.port


@pytest.fixture(scope="module")
def gw(triton: EmbeddedTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("edge-gateway")
    port = free_port()
    log = folder / "cli.log"
    proc = start_cli(["--port", str(port), "--config-file", str(write_config(folder, triton, ("llm",))),
                      "--max-connections", str(MAX_CONNECTIONS), "--body-timeout", str(BODY_TIMEOUT)], log,
                     key=API_KEY)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log, timeout=120)
        yield Gateway("127.0.0.1", port, log)
    finally:
        stop(proc)


def read_status(sock: socket.socket, timeout: float) -> int:
    """The status of the response on `sock` (its first line), or 0 when the connection ends first."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return 0
            data += chunk
    except OSError:
        return 0
    return int(data.split(b" ", 2)[1])


@dataclass
class HealthProber:
    """While a block runs: `/health` on a new connection every 20 ms; each answer's latency, each failure."""

    addr: tuple[str, int]
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _probe(self) -> None:
        t0 = time.monotonic()
        try:
            with socket.create_connection(self.addr, timeout=30) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                status = read_status(s, 30)
        except OSError as e:
            self.failures.append(type(e).__name__)
            return
        if status != 200:
            self.failures.append(f"status {status}")
            return
        self.latencies.append(time.monotonic() - t0)

    def __enter__(self) -> HealthProber:
        def run() -> None:
            while not self._stop.is_set():
                self._probe()
                time.sleep(0.02)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)

    def figures(self) -> str:
        ms = sorted(x * 1000 for x in self.latencies)
        return (f"{len(ms)} /health answers, median {statistics.median(ms):.1f} ms, "
                f"p99 {ms[int(len(ms) * 0.99)]:.1f} ms, max {ms[-1]:.1f} ms; {len(self.failures)} failures")


def test_a_16_mib_header_is_a_431_and_health_stays_served(gw: Gateway) -> None:
    with HealthProber(gw.addr) as prober:
        time.sleep(0.5)
        with socket.create_connection(gw.addr) as s:
            def send() -> None:
                with contextlib.suppress(OSError):  # the gateway stops reading once it has refused
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 20) + b"\r\n\r\n")

            t0 = time.monotonic()
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            status = read_status(s, 60)
            refused_s = time.monotonic() - t0
            sender.join(30)
        time.sleep(0.5)
    print(f"\n16 MiB header: {status} after {refused_s * 1000:.0f} ms; {prober.figures()}")
    assert status == 431
    assert prober.latencies and not prober.failures, prober.failures[:5]


@dataclass
class Trickler:
    """One attacker socket: a POST head without a key, then its body one byte at a time."""

    sock: socket.socket
    opened: float
    answered: int = 0
    closed: float | None = None


def open_trickler(addr: tuple[str, int]) -> Trickler | None:
    try:
        s = socket.create_connection(addr, timeout=5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{")
    except OSError:
        return None
    s.setblocking(False)
    return Trickler(s, time.monotonic())


def tend(t: Trickler) -> None:
    """Send the next byte and read what came back; record when the gateway ends the connection."""
    if t.closed is not None:
        return
    try:
        while select.select([t.sock], [], [], 0)[0]:
            data = t.sock.recv(65536)
            if not data:
                raise ConnectionResetError
            if data.startswith(b"HTTP/1.1 "):
                t.answered = int(data.split(b" ", 2)[1])
        t.sock.send(b" ")
    except OSError:
        t.closed = time.monotonic()
        t.sock.close()


def test_trickling_bodies_neither_hold_the_gateway_nor_stay_open(gw: Gateway) -> None:
    """200 sockets (twice the connection cap) trickle request bodies, and reconnect as soon as they are closed;
    `/health`, each time on a new connection, is answered throughout. Then they stop reconnecting and keep
    trickling: each is cut (its body would take ~7 hours)."""
    everyone: list[Trickler] = []
    slots: list[Trickler | None] = [None] * TRICKLERS
    with HealthProber(gw.addr) as prober:
        end = time.monotonic() + 3 * BODY_TIMEOUT
        while time.monotonic() < end:
            for i, t in enumerate(slots):
                if t is None or t.closed is not None:
                    slots[i] = t = open_trickler(gw.addr)
                    if t is not None:
                        everyone.append(t)
                if t is not None:
                    tend(t)
            time.sleep(0.25)
    print(f"\n{TRICKLERS} trickling sockets ({len(everyone)} connections opened): {prober.figures()}")
    assert prober.latencies and not prober.failures, prober.failures[:5]
    assert any(t.answered == 401 for t in everyone)

    last = [t for t in slots if t is not None and t.closed is None]
    deadline = time.monotonic() + BODY_TIMEOUT + 30  # generous: the point is that they end, not when
    while time.monotonic() < deadline and any(t.closed is None for t in last):
        for t in last:
            tend(t)
        time.sleep(0.25)
    kept = [t for t in last if t.closed is None]
    for t in kept:
        t.sock.close()
    assert not kept, f"{len(kept)} of {len(last)} trickling connections were kept open"

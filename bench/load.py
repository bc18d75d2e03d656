"""The HTTP load generator (the gateway side) and the runners both sides share.

The HTTP side uses a minimal keep-alive HTTP/1.1 client on asyncio streams instead of httpx, so the
load generator (which shares the 2 cores with everything it measures) spends as little CPU per SSE
chunk as it can; it counts token events by searching the raw bytes for the delta marker, the way a
streaming client reads them. The direct side (straight to Triton over gRPC) is ``bench.limit``, in
processes of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

# One per SSE event that carries a token: chat content deltas, and a forced tool call's argument deltas
# (the first tool-call delta, with the id and the name, has `"function":{"name":` and is not counted).
CONTENT_MARKER = b'"delta":{"content":'
TOOL_ARGS_MARKER = b'"function":{"arguments":'


class HTTPError(RuntimeError):
    pass


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection; requests on it run one after another."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.opened = 0  # connections made so far (a server that closed an idle one gets a new one)

    async def _connect(self) -> None:
        if self.reader is not None and self.reader.at_eof():  # the server closed it (its keep-alive timeout)
            self.close()
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
            self.opened += 1

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def _send(
        self, path: str, body: bytes, extra: dict[str, str] | None = None
    ) -> tuple[int, dict[bytes, bytes]]:
        await self._connect()
        assert self.reader is not None and self.writer is not None
        more = "".join(f"{k}: {v}\r\n" for k, v in extra.items()) if extra else ""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"{more}Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if b":" in line:
                k, v = line.split(b":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers

    async def _chunks(self, headers: dict[bytes, bytes]) -> AsyncIterator[bytes]:
        assert self.reader is not None
        reader = self.reader
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        else:
            yield await reader.readexactly(int(headers.get(b"content-length", b"0")))

    async def post_json(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        return await self.post_body(path, orjson.dumps(payload))

    async def post_body(
        self,
        path: str,
        body: bytes,
        extra: dict[str, str] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
    ) -> tuple[int, bytes]:
        """POST an encoded JSON body (with ``extra`` headers); the whole response body. ``on_chunk`` sees each
        piece of it as it arrives (an SSE stream's events, say)."""
        try:
            status, headers = await self._send(path, body, extra)
            parts = []
            async for c in self._chunks(headers):
                if on_chunk is not None:
                    on_chunk(c)
                parts.append(c)
            body = b"".join(parts)
        except BaseException:
            self.close()
            raise
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, body

    async def post_stream(
        self,
        path: str,
        payload: dict[str, Any],
        on_count: Callable[[int], None],
        marker: bytes = CONTENT_MARKER,
    ) -> int:
        """POST an SSE request; call ``on_count(k)`` as token events (``marker``) arrive; return their total."""
        try:
            status, headers = await self._send(path, orjson.dumps(payload))
            if status != 200:
                body = b"".join([c async for c in self._chunks(headers)])
                raise HTTPError(f"HTTP {status}: {body[:300]!r}")
            total = 0
            done = False
            async for chunk in self._chunks(headers):
                k = chunk.count(marker)
                if k:
                    total += k
                    on_count(k)
                if b'"error"' in chunk and b'{"error"' in chunk:
                    raise HTTPError(f"stream error event: {chunk[:300]!r}")
                if b"data: [DONE]" in chunk:
                    done = True
            if not done:
                raise HTTPError("stream ended without data: [DONE]")
            return total
        except BaseException:
            self.close()  # a cancelled or broken stream cannot be reused
            raise


# ---------------------------------------------------------------------------------------------- runners
@dataclass
class Counter:
    value: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, k: int) -> None:
        self.value += k


async def throughput(
    worker: Callable[[Counter], Awaitable[Any]],
    concurrency: int,
    warmup_s: float,
    measure_s: float,
    drain_s: float = 30.0,
    probe: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Run ``concurrency`` loops of ``worker`` and count units (tokens, texts) in a measured window.

    Units that arrive during the warm-up are not counted. ``probe()`` (CPU seconds of each process
    by name) is sampled at both ends of the window: the differences come back as ``window_cpu_s``.
    When the window closes, no loop starts a new request and the ones in flight finish (up to
    ``drain_s``; then they are cancelled): Triton 2.51's gRPC frontend can abort on a burst of
    simultaneous stream cancellations (``ASSERTION FAILED: prior > 0``,
    triton-inference-server/server#8034), which a benchmark that cancels 64 streams at once every
    window triggers."""
    counter = Counter()
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            try:
                await worker(counter)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                counter.errors.append(f"{type(e).__name__}: {e}"[:300])
                await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(loop()) for _ in range(concurrency)]
    try:
        await asyncio.sleep(warmup_s)
        cpu0 = probe() if probe is not None else {}
        v0, t0 = counter.value, time.perf_counter()
        await asyncio.sleep(measure_s)
        v1, t1 = counter.value, time.perf_counter()
        cpu1 = probe() if probe is not None else {}
        stop.set()
        await asyncio.wait(tasks, timeout=drain_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out: dict[str, Any] = {
        "window": (t0, t1),  # perf_counter times, for callers that time requests themselves
        "rate": (v1 - v0) / (t1 - t0),
        "units": v1 - v0,
        "seconds": round(t1 - t0, 3),
        "errors": len(counter.errors),
        "first_errors": counter.errors[:3],
    }
    if probe is not None:
        out["window_cpu_s"] = {k: round(cpu1[k] - cpu0[k], 4) for k in cpu1}
    return out


def percentiles_ms(samples_s: list[float]) -> dict[str, float]:
    arr = np.asarray(samples_s) * 1000.0 if samples_s else np.asarray([float("nan")])
    return {
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
        "n": len(samples_s),
    }


async def stream_timings(
    conns: ConnectionPool,
    path: str,
    payload: dict[str, Any],
    concurrency: int,
    warmup_s: float,
    measure_s: float,
) -> dict[str, Any]:
    """``throughput`` of streamed requests, plus each request's time to first token and inter-token
    latency the way AIPerf defines them: ITL = (last response - first token) / (tokens - 1). Requests
    that started after the warm-up count (they may end in the drain, as in AIPerf's grace period)."""
    records: list[tuple[float, float, float, int]] = []

    async def worker(counter: Counter) -> None:
        first: list[float] = []
        t0 = time.perf_counter()

        def on_count(k: int) -> None:
            if not first:
                first.append(time.perf_counter())
            counter.add(k)

        async with conns.connection() as conn:
            n = await conn.post_stream(path, payload, on_count)
        records.append((t0, first[0] if first else float("nan"), time.perf_counter(), n))

    out = await throughput(worker, concurrency, warmup_s, measure_s)
    start = out["window"][0]
    timed = [r for r in records if r[0] >= start and r[3] > 1]
    out["ttft"] = percentiles_ms([f - s for s, f, _e, _n in timed])
    out["itl"] = percentiles_ms([(e - f) / (n - 1) for _s, f, e, n in timed])
    out["requests"] = len(timed)
    return out


async def latencies(
    call: Callable[[], Awaitable[Any]], concurrency: int, requests_per_worker: int, warmup: int = 5
) -> dict[str, Any]:
    """``concurrency`` workers each make ``requests_per_worker`` sequential calls; per-call latency."""
    samples: list[float] = []
    errors: list[str] = []

    async def worker() -> None:
        for i in range(warmup + requests_per_worker):
            t0 = time.perf_counter()
            try:
                await call()
            except Exception as e:  # noqa: BLE001
                errors.append(f"{type(e).__name__}: {e}"[:300])
                continue
            if i >= warmup:
                samples.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {
        **percentiles_ms(samples),
        "req_per_s": len(samples) / wall if wall else 0.0,
        "errors": len(errors),
        "first_errors": errors[:3],
    }


class ConnectionPool:
    """Connections for concurrent workers: each call takes one, and gives it back when done."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.free: list[HTTPConnection] = []

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[HTTPConnection]:
        conn = self.free.pop() if self.free else HTTPConnection(self.host, self.port)
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        self.free.append(conn)

    def close(self) -> None:
        for c in self.free:
            c.close()
        self.free.clear()

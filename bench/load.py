"""Load generators: the same work sent through the gateway (HTTP/SSE) and straight to Triton (gRPC).

The HTTP side uses a minimal keep-alive HTTP/1.1 client on asyncio streams instead of httpx, so the
load generator (which shares the 2 cores with everything it measures) spends as little CPU per SSE
chunk as the direct side spends per gRPC response; it counts content chunks by searching the raw
bytes for the delta marker, the way a streaming client reads them.
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
import tritonclient.grpc.aio as grpc_aio
from tritonclient.grpc import InferInput, InferRequestedOutput

CONTENT_MARKER = b'"delta":{"content":'


class HTTPError(RuntimeError):
    pass


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection; requests on it run one after another."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def _send(self, path: str, body: bytes) -> tuple[int, dict[bytes, bytes]]:
        await self._connect()
        assert self.reader is not None and self.writer is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
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
        try:
            status, headers = await self._send(path, orjson.dumps(payload))
            body = b"".join([c async for c in self._chunks(headers)])
        except BaseException:
            self.close()
            raise
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, body

    async def post_stream(self, path: str, payload: dict[str, Any], on_count: Callable[[int], None]) -> int:
        """POST an SSE request; call ``on_count(k)`` as content chunks arrive; return their total."""
        try:
            status, headers = await self._send(path, orjson.dumps(payload))
            if status != 200:
                body = b"".join([c async for c in self._chunks(headers)])
                raise HTTPError(f"HTTP {status}: {body[:300]!r}")
            total = 0
            done = False
            async for chunk in self._chunks(headers):
                k = chunk.count(CONTENT_MARKER)
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


# ---------------------------------------------------------------------------------------------- Triton
class DirectLLM:
    """What a client calling Triton itself does: one gRPC stream per request via tritonclient.grpc.aio."""

    def __init__(self, url: str, model: str, prompt_ids: list[int], end_id: int, pad_id: int) -> None:
        self.client = grpc_aio.InferenceServerClient(url)
        self.model = model
        self.prompt_ids = prompt_ids
        self.end_id, self.pad_id = end_id, pad_id

    async def close(self) -> None:
        await self.client.close()

    @staticmethod
    def _tensor(name: str, value: Any, dtype: str) -> InferInput:
        arr = np.asarray(value, dtype={"INT32": np.int32, "BOOL": np.bool_}[dtype])[np.newaxis, ...]
        inp = InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        return inp

    def payload(self, max_tokens: int, streaming: bool) -> dict[str, Any]:
        """The same inputs the gateway sends for a chat request without sampling parameters."""
        t = self._tensor
        return {
            "model_name": self.model,
            "inputs": [
                t("input_ids", self.prompt_ids, "INT32"),
                t("request_output_len", [max_tokens], "INT32"),
                t("input_lengths", [len(self.prompt_ids)], "INT32"),
                t("end_id", [self.end_id], "INT32"),
                t("pad_id", [self.pad_id], "INT32"),
                t("streaming", [streaming], "BOOL"),
            ]
            + ([] if streaming else [t("exclude_input_in_output", [True], "BOOL")]),
            "outputs": [InferRequestedOutput("output_ids"), InferRequestedOutput("sequence_length")],
        }

    async def generate(
        self, max_tokens: int, on_count: Callable[[int], None] | None = None, streaming: bool = True
    ) -> int:
        payload = self.payload(max_tokens, streaming)

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield payload

        stream = self.client.stream_infer(one())
        total = 0
        try:
            async for result, error in stream:
                if error is not None:
                    raise RuntimeError(f"Triton error: {error}")
                k = result.as_numpy("output_ids").size
                total += k
                if on_count is not None and k:
                    on_count(k)
        finally:
            stream.cancel()
        return total


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
) -> dict[str, Any]:
    """Run ``concurrency`` loops of ``worker`` and count units (tokens, texts) in a measured window.

    Units that arrive during the warm-up are not counted. When the window closes, no loop starts a
    new request and the ones in flight finish (up to ``drain_s``; then they are cancelled): Triton
    2.51's gRPC frontend can abort on a burst of simultaneous stream cancellations
    (``ASSERTION FAILED: prior > 0``, triton-inference-server/server#8034), which a benchmark
    that cancels 64 streams at once every window triggers."""
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
        v0, t0 = counter.value, time.perf_counter()
        await asyncio.sleep(measure_s)
        v1, t1 = counter.value, time.perf_counter()
        stop.set()
        await asyncio.wait(tasks, timeout=drain_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "rate": (v1 - v0) / (t1 - t0),
        "units": v1 - v0,
        "seconds": round(t1 - t0, 3),
        "errors": len(counter.errors),
        "first_errors": counter.errors[:3],
    }


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
    arr = np.asarray(samples) * 1000.0 if samples else np.asarray([float("nan")])
    return {
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
        "n": len(samples),
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

"""The keys' counters shared by the workers of one host (`--workers N` without `--redis-url`): the
supervisor keeps them (a `MemoryCore` served on a Unix socket in its private run directory, by one thread
with its own event loop) and each worker asks it (`SharedStore`), one JSON line per operation.

Why the supervisor: it is already the one process that outlives every worker; one copy of the counters
applied by one thread is exact with no locking protocol between processes (a shared-memory table would
need a cross-process lock held on every request, and hot-reloaded key sets make its layout change), and
it needs nothing installed (a local Redis would). A round trip on a Unix socket costs tens of
microseconds, once when a request begins, once per token reservation, once when it ends. A worker's
connection is also its identity: when a worker dies, its connection closes and the concurrency slots it
held are given back at once. Each worker pipelines its requests on one connection (answers come back in
order).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from openai_api.quota.store import Decision, Limits, MemoryCore, MemoryStore

logger = logging.getLogger("openai_api.keys")
SOCKET_ENV = "OPENAI_API_QUOTA_SOCKET"  # set by the supervisor in each worker's environment
TIMEOUT_S = 2.0


class QuotaServer:
    """The supervisor's side: `start()` serves `path` from a thread until `stop()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.core = MemoryCore()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._ids = itertools.count()
        self._stop: asyncio.Event | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="quota-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the quota server did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_unix_server(self._client, path=str(self.path))
        os.chmod(self.path, 0o600)
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        holder = f"c{next(self._ids)}"
        try:
            while line := await reader.readline():
                writer.write(orjson.dumps(self.handle(holder, orjson.loads(line))) + b"\n")
                await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            self.core.drop_holder(holder)  # a worker gone: its slots come back
            writer.close()

    def handle(self, holder: str, msg: list[Any]) -> Any:
        op, name = msg[0], msg[1]
        if op == "begin":
            return self.core.begin(name, Limits.from_args(msg[2]), holder).to_list()
        if op == "reserve":
            return self.core.reserve(name, Limits.from_args(msg[2]), int(msg[3])).to_list()
        if op == "finish":
            self.core.finish(name, [(g, int(d)) for g, d in msg[2]], bool(msg[3]), holder)
            return 1
        if op == "usage":
            return self.core.usage(name, Limits.from_args(msg[2]))
        raise ValueError(f"unknown operation {op!r}")


class SharedStore:
    """A worker's side. If the supervisor cannot be reached (it is gone, and this worker is about to be
    told to stop), the worker counts on its own rather than refusing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.local = MemoryStore()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()

    async def _connect(self) -> None:
        async with self._connecting:
            if self._writer is not None:
                return
            self._reader, self._writer = await asyncio.open_unix_connection(self.path)
            self._reader_task = asyncio.create_task(self._read(self._reader), name="quota-client")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                fut = self._waiting.popleft()
                if not fut.done():
                    fut.set_result(orjson.loads(line))
        except (ConnectionError, ValueError, IndexError):
            pass
        self._broken()

    def _broken(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = self._reader = None
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError("the supervisor's quota server closed the connection"))

    async def _ask(self, msg: list[Any]) -> Any:
        if self._writer is None:
            async with asyncio.timeout(TIMEOUT_S):
                await self._connect()
        assert self._writer is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        self._writer.write(orjson.dumps(msg) + b"\n")
        # Shielded: a cancelled request must not lose its place in the answers' order.
        async with asyncio.timeout(TIMEOUT_S):
            return await asyncio.shield(fut)

    async def begin(self, name: str, limits: Limits) -> Decision:
        try:
            return Decision.from_list(await self._ask(["begin", name, limits.args()]))
        except (OSError, TimeoutError):
            logger.error("the supervisor's quota counters are unreachable: counting in this worker")
            d = await self.local.begin(name, limits)
            d.local = True
            return d

    async def reserve(self, name: str, limits: Limits, tokens: int) -> Decision:
        try:
            return Decision.from_list(await self._ask(["reserve", name, limits.args(), tokens]))
        except (OSError, TimeoutError):
            d = await self.local.reserve(name, limits, tokens)
            d.local = True
            return d

    async def finish(self, name: str, limits: Limits, adjustments: list[tuple[list[Any], int]],
                     release: bool, local: bool = False) -> None:
        if local:
            await self.local.finish(name, limits, adjustments, release)
            return
        with contextlib.suppress(OSError, TimeoutError):
            await self._ask(["finish", name, [[g, d] for g, d in adjustments], release])

    async def usage(self, name: str, limits: Limits) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self._ask(["usage", name, limits.args()])
            return result
        except (OSError, TimeoutError):
            return await self.local.usage(name, limits)

    async def start(self) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(TIMEOUT_S):
                await self._connect()

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        self._broken()

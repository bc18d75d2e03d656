"""`RedisStore` (openai_api/quota/redis_store.py) when Redis does not answer, against real sockets on loopback:
a server that accepts and never replies (a hung Redis) and a port nobody listens on (a dead one).

A refused connection marks Redis down at once, so the next calls do not wait on it; a call that only runs past
its budget fails alone, and only `SLOW_CALLS_DOWN` of them in a row mark Redis down: one late answer on a
saturated host (the budget counts the event loop's own delays) must not turn a fail-closed gateway into a second
of 503s for every key. The end-to-end tier (tests/e2e/test_keys_quotas.py) kills a real Redis."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from openai_api.quota.redis_store import SLOW_CALLS_DOWN, RedisStore
from openai_api.quota.store import Limits, QuotaStoreUnavailableError

LIMITS = Limits(requests=10, tokens=None, concurrent=None, day=None, month=None, window_s=60.0)
BUDGET_S = 0.2


@pytest.fixture
async def hung_port() -> AsyncIterator[int]:
    """A listening socket that reads what it is sent and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(4096):
            pass

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for w in held:
        w.close()
    server.close()


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connecting is refused


async def timed_begin(store: RedisStore) -> float:
    t0 = time.monotonic()
    with pytest.raises(QuotaStoreUnavailableError):
        await store.begin("k", LIMITS)
    return time.monotonic() - t0


async def test_late_calls_fail_alone_until_several_in_a_row_mark_redis_down(hung_port: int) -> None:
    store = RedisStore(f"redis://127.0.0.1:{hung_port}/0", "closed", timeout_s=BUDGET_S)
    try:
        waits = [await timed_begin(store) for _ in range(SLOW_CALLS_DOWN)]
        assert all(w >= BUDGET_S * 0.9 for w in waits), waits  # each one waited for Redis: not marked down yet
        assert await timed_begin(store) < BUDGET_S / 2  # marked down: the next call does not wait
    finally:
        await store.close()


async def test_a_refused_connection_marks_redis_down_at_once() -> None:
    store = RedisStore(f"redis://127.0.0.1:{dead_port()}/0", "closed", timeout_s=BUDGET_S)
    try:
        await timed_begin(store)
        assert store._down_until > time.monotonic()
    finally:
        await store.close()


async def test_fail_open_counts_locally_while_redis_does_not_answer(hung_port: int) -> None:
    store = RedisStore(f"redis://127.0.0.1:{hung_port}/0", "open", timeout_s=BUDGET_S)
    try:
        decision = await store.begin("k", LIMITS)
        assert decision.local
    finally:
        await store.close()

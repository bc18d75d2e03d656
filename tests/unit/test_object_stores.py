"""The stores of client objects (`openai_api/stored/`): memory, SQLite in a folder, and a real `redis-server` on
loopback (skipped where none is installed: set-up installs it; a test never does). Each store answers only the
owner of an object, never lets another owner replace it, keeps its bounds in entries and bytes by evicting the
oldest, and forgets what outlived its TTL. The SQLite and Redis stores are shared: two store objects on one
folder or one Redis stand for two workers or two gateways, and the bounds hold across them."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from openai_api.quota.caller import Caller, Policy
from openai_api.stored.base import (
    MemoryObjectStore,
    ObjectStore,
    StoredObject,
    StoreUnavailableError,
    new_id,
    readable,
)
from openai_api.stored.factory import build_object_store, sqlite_folder, store_kind
from openai_api.stored.redis import RedisObjectStore
from openai_api.stored.sqlite import SQLiteObjectStore
from tests.helpers import free_port

MakeStore = Callable[..., ObjectStore]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if binary is None:
        pytest.skip("redis-server is not installed (set-up installs it: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis")), "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeStore]:
    """`make(max_entries=..., max_bytes=..., ttl_s=...)`: a store of the kind; sqlite and redis ones made by one
    test share their folder or their Redis (a fresh database per test)."""
    made: list[ObjectStore] = []
    url = ""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        probe = RedisObjectStore(url, 1, 1)
        await probe.redis.flushdb()
        await probe.close()

    def build(max_entries: int = 100, max_bytes: int = 1 << 20, ttl_s: float = 3600.0) -> ObjectStore:
        store: ObjectStore
        if request.param == "memory":
            store = MemoryObjectStore(max_entries, max_bytes, ttl_s)
        elif request.param == "sqlite":
            store = SQLiteObjectStore(tmp_path / "objects", max_entries, max_bytes, ttl_s)
        else:
            store = RedisObjectStore(url, max_entries, max_bytes, ttl_s)
        made.append(store)
        return store

    yield build
    for store in made:
        await store.close()


def obj(owner: str, object_id: str | None = None, size: int = 10, model: str = "m", kind: str = "response",
        created_at: float | None = None) -> StoredObject:
    return StoredObject(kind, object_id or new_id("resp_"), owner, model, b"x" * size,
                        time.time() if created_at is None else created_at)


async def test_only_the_owner_reads_or_deletes_and_nobody_replaces_anothers_object(make: MakeStore) -> None:
    store = make()
    await store.start()
    mine = obj("key:a", size=5)
    assert await store.put(mine)
    assert await store.get("response", "key:b", mine.id) is None
    assert await store.get("batch", "key:a", mine.id) is None  # another kind is another object
    assert not await store.delete("response", "key:b", mine.id)
    theirs = StoredObject("response", mine.id, "key:b", "m", b"overwritten", time.time())
    assert not await store.put(theirs)  # the same id from another owner never replaces it
    got = await store.get("response", "key:a", mine.id)
    assert got is not None and got.data == b"xxxxx" and got.owner == "key:a" and got.model == "m"
    assert await store.delete("response", "key:a", mine.id)
    assert await store.get("response", "key:a", mine.id) is None
    assert not await store.delete("response", "key:a", mine.id)


async def test_the_oldest_go_first_past_the_entry_and_byte_bounds(make: MakeStore) -> None:
    store = make(max_entries=3, max_bytes=100)
    ids = [new_id("resp_") for _ in range(5)]
    for i in ids[:4]:
        assert await store.put(obj("key:a", i, size=10))
    assert [await store.get("response", "key:a", i) is not None for i in ids[:4]] == [False, True, True, True]
    assert await store.put(obj("key:a", ids[4], size=90))  # 10 + 90 fit; the two before that do not
    assert [await store.get("response", "key:a", i) is not None for i in ids] == [False, False, False, True, True]
    assert not await store.put(obj("key:a", size=101))  # larger than the whole store: not kept, nothing evicted
    assert await store.get("response", "key:a", ids[4]) is not None


async def test_an_object_is_forgotten_after_its_ttl(make: MakeStore) -> None:
    store = make(ttl_s=1.0)
    first = obj("key:a")
    assert await store.put(first)
    assert await store.get("response", "key:a", first.id) is not None
    await asyncio.sleep(1.3)
    assert await store.get("response", "key:a", first.id) is None


@pytest.mark.parametrize("make", ["sqlite", "redis"], indirect=True)
async def test_two_processes_share_one_store_and_its_bounds(make: MakeStore) -> None:
    """Two store objects on one folder / one Redis, as two workers or two gateways: what one keeps the other reads
    (for its owner only), and the bounds hold over both writers."""
    one, two = make(max_entries=10, max_bytes=1000), make(max_entries=10, max_bytes=1000)
    first = obj("key:a")
    assert await one.put(first)
    assert (await two.get("response", "key:a", first.id)) is not None
    assert (await two.get("response", "key:b", first.id)) is None
    ids = [new_id("resp_") for _ in range(30)]
    await asyncio.gather(*(store.put(obj("key:a", i, size=20)) for store, i in zip([one, two] * 15, ids,
                                                                                    strict=True)))
    alive = [i for i in ids if await one.get("response", "key:a", i) is not None]
    assert len(alive) == 10  # the entry bound, across both writers (200 bytes: under the byte bound)
    assert await two.delete("response", "key:a", alive[0])
    assert await one.get("response", "key:a", alive[0]) is None


async def test_a_store_that_cannot_be_reached_is_a_503_not_a_hang(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    store = RedisObjectStore(f"redis://127.0.0.1:{dead}/0", 10, 1000, timeout_s=0.5)
    with pytest.raises(StoreUnavailableError) as e:
        await store.get("response", "key:a", "resp_x")
    assert e.value.status == 503
    await store.close()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    sqlite = SQLiteObjectStore(blocked, 10, 1000)
    with pytest.raises(StoreUnavailableError):
        await sqlite.start()
    await sqlite.close()


def test_readable_needs_the_owner_and_a_model_the_key_still_may_use() -> None:
    kept = obj("key:team-a", model="smollm2-135m-instruct")
    a = Caller("team-a", policy=Policy(models=("smollm2-*",)))
    assert readable(kept, a) is kept
    assert readable(kept, Caller("team-b")) is None
    narrowed = Caller("team-a", policy=Policy(models=("all-minilm-*",)))
    assert readable(kept, narrowed) is None
    assert Caller("api-key", key_digest="ab").owner != Caller("api-key", key_digest="cd").owner


def test_store_urls() -> None:
    assert store_kind(None) == store_kind("memory") == "memory"
    assert store_kind("sqlite:///var/lib/gw") == "sqlite"
    assert sqlite_folder("sqlite:///var/lib/gw") == Path("/var/lib/gw")
    assert sqlite_folder("sqlite:data/objects") == Path("data/objects")
    assert store_kind("redis://h:6379/0") == store_kind("rediss://h/0") == store_kind("unix:///r.sock") == "redis"
    for bad in ("postgres://x", "sqlite:", "mem"):
        with pytest.raises(ValueError):
            store_kind(bad)
    assert isinstance(build_object_store(None, 1, 1, 1.0), MemoryObjectStore)

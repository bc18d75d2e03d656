"""Objects kept for clients between requests, each owned by the key that made it, behind one protocol.

**Ownership.** Every object carries its `owner` (`Caller.owner`: the keys file's key name, so rotating a
key's secret under the same name keeps its objects; an `--api-key` key by a digest of the key, so two such
keys never share; `anonymous` on a gateway without keys) and the `model` it was made with. Every read,
continuation and delete names the owner, and a store answers only objects of that owner; `readable` adds the
reader's model allow-list, so a key narrowed to other models no longer reaches what it made before. For a
caller anything else does not exist: the routes answer 404, the same as for an id never issued. Ids are made
by the gateway (`new_id`: 192 random bits), never taken from a client's header, and a `put` never replaces
another owner's object.

**Kinds.** An object is named by `(kind, id)`: `response` today; a later `batch`, `file` or `conversation`
is another kind in the same stores, under the same owner check.

**Bounds.** Every store keeps at most `max_entries` objects and `max_bytes` of their data, evicting the oldest
first, and forgets an object `ttl_s` after it was stored. An object larger than `max_bytes` alone is not kept
(`put` returns False).

**Stores.** `MemoryObjectStore` (one process), `stored.sqlite.SQLiteObjectStore` (a file shared by every
worker of one host, off the event loop), `stored.redis.RedisObjectStore` (several gateways). A store that
cannot be reached raises `StoreUnavailableError` (a 503) on reads; callers log a failed `put` and go on.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from openai_api.errors import BackendUnavailableError
from openai_api.quota.caller import Caller

DEFAULT_TTL_S = 30 * 86400.0  # OpenAI keeps stored responses for 30 days


class StoreUnavailableError(BackendUnavailableError):
    """The store of client objects cannot be reached (Redis down, a locked or unwritable SQLite file)."""

    default_code = "store_unavailable"


def new_id(prefix: str) -> str:
    """A gateway-made object id: `prefix` + 48 hex digits (192 random bits), unguessable and never reused."""
    return prefix + secrets.token_hex(24)


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object as kept: whose it is, the model it was made with ("" = none), and its bytes."""

    kind: str
    id: str
    owner: str
    model: str
    data: bytes
    created_at: float


def readable(obj: StoredObject | None, caller: Caller) -> StoredObject | None:
    """`obj` when `caller` may see it (its owner, and a model its allow-list still includes), else None."""
    if obj is None or obj.owner != caller.owner or (obj.model and not caller.allows(obj.model)):
        return None
    return obj


class ObjectStore(Protocol):
    """Owned objects (see the module docstring). Every method is a coroutine and never blocks the event loop."""

    max_entries: int
    max_bytes: int
    ttl_s: float

    async def put(self, obj: StoredObject) -> bool:
        """Keep `obj`; False when it is larger than the whole store or `(kind, id)` is another owner's."""
        ...

    async def get(self, kind: str, owner: str, object_id: str) -> StoredObject | None:
        """`owner`'s object, or None (none, expired, evicted, or another owner's)."""
        ...

    async def delete(self, kind: str, owner: str, object_id: str) -> bool:
        """Forget `owner`'s object; False when there was none of that owner."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class MemoryObjectStore:
    """In this process's memory (`--workers 1`): an insertion-ordered dict, oldest evicted first."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self._items: OrderedDict[tuple[str, str], StoredObject] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, obj: StoredObject) -> bool:
        key = (obj.kind, obj.id)
        old = self._items.get(key)
        if len(obj.data) > self.max_bytes or (old is not None and old.owner != obj.owner):
            return False
        if old is not None:
            self._drop(key)
        self._items[key] = obj
        self.bytes += len(obj.data)
        self._expire(time.time())
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._items)))
        return True

    async def get(self, kind: str, owner: str, object_id: str) -> StoredObject | None:
        obj = self._items.get((kind, object_id))
        if obj is None or obj.owner != owner:
            return None
        if obj.created_at + self.ttl_s <= time.time():
            self._drop((kind, object_id))
            return None
        return obj

    async def delete(self, kind: str, owner: str, object_id: str) -> bool:
        obj = self._items.get((kind, object_id))
        if obj is None or obj.owner != owner:
            return False
        self._drop((kind, object_id))
        return True

    def _drop(self, key: tuple[str, str]) -> None:
        self.bytes -= len(self._items.pop(key).data)

    def _expire(self, now: float) -> None:
        """The oldest objects whose time is up (insertion order is age order)."""
        while self._items:
            key, first = next(iter(self._items.items()))
            if first.created_at + self.ttl_s > now:
                return
            self._drop(key)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

"""Owned objects in Redis or Valkey, shared by every worker of every gateway that uses the same Redis.

Keys (under `oag:o:`): one hash per object, `oag:o:KIND:ID` = {owner, model, created, data}, expiring `ttl_s`
after it was stored (Redis's own TTL); `oag:o:idx`, a sorted set of every object (`KIND:ID`, scored by when
it was stored, Redis's clock) and `oag:o:sz` (its size), from which the bounds are kept: each `put` is one Lua
script (atomic across every gateway) that refuses another owner's id, drops what expired, stores the object,
and evicts the oldest until `max_entries` and `max_bytes` hold (`oag:o:bytes` is the running total). A delete
is one script too, done only when the owner matches. A read is one `HMGET`, its owner compared here.

Every call has the budget `--redis-timeout`; a call that fails or runs past it raises `StoreUnavailableError`
(a 503 for a read; a failed `put` is logged by the caller and the answer still goes out). With several
replicas, give every gateway the same URL; a single Redis or a primary, not Redis Cluster (the scripts name
keys they compute).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from openai_api.stored.base import DEFAULT_TTL_S, StoredObject, StoreUnavailableError

logger = logging.getLogger("openai_api.stored")
ROOT = "oag:o:"

_LIB = r"""
local root = ARGV[1]
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function forget(member)
  local size = tonumber(redis.call('HGET', root .. 'sz', member) or '0')
  redis.call('DEL', root .. member)
  redis.call('HDEL', root .. 'sz', member)
  redis.call('ZREM', root .. 'idx', member)
  if size > 0 then redis.call('DECRBY', root .. 'bytes', size) end
end
"""

# ARGV: root, member (KIND:ID), owner, model, data, max_entries, max_bytes, ttl_s
_PUT = _LIB + r"""
local member, owner, model, data = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local max_entries, max_bytes, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local key = root .. member
local held = redis.call('HGET', key, 'owner')
if held and held ~= owner then return {0, 0} end
local now = now_s()
for _, old in ipairs(redis.call('ZRANGEBYSCORE', root .. 'idx', '-inf', now - ttl)) do forget(old) end
forget(member)
redis.call('HSET', key, 'owner', owner, 'model', model, 'created', tostring(now), 'data', data)
redis.call('PEXPIRE', key, math.ceil(ttl * 1000))
redis.call('ZADD', root .. 'idx', now, member)
redis.call('HSET', root .. 'sz', member, #data)
local total = redis.call('INCRBY', root .. 'bytes', #data)
while redis.call('ZCARD', root .. 'idx') > max_entries or total > max_bytes do
  local oldest = redis.call('ZRANGE', root .. 'idx', 0, 0)[1]
  if not oldest then break end
  forget(oldest)
  total = tonumber(redis.call('GET', root .. 'bytes') or '0')
end
return {redis.call('EXISTS', key), tostring(now)}
"""

# ARGV: root, member, owner
_DELETE = _LIB + r"""
if redis.call('HGET', root .. ARGV[2], 'owner') ~= ARGV[3] then return 0 end
forget(ARGV[2])
return 1
"""


class RedisObjectStore:
    """See the module docstring."""

    def __init__(self, url: str, max_entries: int, max_bytes: int, ttl_s: float = DEFAULT_TTL_S,
                 timeout_s: float = 1.0) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.redis = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                    retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self._put = self.redis.register_script(_PUT)
        self._delete = self.redis.register_script(_DELETE)

    async def _call(self, what: str, call: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call
        except (RedisError, OSError, TimeoutError) as e:
            logger.error("the object store (Redis) failed to %s: %s", what, type(e).__name__)
            raise StoreUnavailableError("The gateway's store of responses (Redis) is unreachable; retry shortly.",
                                        headers={"Retry-After": "1"}) from None

    async def put(self, obj: StoredObject) -> bool:
        if len(obj.data) > self.max_bytes:
            return False
        kept, _ = await self._call("store", self._put(args=[
            ROOT, f"{obj.kind}:{obj.id}", obj.owner, obj.model, obj.data, self.max_entries, self.max_bytes,
            self.ttl_s]))
        return bool(int(kept))

    async def get(self, kind: str, owner: str, object_id: str) -> StoredObject | None:
        found = await self._call("read", self.redis.hmget(f"{ROOT}{kind}:{object_id}", "owner", "model", "created",
                                                          "data"))
        held, model, created, data = found
        if held is None or data is None or held.decode() != owner:
            return None
        return StoredObject(kind, object_id, owner, (model or b"").decode(), bytes(data), float(created or 0))

    async def delete(self, kind: str, owner: str, object_id: str) -> bool:
        gone = await self._call("delete", self._delete(args=[ROOT, f"{kind}:{object_id}", owner]))
        return bool(int(gone))

    async def start(self) -> None:
        return None  # connected on first use: a Redis down at start-up is a 503 on use, not a failed start

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.redis.aclose()

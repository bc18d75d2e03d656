"""The Batch API's state in Redis or Valkey (`--batch-store-url redis://...`), for several gateways: jobs, files'
metadata, leases and per-line answers in Redis, file contents in `--batch-dir` (a volume every gateway mounts).

Why this split: the job state is small and hot and needs atomic claims, leases and "first answer wins" records
across hosts, which Redis does in one round trip each (SQLite's locks over a network file system are not to be
trusted); the files are large, written once and read whole, so they stay out of Redis's memory on a shared volume.

Keys, under `oag:b:`: `job:ID` (the job as JSON), `jobs:OWNER:KIND` and `files:OWNER` (sorted sets by creation),
`file:ID` (a file's metadata as JSON), `fexp` (files by `expires_at`), `active` (a sorted set of unfinished jobs)
and `active:OWNER` (a set: the per-key bound), `pins` (input file -> how many unfinished jobs read it: never
swept while pinned, as `stored.batches` explains; jobs made before the pins existed do not pin theirs),
`lease:ID` (the gateway running it; `SET NX PX`), `res:ID` (line -> answer, `HSETNX`: the first answer stays),
`out:ID` (line -> outcome) and `cnt:ID` (outcome -> lines). Each write that must be atomic is one Lua script.
A single Redis or a primary, not Redis Cluster (the scripts name keys they compute).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from openai_api.stored.base import StoreUnavailableError
from openai_api.stored.batches import ACTIVE, LEASE_S, BatchRecord, BatchStore, Created, FileRecord

logger = logging.getLogger("openai_api.batches")
ROOT = "oag:b:"
TIMEOUT_S = 5.0

# ARGV: root, id, owner, kind, json, created, max_active, input file id ('' = none), now: 1 made (its input pinned),
# 0 the owner's unfinished jobs at max_active, 2 the input file is not the owner's or not live at `now`
_CREATE = r"""
local root, id, owner, input = ARGV[1], ARGV[2], ARGV[3], ARGV[8]
if input ~= '' then
  local raw = redis.call('GET', root .. 'file:' .. input)
  if not raw then return 2 end
  local f = cjson.decode(raw)
  if f.owner ~= owner or (type(f.expires_at) == 'number' and f.expires_at <= tonumber(ARGV[9])) then return 2 end
end
if redis.call('SCARD', root .. 'active:' .. owner) >= tonumber(ARGV[7]) then return 0 end
if input ~= '' then redis.call('HINCRBY', root .. 'pins', input, 1) end
redis.call('SET', root .. 'job:' .. id, ARGV[5])
redis.call('ZADD', root .. 'jobs:' .. owner .. ':' .. ARGV[4], ARGV[6], id)
redis.call('ZADD', root .. 'active', ARGV[6], id)
redis.call('SADD', root .. 'active:' .. owner, id)
return 1
"""

# ARGV: root, id, status ('' = unchanged), fields (JSON object), only_if (JSON list, '' = any), active (JSON list)
_UPDATE = r"""
local root, id = ARGV[1], ARGV[2]
local raw = redis.call('GET', root .. 'job:' .. id)
if not raw then return false end
local rec = cjson.decode(raw)
if ARGV[5] ~= '' then
  local ok = false
  for _, s in ipairs(cjson.decode(ARGV[5])) do if s == rec.status then ok = true end end
  if not ok then return raw end
end
for k, v in pairs(cjson.decode(ARGV[4])) do rec.data[k] = v end
if ARGV[3] ~= '' then rec.status = ARGV[3] end
local active = false
for _, s in ipairs(cjson.decode(ARGV[6])) do if s == rec.status then active = true end end
if not active and redis.call('ZREM', root .. 'active', id) == 1 then  -- the job's end, seen once
  redis.call('SREM', root .. 'active:' .. rec.owner, id)
  local input = rec.data.input_file_id
  if type(input) == 'string' and redis.call('HINCRBY', root .. 'pins', input, -1) <= 0 then
    redis.call('HDEL', root .. 'pins', input)
  end
end
local out = cjson.encode(rec)
redis.call('SET', root .. 'job:' .. id, out)
return out
"""

# ARGV: root, id, input file id: a job that was unfinished and is no more gives back its pin
_END = r"""
local root = ARGV[1]
if redis.call('ZREM', root .. 'active', ARGV[2]) == 1 then
  if redis.call('HINCRBY', root .. 'pins', ARGV[3], -1) <= 0 then redis.call('HDEL', root .. 'pins', ARGV[3]) end
end
return 1
"""

# ARGV: root, now, most: (id, owner) pairs of expired files no unfinished job pins; forgets deleted ones
_EXPIRED = r"""
local root, most = ARGV[1], tonumber(ARGV[3])
local out, gone = {}, {}
local pins = root .. 'pins'
local ids = redis.call('ZRANGEBYSCORE', root .. 'fexp', '-inf', ARGV[2], 'LIMIT', 0, most + redis.call('HLEN', pins))
for _, id in ipairs(ids) do
  if #out >= most * 2 then break end
  if redis.call('HEXISTS', pins, id) == 0 then
    local raw = redis.call('GET', root .. 'file:' .. id)
    if raw then
      table.insert(out, id)
      table.insert(out, cjson.decode(raw).owner)
    else
      table.insert(gone, id)
    end
  end
end
for _, id in ipairs(gone) do redis.call('ZREM', root .. 'fexp', id) end
return out
"""

# ARGV: root, id, now: 1 when the file was still expired at `now` and unpinned, and is now deleted (the caller unlinks
# the bytes); else 0
_SWEEP = r"""
local root, id = ARGV[1], ARGV[2]
local raw = redis.call('GET', root .. 'file:' .. id)
if not raw then
  redis.call('ZREM', root .. 'fexp', id)
  return 0
end
local f = cjson.decode(raw)
if type(f.expires_at) ~= 'number' or f.expires_at > tonumber(ARGV[3]) or
   redis.call('HEXISTS', root .. 'pins', id) == 1 then return 0 end
redis.call('DEL', root .. 'file:' .. id)
redis.call('ZREM', root .. 'files:' .. f.owner, id)
redis.call('ZREM', root .. 'fexp', id)
return 1
"""

# ARGV: root, id, owner, now: 0 no such file of the owner; 1 deleted (the caller unlinks the bytes); 2 pinned by an
# unfinished job, so expired at `now` instead (gone for its owner; swept once the job ends)
_RETIRE = r"""
local root, id = ARGV[1], ARGV[2]
local raw = redis.call('GET', root .. 'file:' .. id)
if not raw then return 0 end
local f = cjson.decode(raw)
if f.owner ~= ARGV[3] then return 0 end
if redis.call('HEXISTS', root .. 'pins', id) == 1 then
  f.expires_at = tonumber(ARGV[4])
  redis.call('SET', root .. 'file:' .. id, cjson.encode(f))
  redis.call('ZADD', root .. 'fexp', ARGV[4], id)
  return 2
end
redis.call('DEL', root .. 'file:' .. id)
redis.call('ZREM', root .. 'files:' .. ARGV[3], id)
redis.call('ZREM', root .. 'fexp', id)
return 1
"""

# ARGV: root, node, lease_ms, most, ids (a JSON list, in the order to try them)
_CLAIM = r"""
local root, node, most = ARGV[1], ARGV[2], tonumber(ARGV[4])
local got = {}
for _, id in ipairs(cjson.decode(ARGV[5])) do
  if #got >= most then break end
  if redis.call('ZSCORE', root .. 'active', id) and
     redis.call('SET', root .. 'lease:' .. id, node, 'NX', 'PX', ARGV[3]) then table.insert(got, id) end
end
return got
"""

# ARGV: root, most
_CANDIDATES = r"""
local root, out = ARGV[1], {}
for _, id in ipairs(redis.call('ZRANGE', root .. 'active', 0, -1)) do
  if #out >= tonumber(ARGV[2]) * 2 then break end
  if redis.call('EXISTS', root .. 'lease:' .. id) == 0 then
    local raw = redis.call('GET', root .. 'job:' .. id)
    if raw then
      table.insert(out, id)
      table.insert(out, cjson.decode(raw).owner)
    end
  end
end
return out
"""

# ARGV: root, id, node, lease_ms
_RENEW = r"""
local root, id = ARGV[1], ARGV[2]
if redis.call('GET', root .. 'lease:' .. id) ~= ARGV[3] then return false end
redis.call('PEXPIRE', root .. 'lease:' .. id, ARGV[4])
local raw = redis.call('GET', root .. 'job:' .. id)
if not raw then return false end
return cjson.decode(raw).status
"""

# ARGV: root, id, node
_RELEASE = r"""
local key = ARGV[1] .. 'lease:' .. ARGV[2]
if redis.call('GET', key) == ARGV[3] then redis.call('DEL', key) end
return 1
"""

# ARGV: root, id, idx, outcome, line
_RECORD = r"""
local root, id = ARGV[1], ARGV[2]
if redis.call('HSETNX', root .. 'res:' .. id, ARGV[3], ARGV[5]) == 0 then return 0 end
redis.call('HSET', root .. 'out:' .. id, ARGV[3], ARGV[4])
redis.call('HINCRBY', root .. 'cnt:' .. id, ARGV[4], 1)
return 1
"""


def _text(value: Any) -> str:
    """A Lua script's string reply, as bytes or str depending on the client's decode_responses."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Any) -> list[tuple[str, str]]:
    """A script's flat reply `a1, b1, a2, b2, ...` as `[(a1, b1), ...]` (Lua returns no nested tables here)."""
    items = [_text(x) for x in flat]
    return list(zip(items[::2], items[1::2], strict=True))


T = TypeVar("T")


async def _whole(aw: Awaitable[T]) -> T:
    """`aw` run to its end even when the caller is cancelled meanwhile: a file's record leaves Redis first and its
    bytes leave the disk after, so a cancel in between (the runner's close() cancels its sweep) would leave bytes
    that nothing would ever look for again. Run as a task of its own, shielded; a cancelled caller waits for it (a
    Redis call and a syscall) and then re-raises the cancel."""
    task = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


class RedisBatchStore(BatchStore):
    """See the module docstring: `BatchStore`'s interface over Redis, file contents in `folder`."""

    def __init__(self, url: str, folder: Path) -> None:
        super().__init__(folder)
        self.url = url
        self.redis = Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)

    async def _call(self, script: str, *args: Any) -> Any:
        try:
            return await self.redis.eval(script, 0, ROOT, *args)
        except (RedisError, OSError) as e:
            raise self._down(e) from None

    def _down(self, e: BaseException) -> StoreUnavailableError:
        logger.error("the batch store %s failed: %s", self.url, e)
        return StoreUnavailableError("The gateway's batch store is unavailable; retry shortly.",
                                     headers={"Retry-After": "1"})

    async def _get(self, key: str) -> bytes | None:
        try:
            found: Any = await self.redis.get(ROOT + key)
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        return bytes(found) if found is not None else None

    # --- files: metadata here, contents in the folder ----------------------------------------------------------
    def _write(self, file_id: str, content: bytes) -> None:
        self.files_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.files_dir / f".{file_id}.tmp"
        tmp.write_bytes(content)
        os.replace(tmp, self.path(file_id))

    async def put_file(self, rec: FileRecord, content: bytes) -> None:
        try:
            await asyncio.to_thread(self._write, rec.id, content)
        except OSError as e:
            raise self._down(e) from None
        try:
            async with self.redis.pipeline(transaction=True) as p:
                p.set(ROOT + "file:" + rec.id, json.dumps(_file(rec)))
                p.zadd(ROOT + "files:" + rec.owner, {rec.id: time.time()})
                if rec.expires_at is not None:
                    p.zadd(ROOT + "fexp", {rec.id: rec.expires_at})
                await p.execute()
        except (RedisError, OSError) as e:
            raise self._down(e) from None

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        raw = await self._get("file:" + file_id)
        if raw is None:
            return None
        rec = FileRecord(**json.loads(raw))
        return rec if rec.owner == owner else None

    async def list_files(self, owner: str, purpose: str | None, limit: int) -> list[FileRecord]:
        try:
            ids: Any = await self.redis.zrevrange(ROOT + "files:" + owner, 0, 10_000)
            raws = await self.redis.mget([ROOT + "file:" + i.decode() for i in ids]) if ids else []
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        recs = [FileRecord(**json.loads(r)) for r in raws if r is not None]
        return [r for r in recs if purpose is None or r.purpose == purpose][:limit]

    async def delete_file(self, owner: str, file_id: str) -> bool:
        return await _whole(self._deleted(owner, file_id))

    async def _deleted(self, owner: str, file_id: str) -> bool:
        if await self.get_file(owner, file_id) is None:
            return False
        try:
            await self.redis.delete(ROOT + "file:" + file_id)
            await self.redis.zrem(ROOT + "files:" + owner, file_id)
            await self.redis.zrem(ROOT + "fexp", file_id)
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        await asyncio.to_thread(self.path(file_id).unlink, True)
        return True

    async def retire_file(self, owner: str, file_id: str, now: int) -> bool:
        return await _whole(self._retired(owner, file_id, now))

    async def _retired(self, owner: str, file_id: str, now: int) -> bool:
        done = await self._call(_RETIRE, file_id, owner, now)
        if done == 1:
            await asyncio.to_thread(self.path(file_id).unlink, True)
        return bool(done)

    async def expired_files(self, now: int, most: int) -> list[tuple[str, str]]:
        return _pairs(await self._call(_EXPIRED, now, most))

    async def sweep_file(self, owner: str, file_id: str, now: int) -> bool:
        return await _whole(self._swept(file_id, now))

    async def _swept(self, file_id: str, now: int) -> bool:
        gone = await self._call(_SWEEP, file_id, now)
        if gone == 1:
            await asyncio.to_thread(self.path(file_id).unlink, True)
        return bool(gone)

    async def read(self, file_id: str) -> bytes:
        try:
            return await asyncio.to_thread(self.path(file_id).read_bytes)
        except OSError as e:
            raise self._down(e) from None

    # --- jobs ------------------------------------------------------------------------------------------------
    @staticmethod
    def _job(raw: bytes | str) -> BatchRecord:
        d = json.loads(raw)
        data = d["data"]
        if data.get("metadata") == []:  # Lua's cjson writes an empty object as []
            data["metadata"] = {}
        return BatchRecord(d["id"], d["owner"], d["kind"], d["status"], int(d["created_at"]), data)

    async def create_batch(self, rec: BatchRecord, max_active: int, now: float) -> Created:
        doc = json.dumps({"id": rec.id, "owner": rec.owner, "kind": rec.kind, "status": rec.status,
                          "created_at": rec.created_at, "data": rec.data})
        made = await self._call(_CREATE, rec.id, rec.owner, rec.kind, doc, rec.created_at, max_active,
                                str(rec.data.get("input_file_id", "")), repr(float(now)))
        return "created" if made == 1 else "no_file" if made == 2 else "too_many"

    async def get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        raw = await self._get("job:" + batch_id)
        if raw is None:
            return None
        rec = self._job(raw)
        return rec if owner is None or rec.owner == owner else None

    async def list_batches(self, owner: str, kind: str, limit: int) -> list[BatchRecord]:
        try:
            ids: Any = await self.redis.zrevrange(f"{ROOT}jobs:{owner}:{kind}", 0, limit - 1)
            raws = await self.redis.mget([ROOT + "job:" + i.decode() for i in ids]) if ids else []
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        return [self._job(r) for r in raws if r is not None]

    async def update(self, batch_id: str, status: str | None = None, fields: dict[str, Any] | None = None,
                     only_if: tuple[str, ...] | None = None) -> BatchRecord | None:
        raw = await self._call(_UPDATE, batch_id, status or "", json.dumps(fields or {}),
                               json.dumps(list(only_if)) if only_if is not None else "", json.dumps(list(ACTIVE)))
        return None if raw is None else self._job(raw)

    async def delete_batch(self, owner: str, batch_id: str) -> bool:
        rec = await self.get_batch(owner, batch_id)
        if rec is None:
            return False
        await self._call(_END, batch_id, str(rec.data.get("input_file_id", "")))
        try:
            await self.redis.delete(*(ROOT + k + batch_id for k in ("job:", "res:", "out:", "cnt:", "lease:")))
            await self.redis.zrem(f"{ROOT}jobs:{owner}:{rec.kind}", batch_id)
            await self.redis.srem(ROOT + "active:" + owner, batch_id)
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        return True

    async def candidates(self, most: int) -> list[tuple[str, str]]:
        return _pairs(await self._call(_CANDIDATES, most))

    async def claim(self, node: str, ids: list[str], most: int) -> list[str]:
        if not ids:
            return []
        got = await self._call(_CLAIM, node, int(LEASE_S * 1000), most, json.dumps(ids))
        return [_text(i) for i in got]

    async def renew(self, batch_id: str, node: str) -> str | None:
        status = await self._call(_RENEW, batch_id, node, int(LEASE_S * 1000))
        return None if status is None else _text(status)

    async def release(self, batch_id: str, node: str) -> None:
        await self._call(_RELEASE, batch_id, node)

    async def record(self, batch_id: str, idx: int, outcome: int, line: str) -> bool:
        return bool(await self._call(_RECORD, batch_id, idx, outcome, line))

    async def done(self, batch_id: str) -> set[int]:
        try:
            return {int(k) for k in await self.redis.hkeys(ROOT + "res:" + batch_id)}
        except (RedisError, OSError) as e:
            raise self._down(e) from None

    async def counts(self, batch_id: str) -> dict[int, int]:
        try:
            got = await self.redis.hgetall(ROOT + "cnt:" + batch_id)
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        return {int(k): int(v) for k, v in got.items()}

    async def results(self, batch_id: str, outcomes: tuple[int, ...] | None = None) -> list[str]:
        try:
            lines: Any = await self.redis.hgetall(ROOT + "res:" + batch_id)
            got = await self.redis.hgetall(ROOT + "out:" + batch_id) if outcomes is not None else {}
        except (RedisError, OSError) as e:
            raise self._down(e) from None
        keep = sorted(int(k) for k in lines if outcomes is None or int(got.get(k, -1)) in outcomes)
        return [lines[str(i).encode()].decode() for i in keep]

    def exists(self) -> bool:
        return True

    async def close(self) -> None:
        await self.redis.aclose()
        await super().close()


def _file(rec: FileRecord) -> dict[str, Any]:
    return {"id": rec.id, "owner": rec.owner, "purpose": rec.purpose, "filename": rec.filename, "bytes": rec.bytes,
            "lines": rec.lines, "created_at": rec.created_at, "expires_at": rec.expires_at}

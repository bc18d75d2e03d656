"""The keys' counters in Redis or Valkey (`--redis-url`), shared by every worker of every gateway replica
that uses the same Redis.

Each operation of `store` (begin, reserve, finish, usage) is one Lua script, so it is atomic across every
client: no two gateways can both take the last request of a window. The scripts read Redis's own clock
(`TIME`), so every replica cuts the same buckets whatever its own clock says, and day and month budgets
turn over at the same instant for all (UTC). Keys, per key name (`oag:k:NAME:`): `req` and `tok` (hashes
bucket -> count, expiring two windows after their last write), `conc` (hash gateway instance -> requests in
flight; an instance's count is dropped once its liveness key `oag:i:INSTANCE`, refreshed every 5 s, has
expired, so a gateway that died gives its slots back within 15 s), `day:N` and `mon:N` (tokens used,
kept two days / 62 days: budgets survive gateway restarts). A single Redis, or a primary with replicas;
not Redis Cluster (the scripts name keys they compute).

**Redis gone.** Every call has a budget (`--redis-timeout`, 1 s) and no retries. A call that cannot
connect, or whose connection breaks, marks Redis down for a second at once (calls in that second do not
wait on it), then the next call tries again. A call that only ran past its budget fails alone (its request
is served locally or refused as below), and Redis is marked down after `SLOW_CALLS_DOWN` such calls in a row:
a budget counts the event loop's own delays too, so one late answer on a saturated host (or during
Redis's own AOF fsync) says little, while a hung Redis fails every call. Meanwhile
`--redis-fail-mode open` serves and counts in this process (one log line per outage; the counts made
locally are not copied to Redis afterwards) and `closed` answers 503 to keys with limits. Slots and
settlements that could not reach Redis are kept and sent once it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from openai_api.quota.store import Decision, Limits, MemoryStore, QuotaStoreUnavailableError

logger = logging.getLogger("openai_api.keys")

TIMEOUT_S = 1.0
DOWN_FOR_S = 1.0
SLOW_CALLS_DOWN = 3
HEARTBEAT_S = 5.0
INSTANCE_TTL_S = 15
ROOT = "oag:"

_LIB = r"""
local BUCKETS = 60
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function window(key, current)
  local flat = redis.call('HGETALL', key)
  local sum, items, oldest = 0, {}, current - BUCKETS + 1
  for i = 1, #flat, 2 do
    local b, v = tonumber(flat[i]), tonumber(flat[i + 1])
    if b < oldest then redis.call('HDEL', key, flat[i])
    else sum = sum + v; items[#items + 1] = {b, v} end
  end
  table.sort(items, function(x, y) return x[1] < y[1] end)
  return sum, items
end
local function retry_after(items, used, cost, limit, width, now)
  local need, freed = used + cost - limit, 0
  for _, it in ipairs(items) do
    freed = freed + it[2]
    if freed >= need then return math.max((it[1] + BUCKETS) * width - now, 0.001) end
  end
  return width * BUCKETS
end
local function reset(items, width, now)
  for i = #items, 1, -1 do
    if items[i][2] > 0 then return math.max((items[i][1] + BUCKETS) * width - now, 0) end
  end
  return 0
end
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m > 2) and (m - 3) or (m + 9)
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function civil(now)
  local z = math.floor(now / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  if m <= 2 then y = y + 1 end
  return y, m
end
local function periods(now)
  local y, m = civil(now)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  local day = math.floor(now / 86400)
  return day, y * 12 + m - 1, (day + 1) * 86400 - now, days_from_civil(ny, nm, 1) * 86400 - now
end
local function ms(x) return math.floor(x * 1000 + 0.5) end
local function concurrent(key, inst, root)
  local flat = redis.call('HGETALL', key)
  local sum = 0
  for i = 1, #flat, 2 do
    if flat[i] ~= inst and redis.call('EXISTS', root .. 'i:' .. flat[i]) == 0 then
      redis.call('HDEL', key, flat[i])
    else sum = sum + tonumber(flat[i + 1]) end
  end
  return sum
end
"""

# ARGV: prefix, requests, tokens, concurrent, day, month, window_s, instance, root
_BEGIN = _LIB + r"""
local p = ARGV[1]
local rl, tl, cl, dl, ml = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local w, inst, root = tonumber(ARGV[7]), ARGV[8], ARGV[9]
local now = now_s()
local width = w / BUCKETS
local cur = math.floor(now / width)
local day, mon, to_day, to_mon = periods(now)
local dused = tonumber(redis.call('GET', p .. 'day:' .. day) or '0')
local mused = tonumber(redis.call('GET', p .. 'mon:' .. mon) or '0')
local rsum, ritems = window(p .. 'req', cur)
local tsum, titems = window(p .. 'tok', cur)
local reason, retry = '', 0
if dl >= 0 and dused >= dl then reason, retry = 'day', to_day
elseif ml >= 0 and mused >= ml then reason, retry = 'month', to_mon
elseif cl >= 0 and concurrent(p .. 'conc', inst, root) >= cl then reason, retry = 'concurrent', 1
elseif rl >= 0 and rsum + 1 > rl then reason, retry = 'requests', retry_after(ritems, rsum, 1, rl, width, now)
end
local rreset = reset(ritems, width, now)
if reason == '' then
  if rl >= 0 then
    redis.call('HINCRBY', p .. 'req', cur, 1)
    redis.call('PEXPIRE', p .. 'req', math.ceil(w * 2000))
    rsum = rsum + 1
    rreset = (cur + BUCKETS) * width - now
  end
  redis.call('HINCRBY', p .. 'conc', inst, 1)
  redis.call('EXPIRE', p .. 'conc', 86400)
end
local rrem, trem = -1, -1
if rl >= 0 then rrem = math.max(rl - rsum, 0) end
if tl >= 0 then trem = math.max(tl - tsum, 0) end
return {reason == '' and 1 or 0, reason, ms(retry), rrem, ms(rreset), trem, ms(reset(titems, width, now))}
"""

# ARGV: prefix, requests, tokens, concurrent, day, month, window_s, tokens to reserve
_RESERVE = _LIB + r"""
local p = ARGV[1]
local tl, dl, ml = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])
local w, n = tonumber(ARGV[7]), tonumber(ARGV[8])
local now = now_s()
local width = w / BUCKETS
local cur = math.floor(now / width)
local day, mon, to_day, to_mon = periods(now)
local dkey, mkey = p .. 'day:' .. day, p .. 'mon:' .. mon
local dused = tonumber(redis.call('GET', dkey) or '0')
local mused = tonumber(redis.call('GET', mkey) or '0')
local tsum, titems = window(p .. 'tok', cur)
local reason, retry = '', 0
if dl >= 0 and dused + n > dl then reason, retry = 'day', to_day
elseif ml >= 0 and mused + n > ml then reason, retry = 'month', to_mon
elseif tl >= 0 and n > tl then reason = 'too_large'
elseif tl >= 0 and tsum + n > tl then reason, retry = 'tokens', retry_after(titems, tsum, n, tl, width, now)
end
local treset = reset(titems, width, now)
if reason == '' then
  if tl >= 0 then
    redis.call('HINCRBY', p .. 'tok', cur, n)
    redis.call('PEXPIRE', p .. 'tok', math.ceil(w * 2000))
    tsum = tsum + n
    treset = (cur + BUCKETS) * width - now
  end
  redis.call('INCRBY', dkey, n)
  redis.call('EXPIRE', dkey, 172800)
  redis.call('INCRBY', mkey, n)
  redis.call('EXPIRE', mkey, 5356800)
end
local trem = -1
if tl >= 0 then trem = math.max(tl - tsum, 0) end
return {reason == '' and 1 or 0, reason, ms(retry), -1, 0, trem, ms(treset), cur, day, mon}
"""

# ARGV: prefix, instance, release (0|1), then (bucket, day, month, delta) per reservation
_FINISH = r"""
local p, inst = ARGV[1], ARGV[2]
if ARGV[3] == '1' then
  local left = redis.call('HINCRBY', p .. 'conc', inst, -1)
  if left <= 0 then redis.call('HDEL', p .. 'conc', inst) end
end
for i = 4, #ARGV, 4 do
  local b, d, m, delta = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  if delta ~= 0 then
    if redis.call('HEXISTS', p .. 'tok', b) == 1 then
      if redis.call('HINCRBY', p .. 'tok', b, delta) < 0 then redis.call('HSET', p .. 'tok', b, 0) end
    end
    for _, k in ipairs({p .. 'day:' .. d, p .. 'mon:' .. m}) do
      if redis.call('EXISTS', k) == 1 then
        if redis.call('INCRBY', k, delta) < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
      end
    end
  end
end
return 1
"""

# ARGV: prefix, window_s, root
_USAGE = _LIB + r"""
local p, w, root = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now = now_s()
local cur = math.floor(now / (w / BUCKETS))
local day, mon = periods(now)
local rsum = window(p .. 'req', cur)
local tsum = window(p .. 'tok', cur)
return {rsum, tsum, concurrent(p .. 'conc', '', root), tonumber(redis.call('GET', p .. 'day:' .. day) or '0'),
        tonumber(redis.call('GET', p .. 'mon:' .. mon) or '0')}
"""


class RedisDown(Exception):
    pass


def _decision(raw: list[Any], local: bool = False) -> Decision:
    def s(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    rrem, trem = int(raw[3]), int(raw[5])
    d = Decision(bool(int(raw[0])), s(raw[1]), int(raw[2]) / 1000, None if rrem < 0 else rrem, int(raw[4]) / 1000,
                 None if trem < 0 else trem, int(raw[6]) / 1000, local=local)
    if len(raw) > 7 and d.ok:
        d.grant = [int(raw[7]), int(raw[8]), int(raw[9])]
    return d


class RedisStore:
    """See the module docstring."""

    def __init__(self, url: str, fail_mode: str = "open", *, timeout_s: float = TIMEOUT_S) -> None:
        self.redis = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                    retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self._slow_calls = 0  # calls in a row that ran past their budget
        self.fail_mode = fail_mode
        self.timeout_s = timeout_s
        self.instance = uuid.uuid4().hex
        self.local = MemoryStore()
        self._begin = self.redis.register_script(_BEGIN)
        self._reserve = self.redis.register_script(_RESERVE)
        self._finish = self.redis.register_script(_FINISH)
        self._usage = self.redis.register_script(_USAGE)
        self._down_until = 0.0
        self._outage = False
        self._unsent: list[tuple[str, list[Any]]] = []  # finishes that could not reach Redis
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def prefix(name: str) -> str:
        return f"{ROOT}k:{name}:"

    async def _call(self, script: Any, args: list[Any]) -> Any:
        if time.monotonic() < self._down_until:
            raise RedisDown
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await script(args=args)
        except (RedisError, OSError, TimeoutError) as e:
            if isinstance(e, TimeoutError | RedisTimeoutError):
                self._slow_calls += 1
                if self._slow_calls < SLOW_CALLS_DOWN:
                    raise RedisDown from None  # this call alone (see the module docstring)
            self._down_until = time.monotonic() + DOWN_FOR_S
            if not self._outage:
                self._outage = True
                mode = "serving and counting in this process" if self.fail_mode == "open" else "answering 503"
                logger.error("Redis unreachable (%s): %s until it answers (--redis-fail-mode %s)",
                             type(e).__name__, mode, self.fail_mode)
            raise RedisDown from None
        self._slow_calls = 0
        if self._outage:
            self._outage = False
            logger.warning("Redis answers again: the keys' counters are shared again")
        return result

    def _unavailable(self) -> Exception:
        return QuotaStoreUnavailableError("The quota store (Redis) is unreachable; retry shortly.",
                                          headers={"Retry-After": "1"})

    async def begin(self, name: str, limits: Limits) -> Decision:
        try:
            raw = await self._call(self._begin, [self.prefix(name), *limits.args(), self.instance, ROOT])
        except RedisDown:
            if self.fail_mode == "closed":
                raise self._unavailable() from None
            d = await self.local.begin(name, limits)
            d.local = True
            return d
        return _decision(raw)

    async def reserve(self, name: str, limits: Limits, tokens: int) -> Decision:
        try:
            raw = await self._call(self._reserve, [self.prefix(name), *limits.args(), tokens])
        except RedisDown:
            if self.fail_mode == "closed":
                raise self._unavailable() from None
            d = await self.local.reserve(name, limits, tokens)
            d.local = True
            return d
        return _decision(raw)

    async def finish(self, name: str, limits: Limits, adjustments: list[tuple[list[Any], int]],
                     release: bool, local: bool = False) -> None:
        if local:  # begun (or reserved) while Redis was down: settled where it was counted
            await self.local.finish(name, limits, adjustments, release)
            return
        args: list[Any] = [self.prefix(name), self.instance, "1" if release else "0"]
        for grant, delta in adjustments:
            if len(grant) == 3 and delta:
                args += [*grant, delta]
        try:
            await self._call(self._finish, args)
        except RedisDown:
            if len(self._unsent) < 100_000:
                self._unsent.append((name, args))

    async def usage(self, name: str, limits: Limits) -> dict[str, Any]:
        try:
            raw = await self._call(self._usage, [self.prefix(name), limits.window_s, ROOT])
        except RedisDown:
            return {**await self.local.usage(name, limits), "store": "local (Redis unreachable)"}
        keys = ("requests_in_window", "tokens_in_window", "concurrent", "tokens_today", "tokens_this_month")
        return dict(zip(keys, (int(v) for v in raw), strict=True))

    async def _heartbeat(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.redis.set(f"{ROOT}i:{self.instance}", 1, ex=INSTANCE_TTL_S)
                while self._unsent:
                    _, args = self._unsent[0]
                    await self._call(self._finish, args)
                    self._unsent.pop(0)
            except (RedisError, OSError, TimeoutError, RedisDown):
                pass
            await asyncio.sleep(HEARTBEAT_S)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._heartbeat(), name="redis-heartbeat")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                await self.redis.delete(f"{ROOT}i:{self.instance}")
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await self.redis.aclose()

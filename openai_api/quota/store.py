"""The counters, and the one algorithm every store applies (in memory here, in Lua on Redis).

**Windows.** A rate window of W seconds (`window_seconds`, 60 by default) is cut into `BUCKETS` (60)
buckets of W/60 s, numbered from the Unix epoch (`floor(t / (W/60))`), so every process and every replica
cuts the same buckets from the same clock (on Redis, Redis's own clock) and windows never drift. What a
key used "in the window" is the sum of its last 60 buckets, the current one included: a limit holds over
every W-second span that starts on a bucket edge, with no double burst at a window edge as fixed windows
allow. A refusal's Retry-After is when enough of the oldest buckets leave the window for the request to
fit; `reset` is when the window is empty again (what OpenAI's `x-ratelimit-reset-*` say).

**Operations**, each atomic (one call of the memory core, one Lua script):
- `begin`: a request arrives. Refused when a budget (day, month) is spent (insufficient_quota), when the
  key has `max_concurrent` requests in flight, or when one more request would pass `requests_per_minute`;
  otherwise counts the request and takes a concurrency slot.
- `reserve`: tokens about to be sent to Triton (prompt + max_tokens). Refused when they would pass the
  window's token limit or a budget; otherwise added to the current bucket and to the budgets.
- `finish`: the request is over: its slot is given back and each reservation is corrected by the
  difference between what was reserved and what was used, in the bucket and the budget periods it was
  taken from (a bucket already out of the window is left alone: it no longer counts).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from openai_api.errors import BackendUnavailableError
from openai_api.quota.caller import Policy

BUCKETS = 60


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits as the stores apply them: rates per window (the per-minute figures scaled)."""

    requests: int | None
    tokens: int | None
    concurrent: int | None
    day: int | None
    month: int | None
    window_s: float

    @classmethod
    def of(cls, policy: Policy, window_s: float) -> Limits:
        def scaled(per_minute: int | None) -> int | None:
            return None if per_minute is None else max(1, round(per_minute * window_s / 60.0))

        return cls(scaled(policy.requests_per_minute), scaled(policy.tokens_per_minute), policy.max_concurrent,
                   policy.tokens_per_day, policy.tokens_per_month, window_s)

    def args(self) -> list[Any]:
        """As the stores' scripts take them (-1 = no limit)."""
        return [-1 if v is None else v for v in (self.requests, self.tokens, self.concurrent, self.day, self.month)] \
            + [self.window_s]

    @classmethod
    def from_args(cls, a: list[Any]) -> Limits:
        r, t, c, d, m = (None if v < 0 else int(v) for v in a[:5])
        return cls(r, t, c, d, m, float(a[5]))


@dataclass(slots=True)
class Decision:
    """The answer of `begin` / `reserve`. `reason` when refused: requests | tokens | concurrent | day | month
    | too_large. The rest feeds the response's x-ratelimit-* headers (None: no such limit)."""

    ok: bool
    reason: str = ""
    retry_after_s: float = 0.0
    requests_remaining: int | None = None
    requests_reset_s: float = 0.0
    tokens_remaining: int | None = None
    tokens_reset_s: float = 0.0
    grant: list[Any] = field(default_factory=list)  # reserve: [bucket, day id, month id]
    local: bool = False  # granted by the local fallback while the shared store was unreachable

    def to_list(self) -> list[Any]:
        return [int(self.ok), self.reason, self.retry_after_s, self.requests_remaining, self.requests_reset_s,
                self.tokens_remaining, self.tokens_reset_s, self.grant]

    @classmethod
    def from_list(cls, a: list[Any]) -> Decision:
        return cls(bool(a[0]), str(a[1]), float(a[2]), a[3], float(a[4]), a[5], float(a[6]), list(a[7] or []))


class QuotaStoreUnavailableError(BackendUnavailableError):
    """The shared counters cannot be reached (Redis down, with `fail_mode` closed): a 503 to the caller."""

    default_code = "quota_store_unavailable"


def day_id(now: float) -> int:
    return int(now // 86400)


def month_id(now: float) -> int:
    d = dt.datetime.fromtimestamp(now, dt.UTC)
    return d.year * 12 + d.month - 1


def seconds_to_next_day(now: float) -> float:
    return (day_id(now) + 1) * 86400 - now


def seconds_to_next_month(now: float) -> float:
    m = month_id(now) + 1
    start = dt.datetime(m // 12, m % 12 + 1, 1, tzinfo=dt.UTC).timestamp()
    return start - now


class Store(Protocol):
    """Where the counters live: this process (`MemoryStore`), the supervisor (`shared.SharedStore`), Redis
    (`redis.RedisStore`)."""

    async def begin(self, name: str, limits: Limits) -> Decision: ...

    async def reserve(self, name: str, limits: Limits, tokens: int) -> Decision: ...

    async def finish(self, name: str, limits: Limits, adjustments: list[tuple[list[Any], int]],
                     release: bool, local: bool = False) -> None: ...

    async def usage(self, name: str, limits: Limits) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Counters:
    requests: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    concurrent: dict[str, int] = field(default_factory=dict)  # holder (a process, a connection) -> slots
    day: tuple[int, int] = (0, 0)  # (day id, tokens used)
    month: tuple[int, int] = (0, 0)


def _window(buckets: dict[int, int], current: int) -> int:
    oldest = current - BUCKETS + 1
    for b in [b for b in buckets if b < oldest]:
        del buckets[b]
    return sum(buckets.values())


def _retry_after(buckets: dict[int, int], current: int, used: int, cost: int, limit: int, width: float,
                 now: float) -> float:
    """Seconds until `cost` more fits: the oldest buckets leave the window one by one."""
    need = used + cost - limit
    freed = 0
    for b in sorted(buckets):
        freed += buckets[b]
        if freed >= need:
            return max((b + BUCKETS) * width - now, 0.001)
    return width * BUCKETS  # cannot happen while cost <= limit


def _reset(buckets: dict[int, int], width: float, now: float) -> float:
    newest = max((b for b, v in buckets.items() if v > 0), default=None)
    return 0.0 if newest is None else max((newest + BUCKETS) * width - now, 0.0)


class MemoryCore:
    """The algorithm over counters in this process's memory; synchronous and not thread-safe (one event
    loop or one server thread calls it). `holder` names who holds concurrency slots, so the supervisor's
    copy can give back a dead worker's."""

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self.keys: dict[str, _Counters] = {}

    def _state(self, c: _Counters, lim: Limits, now: float, current: int, width: float) -> Decision:
        d = Decision(True)
        if lim.requests is not None:
            d.requests_remaining = max(lim.requests - _window(c.requests, current), 0)
            d.requests_reset_s = _reset(c.requests, width, now)
        if lim.tokens is not None:
            d.tokens_remaining = max(lim.tokens - _window(c.tokens, current), 0)
            d.tokens_reset_s = _reset(c.tokens, width, now)
        return d

    def _budgets(self, c: _Counters, now: float) -> tuple[int, int]:
        did, mid = day_id(now), month_id(now)
        if c.day[0] != did:
            c.day = (did, 0)
        if c.month[0] != mid:
            c.month = (mid, 0)
        return c.day[1], c.month[1]

    def begin(self, name: str, lim: Limits, holder: str = "") -> Decision:
        now = self.clock()
        width = lim.window_s / BUCKETS
        current = math.floor(now / width)
        c = self.keys.setdefault(name, _Counters())
        day_used, month_used = self._budgets(c, now)
        d = self._state(c, lim, now, current, width)
        if lim.day is not None and day_used >= lim.day:
            d.ok, d.reason, d.retry_after_s = False, "day", seconds_to_next_day(now)
        elif lim.month is not None and month_used >= lim.month:
            d.ok, d.reason, d.retry_after_s = False, "month", seconds_to_next_month(now)
        elif lim.concurrent is not None and sum(c.concurrent.values()) >= lim.concurrent:
            d.ok, d.reason, d.retry_after_s = False, "concurrent", 1.0
        elif lim.requests is not None and d.requests_remaining is not None and d.requests_remaining < 1:
            used = lim.requests - d.requests_remaining
            d.ok, d.reason = False, "requests"
            d.retry_after_s = _retry_after(c.requests, current, used, 1, lim.requests, width, now)
        if not d.ok:
            return d
        if lim.requests is not None:
            c.requests[current] = c.requests.get(current, 0) + 1
            d.requests_remaining = (d.requests_remaining or 1) - 1
            d.requests_reset_s = (current + BUCKETS) * width - now
        c.concurrent[holder] = c.concurrent.get(holder, 0) + 1
        return d

    def reserve(self, name: str, lim: Limits, tokens: int) -> Decision:
        now = self.clock()
        width = lim.window_s / BUCKETS
        current = math.floor(now / width)
        c = self.keys.setdefault(name, _Counters())
        day_used, month_used = self._budgets(c, now)
        d = self._state(c, lim, now, current, width)
        if lim.day is not None and day_used + tokens > lim.day:
            d.ok, d.reason, d.retry_after_s = False, "day", seconds_to_next_day(now)
        elif lim.month is not None and month_used + tokens > lim.month:
            d.ok, d.reason, d.retry_after_s = False, "month", seconds_to_next_month(now)
        elif lim.tokens is not None and tokens > lim.tokens:
            d.ok, d.reason = False, "too_large"
        elif lim.tokens is not None and d.tokens_remaining is not None and tokens > d.tokens_remaining:
            used = lim.tokens - d.tokens_remaining
            d.ok, d.reason = False, "tokens"
            d.retry_after_s = _retry_after(c.tokens, current, used, tokens, lim.tokens, width, now)
        if not d.ok:
            return d
        if lim.tokens is not None:
            c.tokens[current] = c.tokens.get(current, 0) + tokens
            d.tokens_remaining = (d.tokens_remaining or 0) - tokens
            d.tokens_reset_s = (current + BUCKETS) * width - now
        c.day = (c.day[0], c.day[1] + tokens)
        c.month = (c.month[0], c.month[1] + tokens)
        d.grant = [current, c.day[0], c.month[0]]
        return d

    def finish(self, name: str, adjustments: list[tuple[list[Any], int]], release: bool, holder: str = "") -> None:
        c = self.keys.get(name)
        if c is None:
            return
        for grant, delta in adjustments:
            if not delta or len(grant) != 3:
                continue
            bucket, did, mid = (int(x) for x in grant)
            if bucket in c.tokens:
                c.tokens[bucket] = max(c.tokens[bucket] + delta, 0)
            if c.day[0] == did:
                c.day = (did, max(c.day[1] + delta, 0))
            if c.month[0] == mid:
                c.month = (mid, max(c.month[1] + delta, 0))
        if release and c.concurrent.get(holder, 0) > 0:
            c.concurrent[holder] -= 1
            if not c.concurrent[holder]:
                del c.concurrent[holder]

    def drop_holder(self, holder: str) -> None:
        """Every slot `holder` held is given back (a worker that died mid-request)."""
        for c in self.keys.values():
            c.concurrent.pop(holder, None)

    def usage(self, name: str, lim: Limits) -> dict[str, Any]:
        now = self.clock()
        width = lim.window_s / BUCKETS
        current = math.floor(now / width)
        c = self.keys.setdefault(name, _Counters())
        day_used, month_used = self._budgets(c, now)
        return {"requests_in_window": _window(c.requests, current), "tokens_in_window": _window(c.tokens, current),
                "concurrent": sum(c.concurrent.values()), "tokens_today": day_used, "tokens_this_month": month_used}


class MemoryStore:
    """The counters of one process (`--workers 1`, no `--redis-url`)."""

    def __init__(self, core: MemoryCore | None = None) -> None:
        self.core = core or MemoryCore()

    async def begin(self, name: str, limits: Limits) -> Decision:
        return self.core.begin(name, limits)

    async def reserve(self, name: str, limits: Limits, tokens: int) -> Decision:
        return self.core.reserve(name, limits, tokens)

    async def finish(self, name: str, limits: Limits, adjustments: list[tuple[list[Any], int]],
                     release: bool, local: bool = False) -> None:
        self.core.finish(name, adjustments, release)

    async def usage(self, name: str, limits: Limits) -> dict[str, Any]:
        return self.core.usage(name, limits)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

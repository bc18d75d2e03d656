"""The per-key policies of one gateway process: who a key is, what it may do now, and what it used.

`QuotaService` holds the key table (reloaded from `--keys-file` when the file's mtime changes, and on SIGHUP,
whose handler `openai_api.process` owns; a bad file is refused with one log line and the old table stays), the
store of counters (this process, the supervisor's with `--workers`, or Redis with `--redis-url`), and the per-key
metrics. Counters are keyed by key name, so a reload keeps them for every key that stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from prometheus_client import Counter

from openai_api.errors import GatewayError
from openai_api.observability import Metrics
from openai_api.quota.caller import UNLIMITED, Caller, TokenMeter
from openai_api.quota.keys import ANONYMOUS, API_KEY_NAME, KeysFileError, KeyTable, api_key_digest, load_keys
from openai_api.quota.store import Decision, Limits, MemoryStore, QuotaStoreUnavailableError, Store

logger = logging.getLogger("openai_api.keys")
RELOAD_POLL_S = 1.0
# /metrics labels per key: the file's names (at most this many; the rest are "other"), never a secret.
MAX_KEY_LABELS = 1000


class RateLimitError(GatewayError):
    """OpenAI's 429 for a rate: `type` is "requests" or "tokens", `code` rate_limit_exceeded."""

    status = 429
    type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str = "requests", headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.type = kind


class InsufficientQuotaError(GatewayError):
    """OpenAI's 429 for a spent budget (`insufficient_quota`); its clients must not retry it."""

    status = 429
    type = "insufficient_quota"
    default_code = "insufficient_quota"


class PermissionDeniedError(GatewayError):
    status = 403
    type = "invalid_request_error"
    default_code = "permission_denied"


def go_duration(seconds: float) -> str:
    """A duration as OpenAI writes `x-ratelimit-reset-*` (Go's style): `20ms`, `1s`, `6.5s`, `6m0s`."""
    ms = max(math.ceil(seconds * 1000), 0)
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def ratelimit_headers(limits: Limits, d: Decision | None, meter: TokenMeter | None) -> list[tuple[bytes, bytes]]:
    """OpenAI's six `x-ratelimit-*` headers (those of the limits the key has)."""
    out: list[tuple[bytes, bytes]] = []
    if d is None:
        return out
    if limits.requests is not None:
        out += [(b"x-ratelimit-limit-requests", str(limits.requests).encode()),
                (b"x-ratelimit-remaining-requests", str(max(d.requests_remaining or 0, 0)).encode()),
                (b"x-ratelimit-reset-requests", go_duration(d.requests_reset_s).encode())]
    if limits.tokens is not None:
        remaining, reset = d.tokens_remaining, d.tokens_reset_s
        if meter is not None and meter.remaining_tokens is not None:
            remaining, reset = meter.remaining_tokens, meter.reset_tokens_s or 0.0
        out += [(b"x-ratelimit-limit-tokens", str(limits.tokens).encode()),
                (b"x-ratelimit-remaining-tokens", str(max(remaining or 0, 0)).encode()),
                (b"x-ratelimit-reset-tokens", go_duration(reset).encode())]
    return out


def refusal(d: Decision, limits: Limits, name: str, tokens: int = 0) -> GatewayError:
    """The 429 for a refused decision, in OpenAI's words."""
    retry = {"Retry-After": str(max(math.ceil(d.retry_after_s), 1)),
             "retry-after-ms": str(max(math.ceil(d.retry_after_s * 1000), 1))}
    window = f"{limits.window_s:g} s" if limits.window_s != 60 else "min"
    if d.reason in ("day", "month"):
        period = "daily" if d.reason == "day" else "monthly"
        return InsufficientQuotaError(
            f"You exceeded your current quota: the key {name!r} has spent its {period} token budget"
            + (f" (this request needs up to {tokens} tokens)." if tokens else ".")
            + " It renews at the start of the next UTC " + ("day." if d.reason == "day" else "month."),
            headers={"x-should-retry": "false"})
    if d.reason == "too_large":
        return RateLimitError(
            f"Request too large for the key {name!r} on tokens per {window} (TPM): Limit {limits.tokens}, "
            f"Requested {tokens} (prompt + max_tokens). Send fewer tokens or a smaller max_tokens.",
            headers={"x-should-retry": "false"}, kind="tokens")
    if d.reason == "concurrent":
        return RateLimitError(f"Too many concurrent requests for the key {name!r}: Limit {limits.concurrent}. "
                              "Please try again when one has finished.", headers=retry)
    if d.reason == "tokens":
        used = (limits.tokens or 0) - (d.tokens_remaining or 0)
        return RateLimitError(
            f"Rate limit reached for the key {name!r} on tokens per {window} (TPM): Limit {limits.tokens}, "
            f"Used {used}, Requested {tokens}. Please try again in {go_duration(d.retry_after_s)}.",
            headers=retry, kind="tokens")
    used = (limits.requests or 0) - (d.requests_remaining or 0)
    return RateLimitError(
        f"Rate limit reached for the key {name!r} on requests per {window} (RPM): Limit {limits.requests}, "
        f"Used {used}, Requested 1. Please try again in {go_duration(d.retry_after_s)}.", headers=retry)


class QuotaService:
    """See the module docstring. Event-loop only."""

    def __init__(self, keys_file: Path | None, api_keys: list[str], metrics: Metrics, store: Store | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.keys_file = keys_file
        self.environ = environ
        self.api_keys = [k.encode() for k in api_keys if k]
        self.table: KeyTable | None = load_keys(keys_file, environ) if keys_file is not None else None
        self.store: Store = store or MemoryStore()
        self._mtime = self._stat()
        self._tasks: list[asyncio.Task[Any]] = []
        self._limits: dict[str, Limits] = {}
        r = metrics.registry
        self.m_requests = Counter("openai_api_key_requests", "Requests per API key (name from the keys file) and "
                                  "status.", ["key", "status"], registry=r)
        self.m_prompt = Counter("openai_api_key_prompt_tokens", "Prompt tokens per API key.", ["key"], registry=r)
        self.m_completion = Counter("openai_api_key_completion_tokens", "Completion tokens per API key.", ["key"],
                                    registry=r)
        self.m_limited = Counter("openai_api_key_rate_limited", "Requests refused per API key and limit (requests, "
                                 "tokens, concurrent, day, month, too_large).", ["key", "reason"], registry=r)
        self._labels: set[str] = set(self.table.names[:MAX_KEY_LABELS]) if self.table else set()

    @property
    def enabled(self) -> bool:
        """Whether any key is configured (else every request is the anonymous caller)."""
        return self.table is not None or bool(self.api_keys)

    # --- who is calling ------------------------------------------------------------------------------------
    def identify(self, secret: bytes | None) -> Caller | None:
        """The caller of `secret` (the key as presented), or None for no or a wrong key."""
        if not self.enabled:
            return Caller(ANONYMOUS)
        if secret is None:
            return None
        if self.table is not None:
            caller = self.table.caller(secret)
            if caller is not None:
                return caller
        ok = False
        for key in self.api_keys:  # every comparison runs: timing reveals neither which key nor how much matched
            ok |= hmac.compare_digest(secret, key)
        return Caller(API_KEY_NAME, policy=UNLIMITED, key_digest=api_key_digest(secret)) if ok else None

    def limits(self, caller: Caller) -> Limits:
        window = self.table.window_s if self.table is not None else 60.0
        lim = self._limits.get(caller.name)
        if lim is None or lim.window_s != window or self._policy_changed(caller):
            lim = self._limits[caller.name] = Limits.of(caller.policy, window)
        return lim

    def _policy_changed(self, caller: Caller) -> bool:
        table = self.table
        return table is not None and table.policies.get(caller.name) is not caller.policy

    def label(self, name: str) -> str:
        return name if name in self._labels or name in (API_KEY_NAME, ANONYMOUS) else "other"

    # --- counting ------------------------------------------------------------------------------------------
    async def begin(self, caller: Caller) -> Decision:
        d = await self.store.begin(caller.name, self.limits(caller))
        if not d.ok:
            self.m_limited.labels(self.label(caller.name), d.reason).inc()
        return d

    def meter(self, caller: Caller) -> TokenMeter:
        limits = self.limits(caller)

        async def reserve(tokens: int) -> object:
            d = await self.store.reserve(caller.name, limits, tokens)
            if meter.remaining_tokens is None or d.tokens_remaining is not None:
                meter.remaining_tokens, meter.reset_tokens_s = d.tokens_remaining, d.tokens_reset_s
            if not d.ok:
                self.m_limited.labels(self.label(caller.name), d.reason).inc()
                raise refusal(d, limits, caller.name, tokens)
            return (d.grant, d.local)

        async def settle(done: TokenMeter) -> None:
            await self.settle(caller, done)

        meter = TokenMeter(reserve, settle)
        return meter

    async def finish(self, caller: Caller, begun: Decision | None, status: int) -> None:
        """The request is over: per-key metrics, the concurrency slot back, reservations settled."""
        self.m_requests.labels(self.label(caller.name), str(status)).inc()
        if begun is None:
            self._count(caller, caller.meter)
            return
        await self._settle(caller, caller.meter, True, begun.local)

    async def settle(self, caller: Caller, meter: TokenMeter) -> None:
        """Work that outlived its request (a background response, on a `TokenMeter.fork()`) is over: its tokens
        counted and its reservations settled as `finish` settles a request's; no slot is given back (the
        request's end gave it)."""
        await self._settle(caller, meter, False, False)

    def _count(self, caller: Caller, meter: TokenMeter | None) -> None:
        if meter is None:
            return
        label = self.label(caller.name)
        if meter.prompt_tokens:
            self.m_prompt.labels(label).inc(meter.prompt_tokens)
        if meter.completion_tokens:
            self.m_completion.labels(label).inc(meter.completion_tokens)

    async def _settle(self, caller: Caller, meter: TokenMeter | None, release: bool, local: bool) -> None:
        self._count(caller, meter)
        adjustments: list[tuple[list[Any], int]] = []
        if meter is not None and meter.reservations:
            # Give back what was reserved and not used, newest reservation first, each down to zero.
            unused = meter.reserved - (meter.prompt_tokens + meter.completion_tokens)
            for grant, reserved in reversed(meter.reservations):
                bucket, granted_locally = cast(tuple[list[Any], bool], grant)
                delta = -min(unused, reserved) if unused > 0 else 0
                if unused < 0 and not adjustments:
                    delta = -unused  # used more than reserved (never by design): count it
                unused += delta
                adjustments.append((bucket, delta))
                local = local or granted_locally
        elif not release:
            return  # nothing reserved, no slot to give back: nothing to tell the store
        try:
            await self.store.finish(caller.name, self.limits(caller), adjustments, release, local)
        except GatewayError as e:
            logger.warning("key %s: could not settle a request's counters: %s", caller.name, e.message)

    async def usage(self) -> list[dict[str, Any]]:
        """Every key of the file: its limits, what it used (window, in flight, today, this month) and what
        remains."""
        table = self.table
        out: list[dict[str, Any]] = []
        if table is None:
            return out
        for name in table.names:
            policy = table.policies[name]
            lim = Limits.of(policy, table.window_s)
            used = await self.store.usage(name, lim)
            limit_of = {"requests_in_window": lim.requests, "tokens_in_window": lim.tokens,
                        "concurrent": lim.concurrent, "tokens_today": lim.day, "tokens_this_month": lim.month}
            remaining = {k: None if v is None else max(v - int(used.get(k, 0)), 0) for k, v in limit_of.items()}
            out.append({"name": name, "team": table.teams.get(name, ""), "window_seconds": table.window_s,
                        "limits": {"models": list(policy.models), "requests_per_minute": policy.requests_per_minute,
                                   "tokens_per_minute": policy.tokens_per_minute,
                                   "max_concurrent": policy.max_concurrent, "tokens_per_day": policy.tokens_per_day,
                                   "tokens_per_month": policy.tokens_per_month, "priority": policy.priority,
                                   "admin": policy.admin},
                        "usage": used, "remaining": remaining})
        return out

    # --- reload ------------------------------------------------------------------------------------------
    def _stat(self) -> tuple[float, int] | None:
        if self.keys_file is None:
            return None
        try:
            st = self.keys_file.stat()
            return (st.st_mtime, st.st_size)
        except OSError:
            return None

    def reload(self, why: str = "") -> bool:
        """Load the keys file again; a bad one is refused with one log line and the old table stays."""
        if self.keys_file is None:
            return False
        self._mtime = self._stat()
        try:
            table = load_keys(self.keys_file, self.environ)
        except KeysFileError as e:
            logger.error("keys file not reloaded (%s), the previous keys stay: %s", why or "asked", e)
            return False
        old = set(self.table.names) if self.table else set()
        self.table = table
        self._limits.clear()
        self._labels |= set(table.names[:max(MAX_KEY_LABELS - len(self._labels), 0)])
        new = set(table.names)
        logger.info("keys file reloaded (%s): %d keys, %d added, %d removed", why or "asked", len(new),
                    len(new - old), len(old - new))
        return True

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_POLL_S)
            now = self._stat()
            if now is not None and now != self._mtime:
                self.reload("file changed")

    async def start(self) -> None:
        await self.store.start()
        if self.keys_file is None:
            return
        self._tasks.append(asyncio.create_task(self._poll(), name="keys-file-poll"))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        await self.store.close()


__all__ = ["InsufficientQuotaError", "PermissionDeniedError", "QuotaService", "QuotaStoreUnavailableError",
           "RateLimitError", "go_duration", "ratelimit_headers", "refusal"]

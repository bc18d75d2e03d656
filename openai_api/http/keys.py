"""The keys middleware (pure ASGI), used instead of `APIKeyMiddleware` when a keys file is given: who is
calling, whether the key may make a request now, OpenAI's rate-limit headers on every answer, and the
request's counters settled when it is over.

For every request on a guarded path:
1. the key (`Authorization: Bearer KEY`, or `x-api-key` as Anthropic's clients send it) is looked up:
   a key of the keys file, an `--api-key` key (no limits), or a 401 as `APIKeyMiddleware` gives it;
2. the caller (`quota.caller.Caller`: name, team, policy, token meter) is bound for the request, so
   admission (the model allow-list, the priority share), the Triton call (token reservations) and the
   routes all read it from `current_caller()`;
3. a counted key's request is begun in the store: a 429 (`rate_limit_exceeded` with Retry-After, or
   `insufficient_quota`) when a limit says no, a 503 when the shared store is unreachable and
   `--redis-fail-mode closed`;
4. the response's start gets `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`;
5. when the response is over, however it ended (complete, error, client gone), the concurrency slot is
   given back and the token reservations are settled with the real counts.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import AuthenticationError, GatewayError
from openai_api.http.middleware import (
    AUTHORIZED_KEY,
    INTERNAL_CALLER,
    basic_password,
    browser_page,
    challenges,
    send_error,
)
from openai_api.observability import current_stats
from openai_api.quota.caller import Caller, bind_caller, unbind_caller
from openai_api.quota.service import QuotaService, ratelimit_headers, refusal
from openai_api.quota.store import Decision
from openai_api.tracing import child_span

logger = logging.getLogger("openai_api.keys")
CALLER_KEY = "caller"  # scope["state"] key: the request's Caller
# Readable by browsers' scripts when CORS is on.
RATELIMIT_HEADERS = [f"x-ratelimit-{what}-{kind}" for kind in ("requests", "tokens")
                     for what in ("limit", "remaining", "reset")]


def presented_key(scope: Scope) -> bytes | None:
    """The key as the client sent it: `Authorization: Bearer KEY`, else `x-api-key: KEY`; on a browser page
    (`middleware.browser_page`) also as basic auth's password. An Authorization header that is none of these is
    no key (b"" : wrong, not missing)."""
    auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
    if auth is not None:
        if auth[:7].lower() == b"bearer ":
            key: bytes = auth[7:].strip()
            return key
        password = basic_password(auth) if browser_page(scope["path"]) else None
        return b"" if password is None else password.strip()
    return next((v.strip() for k, v in scope["headers"] if k == b"x-api-key"), None)


class KeysMiddleware:
    def __init__(self, app: ASGIApp, quota: QuotaService, open_paths: frozenset[str]) -> None:
        self.app = app
        self.quota = quota
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        quota = self.quota
        secret = presented_key(scope)
        state = scope.setdefault("state", {})
        internal = state.get(INTERNAL_CALLER)  # the batch runner's line: the job's key, without its secret
        caller = internal if isinstance(internal, Caller) else quota.identify(secret)
        if scope["path"] in self.open_paths:  # open, but what it says may depend on the key: never counted
            state[AUTHORIZED_KEY] = caller is not None
            if caller is not None:
                state[CALLER_KEY] = caller
            await self.app(scope, receive, send)
            return
        if caller is None:
            msg = ("You didn't provide an API key. Provide it as 'Authorization: Bearer YOUR_KEY' (or 'x-api-key')."
                   if secret is None else "Incorrect API key provided.")
            await send_error(scope, send, AuthenticationError(msg), challenges(scope["path"]))
            return
        state[CALLER_KEY] = caller
        begun: Decision | None = None
        counted = caller.policy.counted
        limits = quota.limits(caller)
        if counted:
            try:
                with child_span("quota", **{"openai_api.key.name": caller.name}) as span:  # traced requests only
                    begun = await quota.begin(caller)
                    if span is not None:
                        span.set_attribute("openai_api.quota.admitted", begun.ok)
            except GatewayError as e:  # the shared store is unreachable and the fail mode is closed
                quota.m_requests.labels(quota.label(caller.name), str(e.status)).inc()
                await send_error(scope, send, e)
                return
            if not begun.ok:
                err = refusal(begun, limits, caller.name)
                quota.m_requests.labels(quota.label(caller.name), str(err.status)).inc()
                await send_error(scope, send, err, ratelimit_headers(limits, begun, None))
                return
            caller.meter = quota.meter(caller)
        meter = caller.meter

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *ratelimit_headers(limits, begun, meter)]
            await send(message)

        token = bind_caller(caller)
        try:
            await self.app(scope, receive, send_with_headers if begun is not None else send)
        finally:
            unbind_caller(token)
            stats = current_stats()  # the request context's record of the response (outermost middleware)
            status = 0 if stats is None else (499 if stats.disconnected else stats.status)
            # Shielded: settling must happen even when this task is being cancelled (a drain's cut).
            await asyncio.shield(quota.finish(caller, begun, status or 500))

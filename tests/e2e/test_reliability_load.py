"""Long and loaded is normal: answers that take longer than the stall timeout, and hundreds of requests at once.

A non-streamed answer is one response from Triton, so there is no token to show progress while the model
works; a request queued behind hundreds of others shows none either. The gateway must wait for them (the
request deadline still bounds them) instead of ending them as stalled. Each test runs its own gateway with a
short `stream_idle_timeout_s` on the session Triton, so a regression shows up in seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, LLM, GatewayServer, gateway_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}
IDLE_S = 1.0


@pytest.fixture(scope="module")
def short_idle(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_config(triton), [API_KEY],
                           Settings(config_file=Path("."), api_keys=[API_KEY], stream_idle_timeout_s=IDLE_S)).start()
    yield server
    server.stop()


def test_non_streamed_answer_longer_than_the_idle_timeout_completes(short_idle: GatewayServer) -> None:
    # ~60 tokens at the reference model's ~18 tokens/s: several idle timeouts without a response from Triton.
    body = {"model": LLM, "messages": [{"role": "user", "content": "Count from one to fifty."}],
            "max_tokens": 60, "min_tokens": 60, "temperature": 0}
    with httpx.Client(base_url=short_idle.url, headers=AUTH, timeout=120) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 60
        r = c.post("/v1/completions", json={"model": LLM, "prompt": "Once upon a time", "max_tokens": 60,
                                            "min_tokens": 60, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 60


@pytest.mark.slow
def test_200_concurrent_non_streamed_requests_answer_200_or_429(short_idle: GatewayServer) -> None:
    """The probe that found zero successes: every request either gets its answer or a clear 429."""

    async def run() -> collections.Counter[int]:
        # One token each: the real model still answers one request at a time, so the last of the 200 waits
        # in Triton's queue for many idle timeouts (what the test is about) at a quarter of the 4-token cost.
        body = {"model": LLM, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1}
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
        async with httpx.AsyncClient(base_url=short_idle.url, headers=AUTH, timeout=300, limits=limits) as c:
            responses = await asyncio.gather(*(c.post("/v1/chat/completions", json=body) for _ in range(200)))
        for r in responses:
            if r.status_code == 200:
                assert r.json()["choices"][0]["message"]["role"] == "assistant"
            else:
                assert r.status_code == 429, r.text
                assert r.json()["error"]["type"] == "rate_limit_error"
        return collections.Counter(r.status_code for r in responses)

    counts = asyncio.run(run())
    assert set(counts) <= {200, 429}, counts
    assert counts[200] >= 100, counts  # the default per-model limit (256) admits them all

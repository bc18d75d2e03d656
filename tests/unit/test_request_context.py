"""The explicit request context (`services.context.RequestContext`): the edge hands each service the request's
id, caller and headers with the typed body, and routing's session key comes from those headers, on every
dialect (no service or adapter reads HTTP state back out of the metrics context)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.observability import RequestStats
from openai_api.settings import Settings
from tests.unit.fakes import MODEL, llm_only_config, script


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path))
    yield app
    await app.state.gateway.process.close()


BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 4},
    "/v1/messages": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 4},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("header", ["X-Claude-Code-Session-Id", "session_id"])
async def test_an_agents_session_header_reaches_routing_on_every_dialect(app: FastAPI, path: str,
                                                                         header: str) -> None:
    fake = script(app, "Hello there.")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post(path, json={"model": MODEL, **BODIES[path]},
                         headers={header: "sess-7", "x-request-id": "rid-ctx"})
    assert r.status_code == 200, r.text
    assert fake.requests and all(g.session == "h:sess-7" for g in fake.requests)
    assert fake.requests[0].request_id == "rid-ctx"


def test_the_metrics_record_carries_no_request_headers() -> None:
    assert "headers" not in RequestStats.__slots__

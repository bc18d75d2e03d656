"""Errors written once, by the dialect of the request's path (`openai_api.http.dialects`): the shapes against
OpenAI's and Anthropic's documented error objects, and the layers that answer early (the guard's body limit,
a drain cutting a stream short) writing each client's own shape with no middleware rewriting bytes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message

from openai_api.app import create_app
from openai_api.config import load_config
from openai_api.errors import BackendError, BackendUnavailableError, InvalidRequestError
from openai_api.http.dialects.table import dialect_for
from openai_api.http.guard import _cut_short
from openai_api.observability import RequestStats
from openai_api.settings import Settings
from tests.unit.fakes import MODEL, llm_only_config


@pytest.mark.parametrize("path, name", [
    ("/v1/chat/completions", "openai_chat"), ("/v1/completions", "openai_completions"),
    ("/v1/responses/resp_1", "openai_responses"), ("/v1/messages", "anthropic"),
    ("/v1/messages/count_tokens", "anthropic"), ("/health", "openai")])
def test_each_path_has_one_dialect(path: str, name: str) -> None:
    assert dialect_for(path).name == name


def test_openai_shape() -> None:
    err = InvalidRequestError("Invalid value for 'temperature'.", param="temperature")
    status, body = dialect_for("/v1/chat/completions").error(err, "rid-1")
    assert status == 400
    assert json.loads(body) == {"error": {"message": "Invalid value for 'temperature'.",
                                          "type": "invalid_request_error", "param": "temperature", "code": None}}
    event = dialect_for("/v1/chat/completions").stream_error(BackendError("Triton failed."))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:])["error"]["type"] == "server_error"


@pytest.mark.parametrize("err, status, kind", [
    (InvalidRequestError("temperature: too hot"), 400, "invalid_request_error"),
    (BackendError("Triton failed."), 500, "api_error"),
    (BackendUnavailableError("not ready"), 529, "overloaded_error"),
])
def test_anthropic_shape(err: Any, status: int, kind: str) -> None:
    got_status, body = dialect_for("/v1/messages").error(err, "rid-2")
    assert got_status == status
    assert json.loads(body) == {"type": "error", "error": {"type": kind, "message": err.message},
                                "request_id": "rid-2"}
    event = dialect_for("/v1/messages").stream_error(err)
    assert event.startswith(b"event: error\ndata: ")
    assert json.loads(event.split(b"data: ", 1)[1]) == {"type": "error", "error": {"type": kind,
                                                                                   "message": err.message}}


@pytest.mark.parametrize("path, first", [("/v1/messages", b"event: error\ndata: "),
                                         ("/v1/chat/completions", b"data: ")])
async def test_a_drain_cutting_a_stream_writes_the_clients_own_event(path: str, first: bytes) -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    stats = RequestStats(0.0, "rid")
    stats.status, stats.event_stream = 200, True
    await _cut_short({"type": "http", "path": path}, stats, send)
    assert sent[0]["body"].startswith(first) and sent[-1] == {"type": "http.response.body", "body": b"",
                                                               "more_body": False}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = create_app(load_config(llm_only_config(tmp_path).source),
                     Settings(config_file=tmp_path, max_body_bytes=1024))
    yield app
    await app.state.gateway.process.close()


async def test_the_guards_body_limit_answers_in_each_dialect(app: FastAPI) -> None:
    big = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 4096}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        anthropic = await c.post("/v1/messages", json=big)
        openai = await c.post("/v1/chat/completions", json=big)
    assert anthropic.status_code == openai.status_code == 413
    assert anthropic.json() == {"type": "error", "error": {"type": "request_too_large",
                                                           "message": anthropic.json()["error"]["message"]},
                                "request_id": anthropic.headers["x-request-id"]}
    assert openai.json()["error"]["code"] == "payload_too_large" and "type" not in openai.json()

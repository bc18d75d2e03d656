"""WebSocket mode of `/v1/responses` over the real app (Starlette's test client) and a fake backend: the typed
events of the SSE stream as text frames (each validated against OpenAI's schema), several `response.create`s on one
connection continued with `previous_response_id` without a store, Codex's warm-up (`generate: false`), error events
that leave the connection open, and the same keys, allow-list and body bounds as HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from openai_api.app import create_app
from openai_api.settings import Settings
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config, script
from tests.unit.test_agent_requests import EVENT_SCHEMAS

KEYS = [{"name": "a", "secret_sha256": hashlib.sha256(b"sk-a").hexdigest()},
        {"name": "embed-only", "secret_sha256": hashlib.sha256(b"sk-e").hexdigest(), "models": ["all-minilm-*"]}]
A = {"authorization": "Bearer sk-a", "openai-beta": "responses_websockets=2026-02-06"}
TOOL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}}, "required": ["command"]}}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": KEYS}), encoding="utf-8")
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, keys_file=keys,
                                                         max_body_bytes=64 * 1024))
    yield app


def create(ws: Any, **body: Any) -> None:
    ws.send_text(json.dumps({"type": "response.create", "model": MODEL, **body}))


def until_end(ws: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        event = json.loads(ws.receive_text())
        out.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return out


def test_two_turns_on_one_connection_continue_without_a_store(app: FastAPI, validate: Callable[..., None]) -> None:
    fake = script(app, '{"command": "ls"}')
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        create(ws, input="List the files.", tools=[TOOL], tool_choice={"type": "function", "name": "shell"},
               store=False)
        first = until_end(ws)
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        for e in first:
            validate(EVENT_SCHEMAS[e["type"]], e)
        done = first[-1]["response"]
        [call] = done["output"]
        assert done["status"] == "completed" and call["type"] == "function_call" and call["name"] == "shell"
        fake = script(app, "There are two files.")
        create(ws, input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "a.py b.py"}],
               previous_response_id=done["id"], tools=[TOOL], store=False)
        second = until_end(ws)
        assert second[-1]["type"] == "response.completed", second[-1]
        assert second[-1]["response"]["output"][0]["content"][0]["text"] == "There are two files."
        counted = app.state.gateway.metrics.requests.labels("websocket:/v1/responses", MODEL, "200")
        assert counted._value.get() == 2
        prompt = fake.requests[0].prompt_text
        assert "List the files." in prompt and "a.py b.py" in prompt and '"ls"' in prompt


def test_a_warm_up_prepares_and_the_next_request_continues_it(app: FastAPI, validate: Callable[..., None]) -> None:
    fake = script(app, "Hello.")
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        create(ws, input="Hi", instructions="Be brief.", generate=False)
        created, completed = until_end(ws)
        validate("ResponseCreatedEvent", created)
        validate("ResponseCompletedEvent", completed)
        assert completed["response"]["output"] == [] and completed["response"]["usage"]["input_tokens"] > 0
        assert fake.requests == []  # nothing generated
        ws.send_text(json.dumps({"type": "response.processed", "response_id": completed["response"]["id"]}))
        create(ws, input=[], previous_response_id=completed["response"]["id"], instructions="Be brief.")
        assert until_end(ws)[-1]["type"] == "response.completed"
        assert fake.requests[0].prompt_text.count("Hi") == 1


@pytest.mark.parametrize(("frame", "status", "code"), [
    ("not json", 400, "invalid_json"), ("[1, 2]", 400, None), ('{"type": "session.update"}', 400, "unsupported_frame"),
    ('{"type": "response.create", "model": "' + MODEL + '"}', 400, None),  # no input
    ('{"type": "response.create", "model": "' + MODEL + '", "input": "x", "background": true}', 400,
     "unsupported_parameter"),
    ('{"type": "response.create", "model": "' + MODEL + '", "input": "' + "x" * 70_000 + '"}', 413, None),
    ('{"type": "response.create", "model": "' + MODEL + '", "input": "x", "previous_response_id": "resp_1"}', 404,
     "previous_response_not_found"),
])
def test_a_bad_frame_is_an_error_event_and_the_connection_goes_on(app: FastAPI, frame: str, status: int,
                                                                  code: str | None) -> None:
    script(app, "Fine.")
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        ws.send_text(frame)
        error = json.loads(ws.receive_text())
        assert error["type"] == "error" and error["status"] == status, error
        assert set(error["error"]) == {"message", "type", "param", "code"}
        if code is not None:
            assert error["error"]["code"] == code
        ws.send_bytes(b"\x00")
        assert json.loads(ws.receive_text())["error"]["code"] == "invalid_frame"
        create(ws, input="Still there?")
        assert until_end(ws)[-1]["type"] == "response.completed"


def test_keys_and_the_allow_list_apply(app: FastAPI) -> None:
    client = TestClient(app)
    for headers in ({}, {"authorization": "Bearer sk-wrong"}):
        with pytest.raises(WebSocketDenialResponse) as denied:
            with client.websocket_connect("/v1/responses", headers=headers):
                pass
        assert denied.value.status_code == 401 and denied.value.json()["error"]["type"] == "invalid_request_error"
    with client.websocket_connect("/v1/responses", headers={"authorization": "Bearer sk-e"}) as ws:
        create(ws, input="Hi")
        error = json.loads(ws.receive_text())
        assert error["status"] == 404 and error["error"]["param"] == "model"


def test_a_draining_gateway_refuses_the_upgrade_and_closes_open_connections(app: FastAPI) -> None:
    script(app, "Fine.")
    client = TestClient(app)
    with client.websocket_connect("/v1/responses", headers=A) as ws:
        app.state.gateway.lifecycle.draining = True
        create(ws, input="Hi")
        assert json.loads(ws.receive_text())["status"] == 503
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1001
    with pytest.raises(WebSocketDenialResponse) as denied:
        with client.websocket_connect("/v1/responses", headers=A):
            pass
    assert denied.value.status_code == 503


class SlowBackend(FakeBackend):
    """A chunk every 20 ms: a generation still running when the client leaves."""

    async def generate(self, request: Any) -> Any:
        async for chunk in super().generate(request):
            await asyncio.sleep(0.02)
            yield chunk


def test_a_client_that_leaves_mid_answer_cancels_its_generation(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = SlowBackend([[i] for i in rt.tokenizer.encode("word " * 200)])
    rt.backend = fake
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        create(ws, input="Talk.")
        while json.loads(ws.receive_text())["type"] != "response.output_text.delta":
            pass
    for _ in range(200):  # the server side notices the close on its own loop
        if fake.closed_early:
            break
        time.sleep(0.01)
    assert fake.closed_early == 1 and fake.completed == 0
    assert app.state.gateway.limiter.per_model.get(MODEL) == 0


def test_each_request_on_the_socket_gets_an_access_log_line(app: FastAPI, caplog: pytest.LogCaptureFixture) -> None:
    script(app, "Hello.")
    with caplog.at_level("INFO", logger="openai_api.access"), \
            TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        create(ws, input="Hi", store=False)
        done = until_end(ws)[-1]["response"]
        create(ws, model="not-a-model", input="Hi")
        assert until_end(ws)[-1]["status"] == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "openai_api.access"
             and "method=WEBSOCKET" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "path=/v1/responses status=200" in lines[0] and f"object_id={done['id']}" in lines[0]
    assert f"model={MODEL}" in lines[0] and "key=a" in lines[0] and "sk-a" not in lines[0]
    assert "status=404" in lines[1] and "not-a-model" not in lines[1]  # an unknown model is never a label


def test_a_connection_past_its_lifetime_finishes_its_response_then_says_so_and_closes(tmp_path: Path) -> None:
    """OpenAI closes a WebSocket after 60 minutes with `websocket_connection_limit_reached`; here with 0.4 s. The
    response running when the time is up completes; a frame sent after it is answered by the limit's error event
    (never run), and the connection closes."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": KEYS}), encoding="utf-8")
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, keys_file=keys,
                                                         responses_ws_max_age_s=0.4))
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = SlowBackend([[i] for i in rt.tokenizer.encode("word " * 40)])  # ~0.8 s: outlives the limit
    rt.backend = fake
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        started = time.monotonic()
        create(ws, input="Talk.", store=False)
        create(ws, input="And again.", store=False)  # waits behind the first; the limit comes before its turn
        first = until_end(ws)
        assert time.monotonic() - started > 0.4
        assert first[-1]["type"] == "response.completed", first[-1]
        error = json.loads(ws.receive_text())
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        assert error["error"]["type"] == "invalid_request_error"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1000 and closed.value.reason == "websocket_connection_limit_reached"
    assert len(fake.requests) == 1 and fake.completed == 1


def test_an_idle_connection_is_told_and_closed_when_its_lifetime_is_up(tmp_path: Path) -> None:
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, responses_ws_max_age_s=0.1))
    with TestClient(app).websocket_connect("/v1/responses") as ws:
        error = json.loads(ws.receive_text())  # sent unasked, once 0.1 s have passed
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1000


def test_a_compaction_trigger_on_the_socket_compacts_and_the_next_turn_continues_it(
        app: FastAPI, validate: Callable[..., None]) -> None:
    """Codex's remote compaction v2 over the WebSocket: the connection's conversation summarized into one
    `compaction` item, and the next `response.create` continues from the summary (no store needed)."""
    from openai_api.services.compaction import read_compaction

    script(app, "Noted: the code word is quokka.")
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        create(ws, input="Remember the code word quokka.", store=False)
        first = until_end(ws)[-1]["response"]
        fake = script(app, "The user set the code word quokka.")
        create(ws, input=[{"type": "compaction_trigger"}], previous_response_id=first["id"], store=False)
        events = until_end(ws)
        for e in events:
            validate(EVENT_SCHEMAS[e["type"]], e)
        done = events[-1]["response"]
        [item] = done["output"]
        assert read_compaction(item["encrypted_content"], "x") == "The user set the code word quokka."
        assert "Remember the code word quokka." in fake.requests[0].prompt_text
        fake = script(app, "quokka")
        create(ws, input="What was the code word?", previous_response_id=done["id"], store=False)
        assert until_end(ws)[-1]["type"] == "response.completed"
        prompt = fake.requests[0].prompt_text
        assert "The user set the code word quokka." in prompt and "Noted: the code word" not in prompt


def test_codexs_compaction_on_the_socket_after_a_tool_output_then_a_request_from_the_item(app: FastAPI) -> None:
    """As Codex 0.169 compacts over the WebSocket (seen through the gateway, tests/e2e/test_agent_requests.py):
    the tool's output and the trigger in one `response.create` continuing the tool call's response, then a fresh
    `response.create` (no `previous_response_id`) whose input is the user's message and the `compaction` item as
    returned. The summary is asked with the tool's output in the prompt; the next prompt has the summary and
    neither the call nor its output."""
    script(app, '{"command": "seq 1 4000"}')
    with TestClient(app).websocket_connect("/v1/responses", headers=A) as ws:
        ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Print the numbers."}]}
        create(ws, input=[ask], tools=[TOOL], tool_choice={"type": "function", "name": "shell"}, store=False)
        done = until_end(ws)[-1]["response"]
        [call] = done["output"]
        fake = script(app, "Printed 1 to 4000; next, write after.txt.")
        create(ws, input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "1 2 LISTING 4000"},
                          {"type": "compaction_trigger"}], previous_response_id=done["id"], tools=[TOOL], store=False)
        compacted = until_end(ws)[-1]
        assert compacted["type"] == "response.completed", compacted
        [item] = compacted["response"]["output"]
        assert item["type"] == "compaction"
        assert "1 2 LISTING 4000" in fake.requests[0].prompt_text and "seq 1 4000" in fake.requests[0].prompt_text
        fake = script(app, '{"command": "echo compacted > after.txt"}')
        create(ws, input=[ask, item], tools=[TOOL], store=False)
        assert until_end(ws)[-1]["type"] == "response.completed"
        prompt = fake.requests[0].prompt_text
        assert "Printed 1 to 4000; next, write after.txt." in prompt and "Print the numbers." in prompt
        assert "LISTING" not in prompt and "seq 1 4000" not in prompt

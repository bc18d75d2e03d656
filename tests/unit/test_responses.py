"""`/v1/responses` over the real app and a fake backend: the response object and every streamed event
checked against OpenAI's published schemas, input items, function tools, text.format, the response store,
and reasoning output."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.settings import Settings
from tests.unit.fakes import MODEL, llm_only_config, script

TOOL = {"type": "function", "name": "get_time", "description": "Time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}
EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent", "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent", "response.output_text.done": "ResponseTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.reasoning_text.delta": "ResponseReasoningTextDeltaEvent",
    "response.reasoning_text.done": "ResponseReasoningTextDoneEvent",
    "response.completed": "ResponseCompletedEvent", "response.incomplete": "ResponseIncompleteEvent",
}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, responses_store=8))
    yield app
    await app.state.gateway.process.close()


async def post(app: FastAPI, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post("/v1/responses", json={"model": MODEL, **body})


def events(r: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for block in r.text.split("\n\n"):
        if not block.strip():
            continue
        kind, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


async def test_a_plain_response_is_the_openai_response_object(app: FastAPI, validate: Callable[..., None]) -> None:
    script(app, "Paris is the capital.")
    r = await post(app, {"input": "What is the capital of France?", "instructions": "Be brief."})
    assert r.status_code == 200, r.text
    body = r.json()
    validate("Response", body)
    assert body["object"] == "response" and body["status"] == "completed" and body["store"] is False
    [item] = body["output"]
    assert item["type"] == "message" and item["content"][0] == {"type": "output_text", "text": "Paris is the capital.",
                                                                "annotations": [], "logprobs": []}
    assert body["usage"]["output_tokens"] > 0 and body["usage"]["input_tokens"] > 0


async def test_streamed_events_come_in_openais_order_and_shapes(app: FastAPI, validate: Callable[..., None]) -> None:
    script(app, "Hello there, friend.")
    r = await post(app, {"input": "Hi", "stream": True})
    evs = events(r)
    kinds = [e["type"] for e in evs]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    for e in evs:
        validate(EVENT_SCHEMAS[e["type"]], e)
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == "Hello there, friend." == evs[-1]["response"]["output"][0]["content"][0]["text"]


async def test_a_function_tool_round_trip(app: FastAPI, validate: Callable[..., None]) -> None:
    fake = script(app, '{"tz": "UTC"}')
    body = {"input": "What time is it?", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_time"}}
    first = (await post(app, body)).json()
    validate("Response", first)
    [call] = first["output"]
    assert call["type"] == "function_call" and call["name"] == "get_time"
    assert json.loads(call["arguments"]) == {"tz": "UTC"}
    assert fake.requests[0].guide is not None  # the forced call is guided
    # Streamed: the same call, its arguments as deltas.
    evs = events(await post(app, {**body, "stream": True}))
    assert "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta") == '{"tz": "UTC"}'
    assert evs[-1]["response"]["output"][0]["name"] == "get_time"
    # The next turn sends the call and its output back as input items.
    fake = script(app, "It is noon.")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "12:00"}
    second = await post(app, {"input": [{"role": "user", "content": "What time is it?"}, call, result],
                              "tools": [TOOL]})
    assert second.status_code == 200, second.text
    assert "12:00" in fake.requests[0].prompt_text and "get_time" in fake.requests[0].prompt_text


async def test_text_format_json_schema_is_a_guide(app: FastAPI) -> None:
    fake = script(app, '{"ok": true}')
    fmt = {"type": "json_schema", "name": "r", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}
    body = (await post(app, {"input": "ok?", "text": {"format": fmt}})).json()
    assert json.loads(body["output"][0]["content"][0]["text"]) == {"ok": True} and body["text"]["format"] == fmt
    assert fake.requests[0].guide is not None and fake.requests[0].guide.kind == "json_schema"


async def test_max_output_tokens_makes_it_incomplete(app: FastAPI, validate: Callable[..., None]) -> None:
    script(app, "one two three four five six seven")
    body = (await post(app, {"input": "Count.", "max_output_tokens": 3})).json()
    validate("Response", body)
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_previous_response_id_needs_the_store_and_continues_the_conversation(tmp_path: Path,
                                                                                   app: FastAPI) -> None:
    script(app, "Nice to meet you, Ada.")
    first = (await post(app, {"input": "My name is Ada.", "store": True})).json()
    assert first["store"] is True
    fake = script(app, "Your name is Ada.")
    r = await post(app, {"input": "What is my name?", "previous_response_id": first["id"]})
    assert r.status_code == 200, r.text
    prompt = fake.requests[0].prompt_text
    assert "My name is Ada." in prompt and "Nice to meet you, Ada." in prompt
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get(f"/v1/responses/{first['id']}")).json()["id"] == first["id"]
        assert (await c.get("/v1/responses/resp_nope")).status_code == 404
    unknown = await post(app, {"input": "x", "previous_response_id": "resp_nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "previous_response_id"
    assert unknown.json()["error"]["code"] == "previous_response_not_found"  # OpenAI's status and code
    no_store = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path))
    script(no_store, "x")
    r = await post(no_store, {"input": "x", "previous_response_id": first["id"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "response_store_disabled"
    await no_store.state.gateway.process.close()


@pytest.mark.parametrize("body", [
    {"input": [{"type": "no_such_item", "id": "x"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
    {"input": "x", "tools": [{"type": "namespace", "name": "crm", "description": "CRM", "tools": []}]},
    {"input": "x", "tool_choice": {"type": "allowed_tools"}},
])
async def test_what_a_self_hosted_model_cannot_do_is_a_400_naming_it(app: FastAPI, body: dict[str, Any]) -> None:
    script(app, "x")
    r = await post(app, body)
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_a_reasoning_model_returns_a_reasoning_item(app: FastAPI, validate: Callable[..., None]) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.reasoning_parser = "qwen3"  # as `resolve_parsers` sets it for `reasoning_parser: qwen3` (or auto)
    script(app, "<think>\nThe user greets me.\n</think>\n\nHello!")
    body = (await post(app, {"input": "Hi"})).json()
    validate("Response", body)
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "The user greets me.\n"
    assert message["content"][0]["text"] == "Hello!"
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    evs = events(await post(app, {"input": "Hi", "stream": True}))
    for e in evs:
        validate(EVENT_SCHEMAS[e["type"]], e)
    assert "".join(e["delta"] for e in evs if e["type"] == "response.reasoning_text.delta") == "The user greets me.\n"
    assert evs[-1]["response"]["output"][1]["content"][0]["text"] == "Hello!"


async def test_prompt_cache_key_names_the_session_for_routing(app: FastAPI) -> None:
    """Codex sends `prompt_cache_key` with every turn of a session: it reaches the generation as its session
    key (prefix-affinity routing follows it to the replica holding the session's KV cache), as chat's does."""
    fake = script(app, "Hi.")
    r = await post(app, {"input": "Hello", "prompt_cache_key": "sess-19f"})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_cache_key"] == "sess-19f"
    assert fake.requests[0].session == "k:sess-19f"

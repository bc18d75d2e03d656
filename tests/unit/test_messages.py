"""`/v1/messages` over the real app and a fake backend: the translation to chat (system, blocks, tools,
tool_choice, thinking), the answer's blocks and stop reasons, every streamed event against Anthropic's
schemas and event grammar (`tests/anthropic_events.py`), errors in Anthropic's shape, aliases, x-api-key,
pings on a quiet stream, and the hostile inputs that must be a 400 naming the block."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import load_config
from openai_api.errors import BackendError, BackendUnavailableError
from openai_api.http.dialects.anthropic_messages import PING, turns
from openai_api.http.sse import coalesced
from openai_api.schemas.anthropic import CountTokensRequest, MessagesRequest
from openai_api.schemas.openai import ChatMessage
from openai_api.services import parts
from openai_api.services.retention import mark_block
from openai_api.settings import Settings
from tests.anthropic_events import accumulate, check_stream, parse_sse, validate
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
KEY = "sk-test"


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    config = llm_only_config(tmp_path)
    data = json.loads(Path(str(config.source)).read_text())
    data["llm"][0]["aliases"] = ["claude-sonnet-4-5"]
    data["llm"][0]["image_placeholder"] = "<image>"  # its template renders no image parts
    (tmp_path / "model_config.json").write_text(json.dumps(data))
    app = create_app(load_config(tmp_path / "model_config.json"), Settings(config_file=tmp_path, api_keys=[KEY]))
    yield app
    await app.state.gateway.process.close()


def script(app: FastAPI, text: str, **kw: Any) -> FakeBackend:
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = FakeBackend([[i] for i in rt.tokenizer.encode(text)], **kw)
    rt.backend = fake
    return fake


async def post(app: FastAPI, body: dict[str, Any], path: str = "/v1/messages",
               headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        sent = {"x-api-key": KEY, "anthropic-version": "2023-06-01"} if headers is None else headers
        return await c.post(path, json={"model": MODEL, "max_tokens": 64, **body}, headers=sent)


def chat_messages(req: CountTokensRequest, images: list[str] | None = None,
                  strip_billing: bool = True) -> list[dict[str, Any]]:
    """The chat messages (as dicts) the Messages dialect makes of `req`; each image block's path into `images`."""
    conversation = turns(req, strip_billing)
    if images is not None:
        images += parts.image_paths(conversation)
    return [ChatMessage.model_validate(m).model_dump(exclude_none=True) for m in parts.chat_messages(conversation)]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def both(app: FastAPI, text: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The plain answer and the streamed events of the same scripted output."""
    script(app, text)
    plain = await post(app, body)
    assert plain.status_code == 200, plain.text
    validate("Message", plain.json())
    script(app, text)
    streamed = await post(app, {**body, "stream": True})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(streamed.text)
    check_stream(events)
    return plain.json(), events


async def test_a_plain_and_a_streamed_message_are_one_answer(app: FastAPI) -> None:
    plain, events = await both(app, "Paris is the capital.", {"messages": user("Capital of France?")})
    assert plain["content"] == [{"type": "text", "text": "Paris is the capital."}]
    assert plain["id"].startswith("msg_") and plain["stop_reason"] == "end_turn" and plain["stop_sequence"] is None
    assert plain["usage"]["input_tokens"] > 0 and plain["usage"]["output_tokens"] > 0
    assert plain["usage"]["cache_read_input_tokens"] == plain["usage"]["cache_creation_input_tokens"] == 0
    assert [e["type"] for e in events][:3] == ["message_start", "ping", "content_block_start"]
    final = accumulate(events)
    assert {**final, "id": ""} == {**plain, "id": ""}


async def test_system_blocks_tools_and_history_become_the_chat_messages() -> None:
    req = MessagesRequest.model_validate({
        "model": MODEL, "max_tokens": 10,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Use tools."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call it.", "signature": "x"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "oops", "is_error": True},
                {"type": "text", "text": "Thanks"}]}]})
    assert chat_messages(req) == [
        # The cache_control breakpoint's marker (`services.retention`), removed from the rendered prompt.
        {"role": "system", "content": mark_block("Be brief.", "5m") + "\n\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "I should call it.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: oops"},
        {"role": "user", "content": "Thanks"}]


async def test_claude_codes_billing_header_is_left_out_so_turns_share_their_prefix() -> None:
    """Claude Code's first system block changes its hash (cch) every request: left out (a block holding only
    it is dropped, a line of it in a longer text removed), two turns render the same system prompt; with
    --keep-billing-header it stays as sent."""
    def req(system: Any) -> CountTokensRequest:
        return CountTokensRequest.model_validate({"model": MODEL, "system": system, "messages": user("hi")})

    def blocks(cch: str) -> list[dict[str, Any]]:
        return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.af0; cc_entrypoint=cli; "
                                         f"cch={cch};"},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]

    first, second = chat_messages(req(blocks("a1b2c"))), chat_messages(req(blocks("f9e8d")))
    assert first == second and first[0] == {"role": "system", "content": mark_block("You are Claude Code.", "5m")}
    inline = chat_messages(req("x-anthropic-billing-header: cch=77;\nYou are Claude Code."))
    assert inline[0]["content"] == "You are Claude Code."
    kept = chat_messages(req(blocks("a1b2c")), strip_billing=False)
    assert kept[0]["content"].startswith("x-anthropic-billing-header: cc_version=2.1.332.af0;")
    # Text that merely mentions the header is not a header line.
    mention = chat_messages(req("Never print x-anthropic-billing-header: values."))
    assert mention[0]["content"] == "Never print x-anthropic-billing-header: values."


async def test_sampling_fields_reach_the_backend(app: FastAPI) -> None:
    fake = script(app, "Hi")
    r = await post(app, {"messages": user("Hi"), "temperature": 0.5, "top_p": 0.9, "top_k": 7, "max_tokens": 9,
                         "metadata": {"user_id": "u-1"}})
    assert r.status_code == 200, r.text
    [g] = fake.requests
    assert (g.max_tokens, g.temperature, g.top_p, g.top_k) == (9, 0.5, 0.9, 7)


async def test_a_stop_sequence_is_named_in_the_answer(app: FastAPI) -> None:
    plain, events = await both(app, "one two three four", {"messages": user("count"), "stop_sequences": ["three"]})
    assert plain["stop_reason"] == "stop_sequence" and plain["stop_sequence"] == "three"
    assert plain["content"] == [{"type": "text", "text": "one two "}]
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "three"}


async def test_max_tokens_is_the_stop_reason_when_cut(app: FastAPI) -> None:
    plain, events = await both(app, "one two three four five", {"messages": user("count"), "max_tokens": 2})
    assert plain["stop_reason"] == "max_tokens"  # (the fake backend plays its whole script)
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"


async def test_a_tool_call_is_a_tool_use_block(app: FastAPI) -> None:
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    plain, events = await both(app, text, {"messages": user("Weather in Paris?"), "tools": [WEATHER]})
    text_block, call = plain["content"]
    assert text_block["type"] == "text" and text_block["text"].strip() == "Let me check."
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_") and call["name"] == "get_weather"
    assert call["input"] == {"city": "Paris"} and plain["stop_reason"] == "tool_use"
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == 1]
    assert json.loads("".join(d["partial_json"] for d in deltas)) == {"city": "Paris"}
    final = accumulate(events)
    assert final["content"][1]["name"] == "get_weather" and final["stop_reason"] == "tool_use"
    assert {**final, "id": "", "content": ""} == {**plain, "id": "", "content": ""}


async def test_forced_tool_choice_is_guided_and_parallel_use_can_be_disabled(app: FastAPI) -> None:
    fake = script(app, '{"city": "Paris"}')
    r = await post(app, {"messages": user("Weather?"), "tools": [WEATHER],
                         "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}})
    assert r.status_code == 200, r.text
    [call] = r.json()["content"]
    assert call["input"] == {"city": "Paris"} and r.json()["stop_reason"] == "tool_use"
    assert fake.requests[0].guide is not None
    fake = script(app, '{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    r = await post(app, {"messages": user("Weather?"), "tools": [WEATHER], "tool_choice": {"type": "any"}})
    assert r.json()["content"][0]["input"] == {"city": "Oslo"} and fake.requests[0].guide is not None


async def test_thinking_blocks_carry_a_signature_and_the_budget_caps_them(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.reasoning_parser = "qwen3"
    text = "<think>one two three four five six seven eight nine ten</think>The answer is 4."
    plain, events = await both(app, text, {"messages": user("2+2?")})
    thinking, answer = plain["content"]
    assert thinking["type"] == "thinking" and "ten" in thinking["thinking"] and thinking["signature"]
    assert answer == {"type": "text", "text": "The answer is 4."}
    assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0][-1] \
        == "signature_delta"
    assert {**accumulate(events), "id": ""} == {**plain, "id": ""}
    budget = {"type": "enabled", "budget_tokens": 4}
    plain, events = await both(app, text, {"messages": user("2+2?"), "thinking": budget})
    assert "ten" not in plain["content"][0]["thinking"] and plain["content"][1]["text"] == "The answer is 4."
    streamed = accumulate(events)["content"]
    assert "ten" not in streamed[0]["thinking"] and streamed[1]["text"] == "The answer is 4."


async def test_adaptive_thinking_has_no_budget_and_omitted_display_keeps_only_the_signature(app: FastAPI) -> None:
    app.state.gateway.services.registry.llm(MODEL).reasoning_parser = "qwen3"
    text = "<think>one two three four five six seven eight nine ten</think>The answer is 4."
    plain, events = await both(app, text, {"messages": user("2+2?"), "thinking": {"type": "adaptive"}})
    assert "ten" in plain["content"][0]["thinking"]
    thinking = {"type": "enabled", "budget_tokens": 8, "display": "omitted"}
    plain, events = await both(app, text, {"messages": user("2+2?"), "thinking": thinking})
    assert plain["content"][0]["thinking"] == "" and plain["content"][0]["signature"]
    assert {**accumulate(events), "id": ""} == {**plain, "id": ""}


async def test_count_tokens_is_the_answers_input_tokens(app: FastAPI) -> None:
    body = {"system": "Be brief.", "messages": user("Weather in Paris?"), "tools": [WEATHER]}
    count = await post(app, body, "/v1/messages/count_tokens")
    assert count.status_code == 200, count.text
    validate("CountTokensResponse", count.json())
    script(app, "Sunny.")
    answer = await post(app, body)
    assert count.json()["input_tokens"] == answer.json()["usage"]["input_tokens"]
    plain = await post(app, {"messages": user("Weather in Paris?")}, "/v1/messages/count_tokens")
    assert plain.json()["input_tokens"] < count.json()["input_tokens"]  # the tools and system are counted


async def test_an_alias_names_the_served_model(app: FastAPI) -> None:
    script(app, "Hi")
    r = await post(app, {"model": "claude-sonnet-4-5", "messages": user("Hi")})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "claude-sonnet-4-5"


@pytest.mark.parametrize("headers, status, kind", [
    ({}, 401, "authentication_error"),
    ({"x-api-key": "wrong"}, 401, "authentication_error"),
    ({"authorization": "Bearer wrong"}, 401, "authentication_error"),
])
async def test_a_bad_key_is_anthropics_authentication_error(app: FastAPI, headers: dict[str, str], status: int,
                                                            kind: str) -> None:
    r = await post(app, {"messages": user("Hi")}, headers=headers)
    assert r.status_code == status
    validate("ErrorResponse", r.json())
    assert r.json()["error"]["type"] == kind and r.json()["request_id"] == r.headers["x-request-id"]


async def test_both_key_headers_are_accepted(app: FastAPI) -> None:
    script(app, "Hi")
    assert (await post(app, {"messages": user("Hi")}, headers={"authorization": f"Bearer {KEY}"})).status_code == 200


async def test_an_image_block_reaches_a_model_that_takes_images_as_an_image_url_part() -> None:
    req = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}]}]})
    images: list[str] = []
    assert chat_messages(req, images) == [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]
    assert images == ["messages[0].content[1]", "messages[0].content[2]"]


async def test_a_refused_image_is_named_by_its_own_block(app: FastAPI) -> None:
    """The fetcher's refusal names chat's part (messages[3].content[0] here: the system prompt and the tool
    result are chat messages of their own); the client hears of its own block, messages[2].content[1]."""
    script(app, "Hi")
    not_png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    body = {"system": "Be brief.", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     not_png]}], "tools": [WEATHER]}
    r = await post(app, body)
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
    message = r.json()["error"]["message"]
    assert message.startswith("messages[2].content[1]: The image was refused") and "(reason: " in message, message


@pytest.mark.parametrize("body, param", [
    ({"model": "no-such-model"}, None),
])
async def test_an_unknown_model_is_not_found(app: FastAPI, body: dict[str, Any], param: str | None) -> None:
    r = await post(app, {"messages": user("Hi"), **body})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    validate("ErrorResponse", r.json())


@pytest.mark.parametrize("body, where", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "hologram", "text": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_never",
                                                 "content": "x"}]}]}, "tool_use_id"),
    ({"messages": user("Hi"), "thinking": {"type": "enabled", "budget_tokens": 64}}, "thinking.budget_tokens"),
    ({"messages": user("Hi"), "thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "moderator", "content": "x"}]}, "messages[0].role"),
    ({"messages": user("Hi"), "output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"messages": user("Hi"), "context_management": {"edits": [{"type": "clear_everything"}]}},
     "context_management.edits[0].type"),
    ({"messages": user("Hi"), "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"messages": user("Hi"), "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"messages": user("Hi"), "max_tokens": None}, "max_tokens"),
    ({"messages": user("Hi"), "temperature": 1.5}, "temperature"),
    ({"messages": user("Hi"), "stop_sequences": "x"}, "stop_sequences"),
])
async def test_hostile_input_is_a_400_naming_it(app: FastAPI, body: dict[str, Any], where: str) -> None:
    fake = script(app, "Hi")
    fake.supports = lambda param: param != "images"  # type: ignore[method-assign]  # a text model
    r = await post(app, body)
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
    assert r.json()["error"]["type"] == "invalid_request_error" and where in r.json()["error"]["message"]


async def test_backend_errors_keep_anthropics_statuses(app: FastAPI) -> None:
    script(app, "Hi", fail_at=0, error=BackendUnavailableError("The model is not ready."))
    r = await post(app, {"messages": user("Hi")})
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    script(app, "Hi", fail_at=0)
    r = await post(app, {"messages": user("Hi")})
    assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"


async def test_an_error_after_the_stream_began_is_an_error_event(app: FastAPI) -> None:
    script(app, "one two three", fail_at=2, error=BackendError("Triton failed the request."))
    r = await post(app, {"messages": user("count"), "stream": True})
    events = parse_sse(r.text)
    check_stream(events)
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "api_error"


async def test_chat_errors_keep_openais_shape(app: FastAPI) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json={"model": "nope", "messages": user("x")},
                         headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("flush_s", [0.0, 0.002])
async def test_a_quiet_stream_gets_pings_and_closing_it_closes_the_source(flush_s: float) -> None:
    gate = asyncio.Event()
    closed = asyncio.Event()

    async def source() -> AsyncGenerator[bytes, None]:
        try:
            yield b"first"
            await gate.wait()
            yield b"second"
            await asyncio.Event().wait()  # never: the consumer leaves first
        finally:
            closed.set()

    first = source()
    stream = coalesced(await anext(first), first, flush_s, PING, 0.01)  # as the Messages route writes it
    assert await anext(stream) == b"first"
    assert b"ping" in await anext(stream)  # nothing came for the interval
    gate.set()
    while (item := await anext(stream)) != b"second":
        assert b"ping" in item
    await stream.aclose()
    assert closed.is_set()


def test_the_plain_text_path_writes_the_same_events_as_the_delta_path() -> None:
    """`StreamedBlocks.text` (a plain answer's per-token path) is `push` of one content delta, byte for byte: blank
    pieces before the first text, the block's start, every text_delta, and the whole block at the end."""
    from openai_api.http.dialects.anthropic_events import StreamedBlocks
    from openai_api.services.output import Delta

    pieces = [" ", "\n", " Hello", ",", "", " \"wörld\"", "\n", "!"]
    fast, slow = StreamedBlocks(), StreamedBlocks()
    got = [b"".join(fast.text(p)) for p in pieces] + [b"".join(fast.close())]
    want = [b"".join(slow.push([Delta("content", p)] if p else [])) for p in pieces] + [b"".join(slow.close())]
    assert got == want and fast.blocks == slow.blocks == [{"type": "text", "text": 'Hello, "wörld"\n!'}]


async def test_anthropic_clients_list_models_in_anthropics_shape(app: FastAPI) -> None:
    """With `anthropic-version` (which the SDKs always send) `/v1/models` is Anthropic's page of model objects:
    the served model and its alias, read by the official SDK's own types; an OpenAI client still gets OpenAI's
    list; an unknown model is Anthropic's 404."""
    import anthropic
    import httpx2  # the SDK's own HTTP client package

    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1")
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url="http://127.0.0.1", http_client=http)
    page = await client.models.list()
    assert [(m.id, m.type) for m in page.data] == [(MODEL, "model"), ("claude-sonnet-4-5", "model")]
    assert page.data[0].created_at.year >= 2026 and page.has_more is False and page.first_id == MODEL
    first = await client.models.list(limit=1)
    assert [m.id for m in first.data] == [MODEL] and first.has_more is True and first.last_id == MODEL
    second = await client.models.list(limit=1, after_id=MODEL)
    assert [m.id for m in second.data] == ["claude-sonnet-4-5"] and second.has_more is False
    before = await client.models.list(before_id="claude-sonnet-4-5")
    assert [m.id for m in before.data] == [MODEL]
    alias = await client.models.retrieve("claude-sonnet-4-5")
    assert alias.display_name == f"claude-sonnet-4-5 ({MODEL})"
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.models.retrieve("claude-nope")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        await client.models.list(limit=0)
    await http.aclose()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        openai_list = (await c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert openai_list["object"] == "list" and openai_list["data"][0]["object"] == "model"

"""What coding agents send on their first turn, over the real app and a fake backend (issue #38): the
recorded requests of Codex CLI (tests/data/openai/codex_request.json: a `namespace` tool, a hosted
`web_search`, developer messages, `include`, `prompt_cache_key`, `client_metadata`; and
codex_catalog_model_request.json: a `custom` apply_patch tool with a Lark grammar and a client
`tool_search`) and of Claude Code under a served model's own name
(tests/data/anthropic/claude_code_served_name_request.json: a `system`-role message inside `messages`,
adaptive thinking with display `updates`, `output_config.effort`, `context_management`), replayed as sent,
and the translation rules behind them, each checked against what the client expects back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_TEMPLATES
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.chat import place_system_messages, template_messages
from openai_api.services.context_edits import CLEARED_RESULT, apply_edits, parse_edits
from openai_api.services.effort import reasoning_kwargs
from openai_api.services.response_input import encrypt_reasoning
from openai_api.settings import Settings
from openai_api.text.templates import ChatTemplate
from tests.anthropic_events import accumulate, check_stream, parse_sse
from tests.helpers import REPO
from tests.unit.fakes import MODEL, llm_only_config, script
from tests.unit.test_responses import EVENT_SCHEMAS as RESPONSE_EVENTS

DATA = REPO / "tests" / "data"
CODEX = json.loads((DATA / "openai" / "codex_request.json").read_text(encoding="utf-8"))
CODEX_CATALOG = json.loads((DATA / "openai" / "codex_catalog_model_request.json").read_text(encoding="utf-8"))
CLAUDE = json.loads((DATA / "anthropic" / "claude_code_served_name_request.json").read_text(encoding="utf-8"))
KEY = "sk-test"
# Streamed events by the vendored OpenAPI schema that describes them.
EVENT_SCHEMAS = {**RESPONSE_EVENTS,
                 "response.custom_tool_call_input.delta": "ResponseCustomToolCallInputDeltaEvent",
                 "response.custom_tool_call_input.done": "ResponseCustomToolCallInputDoneEvent"}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, api_keys=[KEY]))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.context_length = 200_000  # the agents' prompts are long; the fake backend does not care
    yield app
    await app.state.gateway.process.close()


async def post(app: FastAPI, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
               ) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post(path, json=body, headers={"authorization": f"Bearer {KEY}", **(headers or {})})


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for block in r.text.split("\n\n"):
        if block.strip():
            kind, data = block.split("\n", 1)
            event = json.loads(data.removeprefix("data: "))
            assert kind == f"event: {event['type']}"
            out.append(event)
    return out


def codex(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**body, "model": MODEL, **changes}


def chat_requests(app: FastAPI) -> list[ChatCompletionRequest]:
    """The chat requests the app renders prompts for from now on (a spy on `ChatService.prompt`)."""
    captured: list[ChatCompletionRequest] = []
    chat = app.state.gateway.services.chat
    original = chat.prompt

    async def spy(rt: Any, req: ChatCompletionRequest, plan: Any = None) -> Any:
        captured.append(req)
        return await original(rt, req, plan)

    chat.prompt = spy
    return captured


# ------------------------------------------------------------------ Codex over /v1/responses


async def test_codexs_recorded_first_request_is_answered(app: FastAPI, validate: Callable[..., None]) -> None:
    """Codex's own first request, its headers included: a valid event stream; the namespace's functions are
    offered under their flat names, the hosted web_search is left out and named in the header."""
    fake = script(app, "Hi! What shall we work on?")
    r = await post(app, CODEX["path"], codex(CODEX["body"]), CODEX["headers"])
    assert r.status_code == 200, r.text[:2000]
    assert r.headers["x-omitted-tools"] == "web_search"
    events = sse(r)
    for e in events:
        validate(EVENT_SCHEMAS[e["type"]], e)
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][-1]["content"][0]["text"] == "Hi! What shall we work on?"
    assert final["prompt_cache_key"] == CODEX["body"]["prompt_cache_key"]
    assert final["reasoning"] == {"effort": None, "summary": "auto"}
    prompt = fake.requests[0].prompt_text
    for name in ("exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent", "update_goal"):
        assert f'"{name}"' in prompt
    assert "Tools for spawning and managing sub-agents." in prompt  # the namespace's description leads
    assert "external_web_access" not in prompt  # web_search is not offered
    assert "replay:hermes/plain_answer" in prompt and "<permissions instructions>" in prompt  # developer text


async def test_a_namespaced_call_comes_back_under_its_own_name_with_its_namespace(
        app: FastAPI, validate: Callable[..., None]) -> None:
    call = '<tool_call>\n{"name": "multi_agent_v1__spawn_agent", "arguments": {"message": "look"}}\n</tool_call>'
    script(app, call)
    body = codex(CODEX["body"], stream=False)
    plain = (await post(app, "/v1/responses", body)).json()
    validate("Response", plain)
    [item] = plain["output"]
    assert (item["type"], item["name"], item["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
    assert json.loads(item["arguments"]) == {"message": "look"}
    script(app, call)
    events = sse(await post(app, "/v1/responses", codex(CODEX["body"])))
    for e in events:
        validate(EVENT_SCHEMAS[e["type"]], e)
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    done = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert added["name"] == done["name"] == "spawn_agent" and added["namespace"] == done["namespace"]
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"message": "look"}
    # Codex sends the call back with its namespace, and the model sees the flat name it wrote.
    captured = chat_requests(app)
    script(app, "Spawned.")
    result = {"type": "function_call_output", "call_id": item["call_id"], "output": "agent-1"}
    turn = codex(CODEX["body"], stream=False, input=[*CODEX["body"]["input"], item, result])
    r = await post(app, "/v1/responses", turn)
    assert r.status_code == 200, r.text
    *_, asked, answered = captured[0].messages
    assert asked.tool_calls is not None and asked.tool_calls[0].function.name == "multi_agent_v1__spawn_agent"
    assert answered.role == "tool" and answered.content == "agent-1"


async def test_codexs_custom_apply_patch_tool_is_offered_and_called_with_its_raw_input(
        app: FastAPI, validate: Callable[..., None]) -> None:
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"
    call = "<tool_call>\n" + json.dumps({"name": "apply_patch", "arguments": {"input": patch}}) + "\n</tool_call>"
    fake = script(app, call)
    body = codex(CODEX_CATALOG["body"], stream=False)
    r = await post(app, "/v1/responses", body)
    assert r.status_code == 200, r.text
    assert r.headers["x-omitted-tools"] == "web_search"  # tool_search runs in the client: offered
    validate("Response", r.json())
    [item] = r.json()["output"]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch" and item["input"] == patch
    assert "*** Begin Patch" in fake.requests[0].prompt_text  # the Lark grammar is in the description
    assert '"tool_search"' in fake.requests[0].prompt_text
    # Streamed: the input arrives whole in custom_tool_call_input events.
    script(app, call)
    events = sse(await post(app, "/v1/responses", codex(CODEX_CATALOG["body"])))
    for e in events:
        validate(EVENT_SCHEMAS[e["type"]], e)
    assert [e["input"] for e in events if e["type"] == "response.custom_tool_call_input.done"] == [patch]
    assert "response.function_call_arguments.delta" not in [e["type"] for e in events]
    # Its record and output come back as input items; the model sees the call it made.
    fake = script(app, "Done.")
    out = {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "Success. Updated hello.txt"}
    r = await post(app, "/v1/responses", codex(body, input=[*body["input"], item, out]))
    assert r.status_code == 200, r.text
    assert "Success. Updated hello.txt" in fake.requests[0].prompt_text
    assert "*** Add File: hello.txt" in fake.requests[0].prompt_text.split("Success. Updated")[0]


async def test_a_client_tool_search_call_and_the_tools_it_loads(app: FastAPI, validate: Callable[..., None]) -> None:
    deferred = {"type": "function", "name": "deploy", "description": "Deploy the app", "defer_loading": True,
                "parameters": {"type": "object", "properties": {}}}
    search = next(t for t in CODEX_CATALOG["body"]["tools"] if t["type"] == "tool_search")
    fake = script(app, '<tool_call>\n{"name": "tool_search", "arguments": {"query": "deploy"}}\n</tool_call>')
    body = {"model": MODEL, "input": "Deploy it", "tools": [search, deferred]}
    r = (await post(app, "/v1/responses", body)).json()
    validate("Response", r)
    assert '"deploy"' not in fake.requests[0].prompt_text  # deferred: not offered yet
    [item] = r["output"]
    assert item["type"] == "tool_search_call" and item["execution"] == "client"
    assert item["arguments"] == {"query": "deploy"}
    loaded = {"type": "tool_search_output", "call_id": item["call_id"], "execution": "client",
              "tools": [{**deferred, "defer_loading": False}]}
    fake = script(app, "Deploying.")
    r2 = await post(app, "/v1/responses", {**body, "input": [{"role": "user", "content": "Deploy it"}, item, loaded]})
    assert r2.status_code == 200, r2.text
    assert '"deploy"' in fake.requests[0].prompt_text and "loaded_tools" in fake.requests[0].prompt_text


@pytest.mark.parametrize("tool", [
    {"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"},
    {"type": "computer_use_preview", "display_width": 1, "display_height": 1, "environment": "linux"},
    {"type": "mcp", "server_label": "x", "server_url": "https://example.invalid"}, {"type": "local_shell"},
    {"type": "tool_search"}, {"type": "something_new"},
])
async def test_hosted_tools_are_left_out_and_named_never_a_400(app: FastAPI, tool: dict[str, Any]) -> None:
    fake = script(app, "ok")
    r = await post(app, "/v1/responses", {"model": MODEL, "input": "hi", "tools": [tool],
                                          "tool_choice": {"type": tool["type"]}})
    assert r.status_code == 200, r.text
    assert r.headers["x-omitted-tools"] == tool["type"]
    assert fake.requests[0].guide is None  # a hosted tool's choice is not a forced call


async def test_allowed_tools_narrow_what_is_offered(app: FastAPI) -> None:
    fake = script(app, "ok")
    tools = [{"type": "function", "name": n, "parameters": {"type": "object", "properties": {}}}
             for n in ("alpha", "beta")]
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "beta"}]}
    r = await post(app, "/v1/responses", {"model": MODEL, "input": "hi", "tools": tools, "tool_choice": choice})
    assert r.status_code == 200, r.text
    assert '"beta"' in fake.requests[0].prompt_text and '"alpha"' not in fake.requests[0].prompt_text


async def test_reasoning_comes_back_encrypted_when_included_and_is_given_back(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.reasoning_parser = "qwen3"
    script(app, "<think>\nThey want a file listing.\n</think>\n\n<tool_call>\n"
                '{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call>')
    body = codex(CODEX["body"], stream=False)
    out = (await post(app, "/v1/responses", body)).json()["output"]
    reasoning, call = out
    thought = reasoning["content"][0]["text"]
    assert thought.strip() == "They want a file listing."
    assert reasoning["encrypted_content"] == encrypt_reasoning(thought)
    # Codex hands the item back without its text (store false): the thinking still reaches the template.
    back = {k: v for k, v in reasoning.items() if k != "content"}
    captured = chat_requests(app)
    script(app, "Listed.")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}
    r = await post(app, "/v1/responses", codex(body, input=[*body["input"], back, call, result]))
    assert r.status_code == 200, r.text
    turn = next(m for m in captured[0].messages if m.role == "assistant")
    assert (turn.model_extra or {})["reasoning_content"] == thought


@pytest.mark.parametrize("field, value, param", [
    ("reasoning", {"effort": "turbo"}, "reasoning.effort"),
    ("text", {"verbosity": "chatty"}, "text.verbosity"),
    ("truncation", "sometimes", "truncation"),
    ("include", "reasoning.encrypted_content", "include"),
])
async def test_response_fields_with_a_wrong_value_are_a_400_naming_them(app: FastAPI, field: str, value: Any,
                                                                        param: str) -> None:
    script(app, "x")
    r = await post(app, "/v1/responses", {"model": MODEL, "input": "hi", field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# ------------------------------------------------------------------ Claude Code over /v1/messages


async def test_claude_codes_recorded_request_under_a_served_name_is_answered(app: FastAPI) -> None:
    """The request Claude Code sends under a model's own name: its `system` message inside `messages` (the
    environment and agent list) reaches the prompt where it stands, after the user's turn."""
    fake = script(app, "Hello! How can I help?")
    body = {**CLAUDE["body"], "model": MODEL}
    r = await post(app, CLAUDE["path"], body, {**CLAUDE["headers"], "x-api-key": KEY})
    assert r.status_code == 200, r.text[:2000]
    events = parse_sse(r.text)
    check_stream(events)
    message = accumulate(events)
    assert [b["type"] for b in message["content"]] == ["text"]
    assert message["content"][0]["text"] == "Hello! How can I help?"
    assert events[-2]["context_management"] == {"applied_edits": [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 0, "cleared_input_tokens": 0}]}
    prompt = fake.requests[0].prompt_text
    user_at = prompt.index("replay:hermes/plain_answer")
    env_at = prompt.index("You have been invoked in the following environment")
    assert prompt.index("You are a Claude agent") < user_at < env_at  # system prompt, user turn, system turn
    assert "DeferredToolPlaceholder" not in prompt and '"Bash"' in prompt  # defer_loading: left out


async def test_a_system_message_inside_messages_is_folded_for_a_template_that_takes_one(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.template = ChatTemplate.from_file(BUNDLED_TEMPLATES / "mistral.jinja")
    assert not rt.template.renders_system_anywhere
    fake = script(app, "ok")
    body = {"model": MODEL, "max_tokens": 8, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "system", "content": [{"type": "text", "text": "Today is Monday."}]}]}
    r = await post(app, "/v1/messages", body)
    assert r.status_code == 200, r.text
    prompt = fake.requests[0].prompt_text
    assert "Be brief.\n\nToday is Monday." in prompt and prompt.index("Today is Monday.") < prompt.index("Hi")


def test_system_messages_stay_in_place_or_fold_by_what_the_template_renders() -> None:
    msgs = [{"role": "system", "content": "A"}, {"role": "user", "content": "u"}, {"role": "system", "content": "B"}]
    chatml = ChatTemplate.from_file(BUNDLED_TEMPLATES / "chatml.jinja")
    mistral = ChatTemplate.from_file(BUNDLED_TEMPLATES / "mistral.jinja")
    assert place_system_messages(msgs, chatml) == msgs
    assert place_system_messages(msgs, mistral) == [{"role": "system", "content": "A\n\nB"},
                                                    {"role": "user", "content": "u"}]
    assert place_system_messages(msgs[1:], mistral) == [{"role": "system", "content": "B"},
                                                        {"role": "user", "content": "u"}]
    # Developer messages are system messages by the time they are placed.
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "u"}, {"role": "developer", "content": "D"}]})
    assert place_system_messages(template_messages(req.messages, mistral), mistral)[0] == \
        {"role": "system", "content": "D"}


@pytest.mark.parametrize("source, effort, thinking, expected", [
    ("{{ reasoning_effort }}", "xhigh", None, {"reasoning_effort": "high"}),
    ("{{ reasoning_effort }}", "minimal", None, {"reasoning_effort": "low"}),
    ("{{ enable_thinking }}", "none", None, {"enable_thinking": False}),
    ("{{ enable_thinking }}", "max", None, {"enable_thinking": True}),
    ("{{ enable_thinking }}", "low", False, {"enable_thinking": False}),
    ("{{ thinking }}", None, True, {"thinking": True}),
    ("{{ messages }}", "high", True, {}),
])
def test_effort_and_thinking_reach_only_the_controls_a_template_reads(
        source: str, effort: str | None, thinking: bool | None, expected: dict[str, Any]) -> None:
    assert reasoning_kwargs(ChatTemplate.from_string(source), effort, thinking) == expected


async def test_output_config_effort_and_adaptive_thinking_set_the_templates_controls(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.template = ChatTemplate.from_string(
        "{% for m in messages %}{{ m.content }}|{% endfor %}effort={{ reasoning_effort }} think={{ enable_thinking }}")
    fake = script(app, "ok")
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
            "thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "max"}}
    r = await post(app, "/v1/messages", body)
    assert r.status_code == 200, r.text
    assert fake.requests[0].prompt_text.endswith("effort=high think=True")
    fake = script(app, "ok")
    r = await post(app, "/v1/messages", {**body, "thinking": {"type": "disabled"}, "output_config": {"effort": "low"}})
    assert fake.requests[0].prompt_text.endswith("effort=low think=False")


async def test_updates_display_sends_thinking_blocks_without_their_text(app: FastAPI) -> None:
    app.state.gateway.services.registry.llm(MODEL).reasoning_parser = "qwen3"
    script(app, "<think>private steps</think>Answer.")
    body = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "Q"}],
            "thinking": {"type": "adaptive", "display": "updates"}}
    r = (await post(app, "/v1/messages", body)).json()
    assert r["content"][0]["type"] == "thinking" and r["content"][0]["thinking"] == ""
    assert r["content"][0]["signature"] and r["content"][1]["text"] == "Answer."


# ------------------------------------------------------------------ context editing


def _history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for k in range(n):
        out.append({"role": "assistant", "content": "", "reasoning_content": f"think {k}",
                    "tool_calls": [{"id": f"t{k}", "type": "function",
                                    "function": {"name": "Read" if k else "Bash", "arguments": '{"x": 1}'}}]})
        out.append({"role": "tool", "tool_call_id": f"t{k}", "content": "word " * 50})
    return out


async def _words(text: str) -> int:
    return len(text.split())


async def test_clear_thinking_keeps_the_last_turns_thinking() -> None:
    edits = parse_edits({"edits": [{"type": "clear_thinking_20251015",
                                    "keep": {"type": "thinking_turns", "value": 2}}]})
    out, applied = await apply_edits(edits, _history(4), None, _words)
    assert [m.get("reasoning_content") for m in out if m["role"] == "assistant"] == \
        [None, None, "think 2", "think 3"]
    assert applied.body() == {"applied_edits": [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2,
                                                 "cleared_input_tokens": 4}]}
    kept, _ = await apply_edits(parse_edits({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
                                _history(4), None, _words)
    assert kept == _history(4)


async def test_clear_tool_uses_clears_the_oldest_results_past_the_trigger() -> None:
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100},
            "keep": {"type": "tool_uses", "value": 1}, "exclude_tools": ["Bash"], "clear_tool_inputs": True}
    history = _history(4)
    out, applied = await apply_edits(parse_edits({"edits": [edit]}), history, 250, _words)
    results = [m["content"] for m in out if m["role"] == "tool"]
    assert results[0] == "word " * 50  # Bash is excluded
    assert results[1:3] == [CLEARED_RESULT, CLEARED_RESULT] and results[3] == "word " * 50  # the last is kept
    assert out[3]["tool_calls"][0]["function"]["arguments"] == "{}"  # its input cleared too
    placeholder = len(CLEARED_RESULT.split())
    assert applied.edits == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2,
                              "cleared_input_tokens": 2 * (50 - placeholder + 2)}]
    assert history == _history(4)  # the client's messages are not changed
    # Under the trigger: nothing; a clear_at_least more than there is to clear: nothing.
    _, applied = await apply_edits(parse_edits({"edits": [edit]}), history, 99, _words)
    assert applied.edits[0]["cleared_tool_uses"] == 0
    least = {**edit, "clear_at_least": {"type": "input_tokens", "value": 10_000}}
    out, applied = await apply_edits(parse_edits({"edits": [least]}), history, 250, _words)
    assert applied.edits[0]["cleared_tool_uses"] == 0 and out == history


async def test_context_management_is_applied_and_reported_plain_and_streamed(app: FastAPI) -> None:
    tools_result = [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "old output " * 20}
                    for k in range(3)]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{k}", "name": "Read",
                                                   "input": {"k": k}} for k in range(3)]},
                {"role": "user", "content": tools_result}]
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
            "keep": {"type": "tool_uses", "value": 1}}
    body = {"model": MODEL, "max_tokens": 8, "messages": messages, "context_management": {"edits": [edit]},
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}]}
    fake = script(app, "done")
    plain = (await post(app, "/v1/messages", body)).json()
    [applied] = plain["context_management"]["applied_edits"]
    assert applied["cleared_tool_uses"] == 2 and applied["cleared_input_tokens"] > 0
    assert fake.requests[0].prompt_text.count(CLEARED_RESULT) == 2
    assert fake.requests[0].prompt_text.count("old output") == 20
    script(app, "done")
    events = parse_sse((await post(app, "/v1/messages", {**body, "stream": True})).text)
    check_stream(events)
    assert events[-2]["context_management"] == plain["context_management"]
    counted = (await post(app, "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"}))
    assert counted.json()["input_tokens"] == plain["usage"]["input_tokens"]


# ------------------------------------------------------------------ Anthropic structured outputs

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "integer"}},
          "required": ["city", "temp"], "additionalProperties": False}


@pytest.mark.parametrize("field", ["output_config", "output_format"])
async def test_a_json_schema_output_is_guided_plain_and_streamed(app: FastAPI, field: str) -> None:
    fmt = {"type": "json_schema", "schema": SCHEMA}
    body = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "Weather?"}],
            field: {"format": fmt} if field == "output_config" else fmt}
    answer = '{"city": "Oslo", "temp": 3}'
    fake = script(app, answer)
    plain = (await post(app, "/v1/messages", body)).json()
    assert json.loads(plain["content"][0]["text"]) == {"city": "Oslo", "temp": 3}
    guide = fake.requests[0].guide
    assert guide is not None and guide.kind == "json_schema" and json.loads(guide.value or "") == SCHEMA
    fake = script(app, answer)
    events = parse_sse((await post(app, "/v1/messages", {**body, "stream": True})).text)
    check_stream(events)
    assert accumulate(events)["content"][0]["text"] == plain["content"][0]["text"]
    assert fake.requests[0].guide is not None and fake.requests[0].guide.kind == "json_schema"


@pytest.mark.parametrize("extra, where", [
    ({"output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "("}}}}}}, "output_config.format.schema"),
    ({"tools": [{"name": "f", "strict": True, "input_schema": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(["}}}}]}, "tools[0].input_schema"),
])
async def test_what_cannot_be_compiled_is_a_400_naming_the_field(app: FastAPI, extra: dict[str, Any],
                                                                 where: str) -> None:
    script(app, "x")
    r = await post(app, "/v1/messages", {"model": MODEL, "max_tokens": 8,
                                         "messages": [{"role": "user", "content": "Hi"}], **extra})
    assert r.status_code == 400, r.text
    assert where in r.json()["error"]["message"]


async def test_a_backend_without_guided_decoding_refuses_the_format_by_its_own_name(app: FastAPI) -> None:
    fake = script(app, "x")
    fake.guide_kinds = frozenset()
    r = await post(app, "/v1/messages", {"model": MODEL, "max_tokens": 8,
                                         "messages": [{"role": "user", "content": "Hi"}],
                                         "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "output_config.format.schema" in message and "response_format" not in message


async def test_a_forced_strict_tool_is_guided_by_its_schema(app: FastAPI) -> None:
    fake = script(app, '{"city": "Oslo", "temp": 3}')
    tool = {"name": "report", "strict": True, "input_schema": SCHEMA}
    r = (await post(app, "/v1/messages", {"model": MODEL, "max_tokens": 32, "tools": [tool],
                                          "tool_choice": {"type": "tool", "name": "report"},
                                          "messages": [{"role": "user", "content": "Weather?"}]})).json()
    assert r["content"][0]["input"] == {"city": "Oslo", "temp": 3}
    guide = fake.requests[0].guide
    assert guide is not None and json.loads(guide.value or "") == SCHEMA

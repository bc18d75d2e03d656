"""`/v1/responses/input_tokens` and `/v1/responses/compact` over the real app and a fake backend: the count equals
the `usage.input_tokens` of the same request, the compacted response validates against OpenAI's schema and a
following `/v1/responses` takes it as input, and a compaction item is read back only when it is intact; keys and
the allow-list apply as on `/v1/responses`."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.services.compaction import COMPACTION_TAG, MAX_SUMMARY_CHARS, read_compaction, write_compaction
from openai_api.services.response_ops import COMPACT_PROMPT
from openai_api.settings import Settings
from tests.unit.fakes import MODEL, llm_only_config, script
from tests.unit.test_responses import TOOL

KEYS = [{"name": "a", "secret_sha256": hashlib.sha256(b"sk-a").hexdigest()},
        {"name": "embed-only", "secret_sha256": hashlib.sha256(b"sk-e").hexdigest(), "models": ["all-minilm-*"]}]
A, EMBED = {"authorization": "Bearer sk-a"}, {"authorization": "Bearer sk-e"}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": KEYS}), encoding="utf-8")
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, keys_file=keys, responses_store=8))
    yield app
    await app.state.gateway.process.close()


async def post(app: FastAPI, path: str, body: dict[str, Any], key: dict[str, str] = A) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post(path, json={"model": MODEL, **body}, headers=key)


CONVERSATION = [
    {"type": "message", "role": "user", "content": "What time is it in UTC?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": '{"tz": "UTC"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is noon."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks. And in Paris?"}]},
]


@pytest.mark.parametrize("body", [
    {"input": "Hello"},
    {"input": CONVERSATION, "instructions": "Be brief.", "tools": [TOOL], "reasoning": {"effort": "low"}},
])
async def test_input_tokens_equal_the_usage_the_same_request_reports(app: FastAPI, validate: Callable[..., None],
                                                                    body: dict[str, Any]) -> None:
    counted = await post(app, "/v1/responses/input_tokens", body)
    assert counted.status_code == 200, counted.text
    validate("TokenCountsResource", counted.json())
    script(app, "Fine.")
    used = (await post(app, "/v1/responses", body)).json()["usage"]["input_tokens"]
    assert counted.json() == {"object": "response.input_tokens", "input_tokens": used}


async def test_input_tokens_count_a_prompt_that_leaves_no_room_to_answer(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    counted = (await post(app, "/v1/responses/input_tokens", {"input": "Hi"})).json()["input_tokens"]
    rt.context_length = counted  # the prompt fills the context: /v1/responses refuses it, counting does not
    assert (await post(app, "/v1/responses", {"input": "Hi"})).json()["error"]["code"] == "context_length_exceeded"
    assert (await post(app, "/v1/responses/input_tokens", {"input": "Hi"})).json()["input_tokens"] == counted


async def test_input_tokens_follow_a_stored_previous_response(app: FastAPI) -> None:
    script(app, "Noted: the code word is quokka.")
    first = (await post(app, "/v1/responses", {"input": "Remember quokka.", "store": True})).json()
    alone = (await post(app, "/v1/responses/input_tokens", {"input": "And?"})).json()["input_tokens"]
    after = await post(app, "/v1/responses/input_tokens", {"input": "And?", "previous_response_id": first["id"]})
    assert after.json()["input_tokens"] > alone
    script(app, "Quokka.")
    second = (await post(app, "/v1/responses", {"input": "And?", "previous_response_id": first["id"]})).json()
    assert second["usage"]["input_tokens"] == after.json()["input_tokens"]


async def test_keys_and_the_allow_list_apply(app: FastAPI) -> None:
    r = await post(app, "/v1/responses/input_tokens", {"input": "Hi"}, key={})
    assert r.status_code == 401
    for path in ("/v1/responses/input_tokens", "/v1/responses/compact"):
        r = await post(app, path, {"input": "Hi"}, key=EMBED)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text


async def test_compact_summarizes_and_the_next_response_reads_the_summary(app: FastAPI,
                                                                        validate: Callable[..., None]) -> None:
    summary = "The user asked the time in UTC (noon) and then in Paris."
    fake = script(app, summary)
    r = await post(app, "/v1/responses/compact", {"input": CONVERSATION, "instructions": "Be brief."})
    assert r.status_code == 200, r.text
    body = r.json()
    validate("CompactResource", body)
    assert body["object"] == "response.compaction" and body["id"].startswith("resp_")
    *users, compaction = body["output"]
    assert [u["content"][0]["text"] for u in users] == ["What time is it in UTC?", "Thanks. And in Paris?"]
    assert all(u["role"] == "user" and u["type"] == "message" for u in users)
    assert compaction["type"] == "compaction" and compaction["id"].startswith("cmp_")
    assert read_compaction(compaction["encrypted_content"], "x") == summary
    # The summary was asked of the served model, after the whole conversation, with no tools.
    prompt = fake.requests[0].prompt_text
    assert COMPACT_PROMPT in prompt and "12:00" in prompt and "get_time" not in prompt.split(COMPACT_PROMPT)[1]
    assert body["usage"]["input_tokens"] == len(fake.requests[0].prompt_ids)
    assert fake.requests[0].max_tokens == 2048
    script(app, "Short.")
    short = await post(app, "/v1/responses/compact", {"input": "Hi", "max_output_tokens": 16})
    assert app.state.gateway.services.registry.llm(MODEL).backend.requests[0].max_tokens == 16, short.text
    # The compacted output, then the next turn, is the next request's input: the model reads the summary.
    fake = script(app, "In Paris it is 13:00.")
    nxt = await post(app, "/v1/responses", {"input": [*body["output"],
                                                      {"role": "user", "content": "So what time is it there?"}]})
    assert nxt.status_code == 200, nxt.text
    prompt = fake.requests[0].prompt_text
    assert "then in Paris." in prompt and "So what time is it there?" in prompt and "12:00" not in prompt


async def test_compact_of_a_stored_conversation_keeps_its_user_messages(app: FastAPI) -> None:
    script(app, "Noted.")
    first = (await post(app, "/v1/responses", {"input": "Remember quokka.", "store": True})).json()
    script(app, "A quokka was to be remembered.")
    body = (await post(app, "/v1/responses/compact", {"previous_response_id": first["id"]})).json()
    *users, compaction = body["output"]
    assert [u["content"][0]["text"] for u in users] == ["Remember quokka."] and compaction["type"] == "compaction"


@pytest.mark.parametrize("content", [
    "openai-encrypted-blob", COMPACTION_TAG + "not base64!", COMPACTION_TAG + base64.b64encode(b"\xff\xfe").decode(),
    COMPACTION_TAG + "A" * (MAX_SUMMARY_CHARS * 6), 42,
])
async def test_a_compaction_item_not_made_here_is_a_400_naming_it(app: FastAPI, content: Any) -> None:
    script(app, "x")
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": content}
    r = await post(app, "/v1/responses", {"input": [{"role": "user", "content": "Hi"}, item]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input[1].encrypted_content"
    assert r.json()["error"]["code"] == "invalid_encrypted_content"


def test_the_compaction_codec_round_trips_any_text() -> None:
    for text in ("", "plain", "ünïcødé ✓ 🦘", "x" * 10_000):
        assert read_compaction(write_compaction(text), "input[0]") == text


# Codex's remote compaction v2: `/v1/responses` with a final `compaction_trigger` item answers one `compaction`
# output item (Codex fails the turn on anything else: "expected exactly one compaction output item").
TRIGGER = {"type": "compaction_trigger"}


async def test_a_compaction_trigger_answers_one_compaction_item(app: FastAPI, validate: Callable[..., None]) -> None:
    summary = "The user asked the time in UTC (noon) and then in Paris."
    fake = script(app, summary)
    r = await post(app, "/v1/responses", {"input": [*CONVERSATION, TRIGGER], "store": True, "tools": [TOOL]})
    assert r.status_code == 200, r.text
    body = r.json()
    validate("Response", body)
    assert body["object"] == "response" and body["status"] == "completed"
    [item] = body["output"]
    assert item["type"] == "compaction" and read_compaction(item["encrypted_content"], "x") == summary
    prompt = fake.requests[0].prompt_text
    assert COMPACT_PROMPT in prompt and "12:00" in prompt and "compaction_trigger" not in prompt
    assert body["usage"]["input_tokens"] == len(fake.requests[0].prompt_ids)
    # Stored as the compacted conversation: a follow-up reads the user messages and the summary, not the turns.
    fake = script(app, "In Paris it is 13:00.")
    nxt = await post(app, "/v1/responses", {"input": "So what time is it there?", "previous_response_id": body["id"]})
    assert nxt.status_code == 200, nxt.text
    prompt = fake.requests[0].prompt_text
    assert "then in Paris." in prompt and "Thanks. And in Paris?" in prompt and "12:00" not in prompt


async def test_a_streamed_compaction_trigger_is_the_items_events(app: FastAPI, validate: Callable[..., None]) -> None:
    from tests.unit.test_agent_requests import EVENT_SCHEMAS

    script(app, "Summary.")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/responses", headers=A, json={"model": MODEL, "stream": True,
                                                             "input": [*CONVERSATION, TRIGGER]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                           "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(5))
    for e in events:
        validate(EVENT_SCHEMAS[e["type"]], e)
    [item] = events[-1]["response"]["output"]
    assert item == events[2]["item"] == events[3]["item"] and read_compaction(item["encrypted_content"], "x") == \
        "Summary."


@pytest.mark.parametrize("items, at", [([TRIGGER, {"role": "user", "content": "Hi"}], 0),
                                       ([{"role": "user", "content": "Hi"}, TRIGGER, TRIGGER], 1)])
async def test_a_compaction_trigger_must_be_last_and_alone(app: FastAPI, items: list[Any], at: int) -> None:
    fake = script(app, "x")
    r = await post(app, "/v1/responses", {"input": items})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"input[{at}]" and not fake.requests
    r = await post(app, "/v1/responses", {"input": [{"role": "user", "content": "Hi"}, TRIGGER], "background": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"

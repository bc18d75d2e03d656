"""Tool calling on real SmolLM2 output through the gateway and Triton.

SmolLM2-135M's template ignores `tools`, so the gateway describes them in a system message; a named
`tool_choice` is enforced by a guide (the function's parameters schema) that the reference model applies
token by token, which is how so small a model always makes the call (see test_structured_outputs.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.conftest import API_KEY, LLM, GatewayServer

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Get the current time in a timezone",
                                      "parameters": {"type": "object",
                                                     "properties": {"timezone": {"type": "string"}}}}},
]
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
FORCE = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def test_named_tool_choice_gives_a_parsed_call(client: openai.OpenAI, http: httpx.Client,
                                               openai_schema: Callable[..., None]) -> None:
    r = client.chat.completions.create(model=LLM, messages=ASK, tools=TOOLS, tool_choice=FORCE, temperature=0,
                                       max_tokens=60)  # type: ignore[arg-type]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(calls[0].function.arguments), dict)  # type: ignore[union-attr]
    assert calls[0].id.startswith("call_")
    raw = http.post("/v1/chat/completions", json={"model": LLM, "messages": ASK, "tools": TOOLS,
                                                  "tool_choice": FORCE, "temperature": 0, "max_tokens": 60})
    openai_schema("CreateChatCompletionResponse", raw.json())


def test_streamed_tool_call_deltas_come_as_openai_sends_them(http: httpx.Client,
                                                             openai_schema: Callable[..., None]) -> None:
    body = {"model": LLM, "messages": ASK, "tools": TOOLS, "tool_choice": FORCE, "temperature": 0,
            "max_tokens": 60, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        blocks = [b[6:] for b in resp.read().split(b"\n\n") if b.strip()]
    assert blocks[-1] == b"[DONE]"
    chunks = [orjson.loads(b) for b in blocks[:-1]]
    for c in chunks:
        openai_schema("CreateChatCompletionStreamResponse", c)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    tool_deltas = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    first, *rest = tool_deltas
    assert first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    args = "".join(t["function"]["arguments"] for t in rest)
    assert isinstance(json.loads(args), dict)
    content = "".join(d.get("content") or "" for d in deltas)
    assert "<tool_call>" not in content and "arguments" not in content
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_round_trip_with_a_tool_message(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=LLM, messages=ASK, tools=TOOLS, tool_choice=FORCE, temperature=0,
                                           max_tokens=60)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    result = '{"temperature_c": 21, "sky": "sunny"}'
    messages: list[Any] = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": result}]
    r = client.chat.completions.create(model=LLM, messages=messages, tools=TOOLS, temperature=0, max_tokens=40)
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_answers_in_plain_text(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=LLM, messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=20)  # type: ignore[arg-type]
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0]"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format.json_schema.schema.not"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages[0].content[0]"),
])
def test_refused_parameters_get_400_naming_them(http: httpx.Client, extra: dict, param: str) -> None:
    body = {"model": LLM, "messages": ASK, "tools": TOOLS, "max_tokens": 5, **extra}
    r = http.post("/v1/chat/completions", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_logprobs_for_sampled_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=LLM, messages=ASK, temperature=0, max_tokens=8, logprobs=True)
    entries = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries and len(entries) == r.usage.completion_tokens  # type: ignore[union-attr]
    assert all(e.logprob <= 0 for e in entries)
    assert "".join(e.token for e in entries).strip() == (r.choices[0].message.content or "").strip()

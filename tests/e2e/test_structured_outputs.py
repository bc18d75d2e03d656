"""Constrained decoding end to end: real clients, the real gateway, a real Triton whose reference models
enforce guides with xgrammar token by token, on every protocol that carries a guide (TensorRT-LLM
tensors, the vLLM backend's sampling parameters) and a clear 400 on the one that cannot
(FasterTransformer).

The model is a 135M-parameter SmolLM2 sampled at temperature 0.8 and asked things that have nothing to
do with the tools or the schema: left alone it answers in prose, so every valid call and object here is
the guide's doing. Strings in the schemas are bounded (maxLength) so a small model's answers end
within the token budget.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.conftest import API_KEY, LLM, GatewayServer

VARIANTS = [LLM, f"{LLM}-vllm"]  # the TensorRT-LLM and vLLM protocol variants, both guided
FT = f"{LLM}-ft"
PROMPTS = ["What is the capital of France?", "Write a haiku about rain.", "Tell me a joke about cats.",
           "What should I cook tonight?", "Explain photosynthesis briefly.", "Is it going to rain in Oslo?",
           "Who wrote Hamlet?", "Give me three colours.", "What time is it in Tokyo?", "Say hello."]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "maxLength": 12},
                                     "hours_ahead": {"type": "integer", "minimum": 0, "maximum": 12}},
    "required": ["tz", "hours_ahead"]}}}
# Forced calls are tried this many times per protocol (every second one streamed, so 2 plain and 2 streamed):
# a guide that holds does so on every try; left alone the model answers these prompts in prose (module docstring).
# (6 tries cost the test command ~3 minutes of the real model's CPU decoding; 4 still cover each protocol both ways.)
TRIES = 4
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
PROFILE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]},
                                                 "legs": {"type": "integer", "minimum": 0, "maximum": 4}},
                "required": ["kind", "legs"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "age", "mood", "pet", "tags"],
}


class City(BaseModel):
    name: str = Field(max_length=16)
    country: str = Field(max_length=16)
    population_millions: int = Field(ge=0, le=50)
    kind: Literal["capital", "town"]


class Stop(BaseModel):
    city: str = Field(max_length=12)
    kind: Literal["capital", "town"]


class Trip(BaseModel):
    """Nested: pydantic writes Stop once under `$defs` and refers to it (`$ref`) from both fields, the schema
    shape instructor, LangChain, pydantic-ai and the Agents SDK send for nested models (issue #34)."""

    start: Stop
    end: Stop


TRIP = Trip.model_json_schema()
assert "$defs" in TRIP


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, timeout=300, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def aclient(gateway: GatewayServer) -> Callable[[], openai.AsyncOpenAI]:
    """A new async client per event loop (each test runs its own `asyncio.run`)."""
    return lambda: openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, timeout=300, max_retries=0)


async def _call(aclient: openai.AsyncOpenAI, model: str, prompt: str, stream: bool, **kw: Any) -> dict[str, Any]:
    """One chat request; the answer's tool calls and finish reason, assembled from deltas when streamed."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.8, "max_tokens": 120,
            **kw}
    if not stream:
        r = await aclient.chat.completions.create(**body)
        msg = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        return {"calls": calls, "finish": r.choices[0].finish_reason, "content": msg.content}
    parts: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    content, finish = "", None
    async for chunk in await aclient.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            if d.function and d.function.name:
                names[d.index] = d.function.name
            parts.setdefault(d.index, []).append((d.function.arguments if d.function else "") or "")
        finish = chunk.choices[0].finish_reason or finish
    return {"calls": [(names[k], "".join(parts[k])) for k in sorted(parts)], "finish": finish, "content": content}


def _assert_valid_calls(result: dict[str, Any], allowed: set[str]) -> None:
    assert result["finish"] == "tool_calls", result
    assert result["calls"] and not result["content"], result
    for name, arguments in result["calls"]:
        assert name in allowed, result
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _both_variants(aclient: Callable[[], openai.AsyncOpenAI], **kw: Any) -> dict[str, list[dict[str, Any]]]:
    """The first `TRIES` prompts on both guided variants at once (each variant is its own Triton model
    instance, so they decode in parallel), every second one streamed; results per variant, in prompt order."""

    async def run() -> list[dict[str, Any]]:
        async with aclient() as c:
            return list(await asyncio.gather(*(_call(c, m, p, stream=bool(i % 2), **kw)
                                               for m in VARIANTS for i, p in enumerate(PROMPTS[:TRIES]))))

    results = asyncio.run(run())
    return {m: results[k * TRIES:(k + 1) * TRIES] for k, m in enumerate(VARIANTS)}


def test_a_named_tool_choice_always_returns_that_call_with_valid_arguments(
        aclient: Callable[[], openai.AsyncOpenAI]) -> None:
    by_variant = _both_variants(aclient, tools=[WEATHER, TIME],
                                tool_choice={"type": "function", "function": {"name": "get_time"}})
    for model, results in by_variant.items():
        for r in results:
            _assert_valid_calls(r, {"get_time"})
            assert len(r["calls"]) == 1, (model, r)
        assert len(results) == TRIES  # every try on each protocol, streamed and plain


def test_required_always_returns_calls_to_offered_functions(aclient: Callable[[], openai.AsyncOpenAI]) -> None:
    by_variant = _both_variants(aclient, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    for model, results in by_variant.items():
        for r in results:
            _assert_valid_calls(r, {"get_weather", "get_time"})
            assert len(r["calls"]) == 1, (model, r)


def test_structured_objects_validate_on_every_try(aclient: Callable[[], openai.AsyncOpenAI]) -> None:
    """openai's `parse` with a pydantic model, and a schema with enums, bounded integers, nested objects and
    arrays, on both variants at once."""

    async def run() -> tuple[list[Any], list[Any]]:
        async with aclient() as c:
            parsed = asyncio.gather(*(c.chat.completions.parse(
                model=m, messages=[{"role": "user", "content": p}], response_format=City, temperature=0.8,
                max_tokens=120) for m in VARIANTS for p in PROMPTS[:3]))
            profiles = asyncio.gather(*(c.chat.completions.create(
                model=m, messages=[{"role": "user", "content": p}], temperature=0.8, max_tokens=150,
                response_format={"type": "json_schema", "json_schema": {"name": "profile", "schema": PROFILE,
                                                                        "strict": True}})
                for m in VARIANTS for p in PROMPTS[3:5]))
            return list(await parsed), list(await profiles)

    parsed, profiles = asyncio.run(run())
    for r in parsed:
        assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, City), r
    for r in profiles:
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), PROFILE)


def test_langchain_with_structured_output_both_methods(gateway: GatewayServer) -> None:
    """A nested model (`$defs`: `json_schema` sends them; `function_calling` inlines them first)."""
    from langchain_openai import ChatOpenAI

    for model in VARIANTS:
        llm = ChatOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, model=model, temperature=0.8,  # type: ignore[arg-type]
                         max_tokens=120, max_retries=0)
        for method in ("json_schema", "function_calling"):
            trip = llm.with_structured_output(Trip, method=method).invoke("Plan a trip between two cities.")
            assert isinstance(trip, Trip), (model, method, trip)


def test_instructor_tools_and_json_schema_modes(gateway: GatewayServer) -> None:
    """A nested model: `TOOLS` forces the named tool (its parameters hold `$defs`), `JSON_SCHEMA` sends them as
    the response format."""
    import instructor

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY), mode=mode)
        for model in VARIANTS:
            trip = client.chat.completions.create(model=model, response_model=Trip, max_retries=0, temperature=0.8,
                                                  max_tokens=120,
                                                  messages=[{"role": "user", "content": "Plan a trip."}])
            assert isinstance(trip, Trip), (mode, model, trip)


def test_required_with_a_nested_schema_on_chat_and_responses(aclient: Callable[[], openai.AsyncOpenAI]) -> None:
    """`tool_choice: "required"` wraps each tool's parameters in the guide (`{"name": ..., "arguments": ...}`);
    a tool whose parameters hold `$defs` + `$ref` (a pydantic model's nested types) once failed there with 502.
    Now a valid call on both guided protocols, plain and streamed, and through the Responses API."""
    trip_tool = {"type": "function", "function": {"name": "plan_trip", "description": "Plan a trip",
                                                  "parameters": TRIP}}

    async def run() -> tuple[list[dict[str, Any]], Any]:
        async with aclient() as c:
            chats = asyncio.gather(*(_call(c, m, PROMPTS[i], stream=bool(i), tools=[trip_tool, WEATHER],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=90)
                                     for m in VARIANTS for i in range(2)))
            response = c.responses.create(model=LLM, input=PROMPTS[2], tool_choice="required", temperature=0.8,
                                          max_output_tokens=90, tools=[{"type": "function", "name": "plan_trip",
                                                                        "parameters": TRIP}])
            return list(await chats), await response

    chats, response = asyncio.run(run())
    for r in chats:
        assert r["finish"] == "tool_calls" and len(r["calls"]) == 1 and not r["content"], r
        [(name, arguments)] = r["calls"]
        if name == "plan_trip":
            Trip.model_validate_json(arguments)
        else:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    [call] = [o for o in response.output if o.type == "function_call"]
    assert call.name == "plan_trip" and isinstance(Trip.model_validate_json(call.arguments), Trip)


@pytest.mark.parametrize("model", VARIANTS)
def test_a_schema_the_backend_cannot_compile_is_a_400_naming_the_tool(client: openai.OpenAI, model: str) -> None:
    """A schema the gateway passes but xgrammar refuses (a required property whose schema is `false`): the
    reference model's refusal comes back as the client's 400 naming the tool's schema, never a 5xx."""
    never = {"type": "object", "properties": {"a": False}, "required": ["a"]}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       tools=[{"type": "function", "function": {"name": "never", "parameters": never}}],
                                       tool_choice="required")
    error = e.value.body
    assert isinstance(error, dict) and error["code"] == "unsupported_schema", error
    assert error["param"] == "tools[0].function.parameters" and "'never'" in error["message"], error
    assert "cannot accept any value" in error["message"], error


@pytest.mark.parametrize("model", VARIANTS)
def test_json_object_returns_a_json_object(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe a cat."}],
                                       response_format={"type": "json_object"}, temperature=0.8, max_tokens=60)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    else:  # cut by max_tokens mid-object: the text as produced, and it is still the start of an object
        assert (r.choices[0].message.content or "").startswith("{")


def test_vllm_style_guided_fields_on_completions_and_chat(client: openai.OpenAI) -> None:
    for model in VARIANTS:
        r = client.completions.create(model=model, prompt="The weather today is", max_tokens=10,
                                      extra_body={"guided_choice": ["sunny", "rainy"]})
        assert r.choices[0].text in ("sunny", "rainy"), r.choices[0].text
        r2 = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Pick a number."}],
                                            max_tokens=10, extra_body={"guided_regex": "[1-9][0-9]?"})
        assert (r2.choices[0].message.content or "").isdigit(), r2.choices[0].message.content


def test_a_regex_or_grammar_too_large_to_compile_promptly_is_a_400_naming_it(client: openai.OpenAI) -> None:
    """A 100,000-character regex or grammar never reaches Triton (whose grammar engine would spend seconds
    compiling it before the first token): a clear 400 from the gateway, like an oversized schema."""
    huge_regex = "(" + "|".join(f"w{i}" for i in range(20_000)) + ")"
    huge_grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(15_000))
    for extra, param in (({"guided_regex": huge_regex}, "guided_regex"),
                         ({"structured_outputs": {"grammar": huge_grammar}}, "structured_outputs.grammar")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=VARIANTS[0], messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=5, extra_body=extra)
        err = e.value.body
        assert isinstance(err, dict) and err["param"] == param and err["code"] == "guide_too_large", err


def test_fastertransformer_cannot_enforce_a_guide_and_says_so(client: openai.OpenAI) -> None:
    for kw, param in ((dict(response_format={"type": "json_object"}), "response_format"),
                      (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                       "tool_choice")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=FT, messages=[{"role": "user", "content": "hi"}], max_tokens=5, **kw)
        err = e.value.body
        assert isinstance(err, dict) and err["param"] == param and err["code"] == "unsupported_parameter", err
        assert "cannot enforce" in err["message"]


def test_models_show_their_capabilities(client: openai.OpenAI) -> None:
    cards = {m.id: m.model_dump() for m in client.models.list()}
    for model in VARIANTS:
        caps = cards[model]["capabilities"]
        assert caps["structured_outputs"] is True and "json_schema" in caps["guided_types"] and caps["tools"]
    assert cards[FT]["capabilities"]["structured_outputs"] is False

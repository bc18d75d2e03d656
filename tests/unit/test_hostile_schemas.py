"""Schemas and bodies the gateway cannot check (issue #20): nested deep, huge, `$ref` loops and long
`$ref` chains, in `response_format`, `tools` and every other place a client's JSON is walked. Each is
a 200 or a 400 naming the parameter and the limit, never a 5xx; the app runs in-process with a fake
backend (no Triton), and the oracle is the limits as the docs state them
(docs/guides/structured-outputs.md)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig
from openai_api.errors import InvalidRequestError
from openai_api.services.bounds import find_excess
from openai_api.services.guides import check_schema
from openai_api.settings import Settings
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend, llm_only_config

MODEL = "smollm2-135m-instruct"
AUTH = {"Authorization": "Bearer k1"}
# The docs' limits (written out here, not imported: the test checks what the docs promise).
DEPTH, VALUES, HOPS, OPTIONAL = 128, 50_000, 32, 1000


def nested(levels: int) -> dict[str, Any]:
    """An object schema `levels` objects deep (each adds two levels of JSON: the object and `properties`)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def dumps(value: Any) -> bytes:
    """JSON text of `value` however deep (the test's own encoder needs the room, not the gateway)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))
    try:
        return json.dumps(value).encode()
    finally:
        sys.setrecursionlimit(limit)


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5000)}}
WIDE_REQUIRED = {**WIDE, "required": list(WIDE["properties"])}
ENUM = {"type": "object", "properties": {"e": {"enum": list(range(100_000))}}}
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
TREE = {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array",
                                                                                   "items": {"$ref": "#"}}}}
SCHEMAS: dict[str, tuple[Any, str | None]] = {  # name -> (schema, the code of its 400 where it is checked)
    "depth-50": (nested(50), None),
    "depth-70": (nested(70), "too_deeply_nested"),  # 141 levels: read by the parser, past the gateway's 128
    "depth-200": (nested(200), "too_deeply_nested"),
    "depth-2000": (nested(2000), "too_deeply_nested"),
    "5000-properties": (WIDE_REQUIRED, None),  # OpenAI's own limit, all required as its strict mode wants
    "5000-optional-properties": (WIDE, "schema_too_large"),  # the grammar engine would compile for minutes
    "100k-enum": (ENUM, "schema_too_large"),
    "ref-cycle": (CYCLE, "unsupported_schema"),
    "recursive-tree": (TREE, None),
}
ASK = [{"role": "user", "content": "x"}]


def places(schema: Any) -> dict[str, tuple[str, dict[str, Any], bool]]:
    """place -> (path, body, whether the gateway checks the schema there: a forced call's parameters are
    the guide; an offered tool's are only shown to the model)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    chat = {"model": MODEL, "messages": ASK, "max_tokens": 4}
    return {
        "chat.response_format": ("/v1/chat/completions", {**chat, "response_format": fmt}, True),
        "chat.tools.required": ("/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": "required"}, True),
        "chat.tools.named": ("/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": {
            "type": "function", "function": {"name": "f"}}}, True),
        "chat.tools.auto": ("/v1/chat/completions", {**chat, "tools": [tool]}, False),
        "chat.guided_json": ("/v1/chat/completions", {**chat, "guided_json": schema}, True),
        "completions.response_format": ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4,
                                                            "response_format": fmt}, True),
        "responses.text.format": ("/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 4, "text": {
            "format": {"type": "json_schema", "name": "x", "schema": schema}}}, True),
        "responses.tools": ("/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 4, "tools": [
            {"type": "function", "name": "f", "parameters": schema}], "tool_choice": "required"}, True),
        "tokenize.tools": ("/tokenize", {"model": MODEL, "messages": ASK, "tools": [tool]}, False),
    }


if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> GatewayConfig:
    return llm_only_config(tmp_path_factory.mktemp("config"), url="127.0.0.1:1")


@pytest.fixture(scope="module")
async def app(config: GatewayConfig) -> AsyncIterator[FastAPI]:
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, api_keys=["k1"]))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = FakeBackend([[i] for i in rt.tokenizer.encode('{"a": "b"}')])
    yield app
    await app.state.gateway.services.registry.pool.close()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=AUTH, timeout=120) as c:
        yield c


def bad_request(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text[:500]
    err: dict[str, Any] = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize("name", list(SCHEMAS))
async def test_each_hostile_schema_in_each_place_is_a_200_or_a_400_naming_it(client: httpx.AsyncClient,
                                                                           name: str) -> None:
    schema, code = SCHEMAS[name]
    for place, (path, body, checked) in places(schema).items():
        r = await client.post(path, content=dumps(body), headers={"content-type": "application/json"})
        assert r.status_code < 500, (place, r.text[:300])
        top = place.split(".", 1)[1].split(".")[0]  # the body's field holding the schema
        if place == "responses.text.format" and code != "too_deeply_nested":
            top = "response_format"  # the Responses API names the schema as the chat request it becomes
        if code == "too_deeply_nested":  # refused as the body is read, wherever it is
            err = bad_request(r)
            assert err["code"] == code and err["param"].startswith(top), (place, err)
            assert str(DEPTH) in err["message"], err
        elif code is not None and checked:
            err = bad_request(r)
            assert err["code"] == code and err["param"].startswith(top), (place, err)
            if code == "schema_too_large":
                assert f"{VALUES:,}" in err["message"] or f"{OPTIONAL:,}" in err["message"]
        elif code is None:  # tools are also shown to the model: 5,000 of them fill its context
            shown = "tools" in place
            assert r.status_code == 200 or (shown and bad_request(r)["code"] == "context_length_exceeded"), \
                (place, r.text[:300])


async def test_a_body_past_the_parsers_reach_names_its_field_and_the_limit(client: httpx.AsyncClient) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    body = f'{{"model": "{MODEL}", "messages": {json.dumps(ASK)}, "max_tokens": 4,\n "metadata_extra": {deep}}}'
    err = bad_request(await client.post("/v1/chat/completions", content=body,
                                        headers={"content-type": "application/json"}))
    assert err["param"] == "metadata_extra" and err["code"] == "too_deeply_nested"
    assert "line 2" in err["message"] and str(DEPTH) in err["message"]
    # A JSON type the fast path leaves to FastAPI: its parser dies deeper down, still a 400 naming it.
    err = bad_request(await client.post("/v1/chat/completions", content=body,
                                        headers={"content-type": "application/vnd.api+json"}))
    assert err["code"] == "too_deeply_nested" and str(DEPTH) in err["message"]


async def test_deep_tool_call_arguments_in_the_history_are_a_400_naming_them(client: httpx.AsyncClient) -> None:
    # A JSON string (so within the body's depth) that templates get parsed: bounded like the body.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for depth in (200, 5000):
        deep = "[" * depth + "]" * depth
        messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        err = bad_request(await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "tools": tools, "max_tokens": 4}))
        assert err["param"] == "messages[1].tool_calls[0].function.arguments" and err["code"] == "too_deeply_nested"


async def test_a_schema_given_as_json_text_is_bounded_too(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4}
    cases = ((nested(70), "schema_too_deep"), (nested(5000), "schema_too_deep"), (ENUM, "schema_too_large"))
    for schema, code in cases:
        text = dumps(schema).decode()
        err = bad_request(await client.post("/v1/chat/completions", json={**body, "guided_json": text}))
        assert err["param"] == "guided_json" and err["code"] == code, err


async def test_health_answers_while_hostile_requests_are_checked(client: httpx.AsyncClient) -> None:
    # No timing here (unit tier): /health must answer 200 among them, and none of them may be a 5xx. The
    # e2e tier times it against a real gateway.
    posts = [client.post(path, content=dumps(body), headers={"content-type": "application/json"})
             for schema, _ in SCHEMAS.values() for path, body, _ in places(schema).values()]
    results = await asyncio.gather(*posts, client.get("/health"))
    assert results[-1].status_code == 200
    assert all(r.status_code < 500 for r in results)


# --- the checks themselves ---------------------------------------------------------------------------------
def refused(schema: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        check_schema(schema, "s")
    return e.value


def test_optional_properties_are_bounded_all_objects_together() -> None:
    def obj(n: int, required: int = 0) -> dict[str, Any]:
        props = {f"p{i}": {"type": "integer"} for i in range(n)}
        return {"type": "object", "properties": props, "required": list(props)[:required]}

    check_schema(obj(OPTIONAL), "s")
    check_schema(obj(OPTIONAL + 500, required=500), "s")
    err = refused({"type": "object", "properties": {"a": obj(OPTIONAL // 2), "b": obj(OPTIONAL // 2 + 1)}})
    assert err.code == "schema_too_large" and f"{OPTIONAL:,}" in err.message and err.param == "s"


def test_depth_and_value_limits_are_exact() -> None:
    assert find_excess(nested(63), DEPTH) is None  # 127 levels
    assert find_excess({"x": nested(63)}, DEPTH) is None  # 128
    path = ["x", "y"] + ["properties", "a"] * 63  # the innermost {"type": "string"}, level 129
    assert find_excess({"x": {"y": nested(63)}}, DEPTH) == ("depth", path)
    flat = {"enum": list(range(VALUES - 2))}  # the object, the list and its items
    assert find_excess(flat, DEPTH, VALUES) is None
    assert find_excess({"enum": list(range(VALUES - 1))}, DEPTH, VALUES) == ("values", ["enum", VALUES - 2])
    assert refused({"enum": list(range(VALUES))}).code == "schema_too_large"
    assert refused(nested(64)).code == "schema_too_deep"  # 129 levels of its own


@pytest.mark.parametrize(("schema", "where", "words"), [
    (CYCLE, ".$ref", "loop"),
    ({"$ref": "#"}, ".$ref", "loop"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "properties": {"x": {"$ref": "#/$defs/a"}}},
     ".$defs.a.allOf[0].$ref", "loop"),
    ({"properties": {"x": {"$ref": "#/$defs/nope"}}}, ".properties.x.$ref", "points to nothing"),
    ({"properties": {"x": {"$ref": "#/properties/y/minLength"}, "y": {"minLength": 2}}}, ".properties.x.$ref",
     "does not point to a schema"),
    ({"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(40)} | {"d40": {"type": "string"}},
      "$ref": "#/$defs/d0"}, ".$ref", f"more than {HOPS} references"),
])
def test_references_that_cannot_be_followed_are_refused_naming_where(schema: Any, where: str, words: str) -> None:
    err = refused(schema)
    assert err.param == "s" + where and words in err.message, err.message


def test_references_that_produce_output_pass() -> None:
    check_schema(TREE, "s")
    check_schema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#"}}]}, "s")
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(HOPS - 1)} | {f"d{HOPS - 1}": {"type": "string"}}
    check_schema({"$defs": chain, "$ref": "#/$defs/d0"}, "s")
    check_schema({"$defs": {"a~/b": {"type": "string"}}, "$ref": "#/$defs/a~0~1b"}, "s")  # JSON pointer escapes
    check_schema({"$defs": {"x": {"$anchor": "name", "type": "string"}}, "$ref": "#name"}, "s")


def test_validity_is_checked_offline_whatever_the_schema_names_as_its_draft() -> None:
    # An unknown $schema is never fetched: the schema is checked as 2020-12.
    assert refused({"$schema": "https://example.com/evil", "type": "strin"}).param == "s.type"
    check_schema({"$schema": "https://example.com/evil", "type": "string"}, "s")
    assert refused({"$schema": "http://json-schema.org/draft-07/schema#", "type": "strin"}).param == "s.type"
    err = refused({"type": "string", "pattern": "(["})
    assert err.param == "s.pattern" and "regular expression" in err.message
    assert refused({"patternProperties": {"([": {}}}).param == "s.patternProperties.(["

"""Every field a POST route accepts has a strict JSON type: a wrong type is a 400 naming the field, in
OpenAI's error shape, on the fast path (`http.fastpath`, bodies parsed straight from bytes) and on FastAPI's
path alike; and `stream_options` without `stream: true` is a 400, as OpenAI, vLLM and Triton's frontend do.

The walk reads the app's own OpenAPI document, so a field added to a request model later is walked too
(and a nested model the base bodies below do not reach fails the coverage check)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig
from openai_api.settings import Settings
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend, llm_only_config

MODEL = "smollm2-135m-instruct"
AUTH = {"Authorization": "Bearer k1"}
# `application/json` takes the fast path; a `+json` type is FastAPI's alone (see `http.fastpath`).
CONTENT_TYPES = ("application/json", "application/x-test+json")

if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)

_MESSAGE = {"role": "assistant", "content": "Hi", "name": "a",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            "tool_call_id": "c0"}
# A valid body per POST route, holding every nested model (messages with tool calls, stream options,
# rerank documents as objects) so that the walk reaches each nested field.
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}, _MESSAGE,
                                                          {"role": "user", "content": "Hi"}],
                             "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    "/v1/completions": {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True,
                        "stream_options": {"include_usage": True}},
    "/v1/responses": {"model": MODEL, "input": "Hi", "max_output_tokens": 3},
    "/v1/responses/input_tokens": {"model": MODEL, "input": "Hi"},
    "/v1/responses/compact": {"model": MODEL, "input": "Hi"},
    "/v1/embeddings": {"model": "emb", "input": "Hi"},
    "/embed": {"inputs": "Hi"},
    "/v1/rerank": {"model": "rr", "query": "q", "documents": ["a", {"text": "b"}]},
    "/v2/rerank": {"model": "rr", "query": "q", "documents": ["a", {"text": "b"}]},
    "/v1/ranking": {"model": "rr", "query": {"text": "q"}, "passages": [{"text": "a"}]},
    "/rerank": {"query": "q", "documents": ["a", {"text": "b"}]},
    "/tokenize": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}, _MESSAGE]},
    "/detokenize": {"model": MODEL, "tokens": [1, 2]},
    # Anthropic's Messages API: a tool round trip's blocks, tools, tool_choice, metadata, sampling.
    "/v1/messages": {"model": MODEL, "max_tokens": 3, "system": [{"type": "text", "text": "Be brief."}],
                     "messages": [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": [
                                      {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
                                  {"role": "user", "content": [
                                      {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                                      {"type": "text", "text": "Hi"}]}],
                     "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                     "tool_choice": {"type": "auto"}, "metadata": {"user_id": "u"}, "stop_sequences": ["x"],
                     "temperature": 0.5, "top_p": 1, "top_k": 5, "stream": True},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                  "system": "Be brief."},
    # Runtime LoRA (vLLM's shapes; off without --allow-runtime-lora, so a valid body is a 404 here).
    "/v1/load_lora_adapter": {"lora_name": "a", "lora_path": "a", "base_model": MODEL},
    "/v1/unload_lora_adapter": {"lora_name": "a"},
    # The Batch API (an input file no one uploaded: a 404 after validation).
    "/v1/batches": {"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h",
                    "metadata": {"k": "v"}},
    "/v1/messages/batches": {"requests": [{"custom_id": "a", "params": {"model": MODEL, "max_tokens": 3,
                                                                         "messages": []}}]},
}
# Routes that answer in Anthropic's error shape: no `param`, so the message must name the field.
ANTHROPIC = {"/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches"}
# One value of each JSON type; a field is sent every one its schema does not allow (null aside: whether
# a field may be null is not a question of type). "1" is the string that lax parsing would take for a
# number, 1 the integer it would take for a boolean, True the boolean it would take for an integer.
SAMPLES: dict[str, Any] = {"string": "1", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
# Deliberate coercions: the seed system's rerank clients send `top_n` as a numeric string.
ALLOWED = {("/v1/rerank", "top_n", "1"), ("/v2/rerank", "top_n", "1")}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> GatewayConfig:
    return llm_only_config(tmp_path_factory.mktemp("config"), url="127.0.0.1:1")


@pytest.fixture(scope="module")
async def app(config: GatewayConfig, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FastAPI]:
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, api_keys=["k1"],
                                      batch_dir=tmp_path_factory.mktemp("batches")))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = FakeBackend([[i] for i in rt.tokenizer.encode("Hello")])
    yield app
    await app.state.gateway.services.registry.pool.close()


@pytest.fixture(scope="module")
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


async def post(client: httpx.AsyncClient, path: str, body: Any, content_type: str) -> httpx.Response:
    import orjson

    return await client.post(path, content=orjson.dumps(body), headers={**AUTH, "Content-Type": content_type})


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    payload = r.json()
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}, payload
    assert payload["error"]["type"] == "invalid_request_error"
    return payload["error"]  # type: ignore[no-any-return]


# --- stream_options without stream ----------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("extra", [{}, {"stream": False}], ids=["stream-unset", "stream-false"])
async def test_stream_options_without_stream_is_400_naming_it(client: httpx.AsyncClient, path: str,
                                                             extra: dict[str, Any], content_type: str) -> None:
    body = {**BASES[path], **extra, "stream_options": {"include_usage": True}}
    body.pop("stream", None) if not extra else None
    err = error_of(await post(client, path, body, content_type), 400)
    assert err["param"] == "stream_options"
    assert "stream_options can only be used when stream is true" in err["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_options_with_stream_or_null_are_accepted(client: httpx.AsyncClient, path: str) -> None:
    r = await post(client, path, BASES[path], CONTENT_TYPES[0])
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
    plain = {**BASES[path], "stream": False, "stream_options": None}
    r = await post(client, path, plain, CONTENT_TYPES[0])
    assert r.status_code == 200, r.text


# --- "stream": "true", as the seed system's manual sends it -------------------------------------------------


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_takes_the_strings_true_and_false(client: httpx.AsyncClient, path: str,
                                                       content_type: str) -> None:
    streamed = await post(client, path, {**BASES[path], "stream": "true"}, content_type)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]"), streamed.text
    body = {k: v for k, v in BASES[path].items() if k != "stream_options"}
    plain = await post(client, path, {**body, "stream": "false"}, content_type)
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json", plain.text
    assert plain.json()["choices"], plain.text
    # "false" is false: stream_options with it is the same client bug as with `false`.
    err = error_of(await post(client, path, {**BASES[path], "stream": "false"}, content_type), 400)
    assert err["param"] == "stream_options"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("value", ["True", "1", "yes", "", 1, 0])
async def test_stream_takes_no_other_string_or_number(client: httpx.AsyncClient, path: str, value: Any) -> None:
    for content_type in CONTENT_TYPES:
        err = error_of(await post(client, path, {**BASES[path], "stream": value}, content_type), 400)
        assert err["param"] == "stream"


# --- the wrong-type walk ---------------------------------------------------------------------------------------


class Walk:
    """The request schemas of the app's OpenAPI document, resolved."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self.components = openapi["components"]["schemas"]
        self.reached: set[str] = set()

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            self.reached.add(name)
            schema = self.components[name]
        return schema

    def branches(self, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """The alternatives of a field's schema (anyOf / oneOf flattened, refs resolved)."""
        schema = self.resolve(schema)
        alts = schema.get("anyOf") or schema.get("oneOf")
        if alts:
            return [b for a in alts for b in self.branches(a)]
        return [schema]

    def types(self, schema: dict[str, Any]) -> set[str]:
        out: set[str] = set()
        for b in self.branches(schema):
            t = b.get("type")
            if t is None and ("properties" in b or "additionalProperties" in b):
                t = "object"
            if t is None and "const" in b:
                t = {str: "string", bool: "boolean", int: "integer"}.get(type(b["const"]))
            if t is None:  # `Any`: every type is right
                return set(SAMPLES) | {"null"}
            out |= set(t) if isinstance(t, list) else {t}
        if "number" in out:
            out.add("integer")  # an integer is a number in JSON Schema and for OpenAI
        return out

    def cases(self, schema: dict[str, Any], path: list[Any], base: Any) -> Iterator[tuple[list[Any], Any]]:
        """(path, wrong value) for the field at `path` (whose value in the base body is `base`, or
        absent), and for the fields nested in it that the base body holds."""
        allowed = self.types(schema)
        for t, value in SAMPLES.items():
            if t not in allowed:
                yield path, value
        for b in self.branches(schema):
            if b.get("type") == "array" and "items" in b:
                item_types = self.types(b["items"])
                for t, value in SAMPLES.items():
                    if t not in item_types and not any(t in self.types(o["items"]) for o in self.branches(schema)
                                                       if o.get("type") == "array" and "items" in o):
                        yield path, [value]
                if isinstance(base, list):
                    for i, item in enumerate(base):
                        if isinstance(item, dict):
                            for ib in self.branches(b["items"]):
                                if "properties" in ib:
                                    yield from self.object_cases(ib, [*path, i], item)
            elif "properties" in b and isinstance(base, dict):
                yield from self.object_cases(b, path, base)
            elif isinstance(b.get("additionalProperties"), dict) and self.types(b["additionalProperties"]) != \
                    set(SAMPLES) | {"null"}:
                value_types = self.types(b["additionalProperties"])
                for t, value in SAMPLES.items():
                    if t not in value_types:
                        yield path, {"k": value}

    def object_cases(self, schema: dict[str, Any], path: list[Any],
                     base: dict[str, Any]) -> Iterator[tuple[list[Any], Any]]:
        for name, prop in schema.get("properties", {}).items():
            yield from self.cases(prop, [*path, name], base.get(name))


def param_of(path: list[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + p
    return out


def with_value(body: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    node: Any = body
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return body


def post_routes(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every POST route with a JSON body: path -> body schema (`/v1/files` takes a multipart form)."""
    out = {}
    for path, ops in openapi["paths"].items():
        op = ops.get("post")
        if op and "application/json" in op.get("requestBody", {}).get("content", {}):
            out[path] = op["requestBody"]["content"]["application/json"]["schema"]
    return out


async def test_every_post_route_has_a_base_body(app: FastAPI) -> None:
    assert set(post_routes(app.openapi())) == set(BASES)


async def test_base_bodies_are_valid(client: httpx.AsyncClient) -> None:
    """The walk's oracle: each base body passes validation (an encoder route may then find no model)."""
    for path, base in BASES.items():
        r = await post(client, path, base, CONTENT_TYPES[0])
        assert r.status_code in (200, 404), (path, r.text)


async def test_every_wrong_type_on_every_post_route_is_400_naming_the_field(app: FastAPI,
                                                                          client: httpx.AsyncClient) -> None:
    openapi = app.openapi()
    walk = Walk(openapi)
    failures: list[str] = []
    count = 0
    for path, schema in post_routes(openapi).items():
        base = BASES[path]
        for field_path, value in walk.object_cases(walk.resolve(schema), [], base):
            if isinstance(value, str) and (path, field_path[0], value) in ALLOWED:
                continue
            body = with_value(base, field_path, value)
            expected = param_of(field_path)
            for content_type in CONTENT_TYPES:
                count += 1
                r = await post(client, path, body, content_type)
                if path in ANTHROPIC:
                    err = r.json().get("error", {}) if r.status_code == 400 else {}
                    name = next((p for p in reversed(field_path) if isinstance(p, str)), expected)
                    related = err.get("type") == "invalid_request_error" and name in err.get("message", "")
                else:
                    param = r.json().get("error", {}).get("param") if r.status_code == 400 else None
                    related = param is not None and (param == expected or param.startswith(expected)
                                                     or expected.startswith((param + ".", param + "[")))
                if r.status_code != 400 or not related:
                    failures.append(f"{path} {expected}={value!r} ({content_type}): {r.status_code} {r.text[:160]}")
    assert not failures, f"{len(failures)} of {count} wrong-typed requests were not a 400 naming the field:\n" + \
        "\n".join(failures)
    # Every request model, and every model nested in one, was walked.
    wanted = {"ChatMessage", "ToolCall", "ToolCallFunction", "StreamOptions", "RerankDocument", "RankingText"}
    assert wanted <= walk.reached, wanted - walk.reached
    assert count > 300


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("field", "value"), [("ignore_eos", 123), ("ignore_eos", "true"),
                                              ("skip_special_tokens", 0), ("guided_regex", 5),
                                              ("guided_choice", "a"), ("structured_outputs", "x")])
async def test_vllm_extension_fields_are_typed(client: httpx.AsyncClient, path: str, field: str, value: Any) -> None:
    for content_type in CONTENT_TYPES:
        err = error_of(await post(client, path, {**BASES[path], field: value}, content_type), 400)
        assert err["param"] == field


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_vllm_extension_defaults_are_taken_and_the_rest_refused(client: httpx.AsyncClient, path: str) -> None:
    r = await post(client, path, {**BASES[path], "ignore_eos": False, "skip_special_tokens": True}, CONTENT_TYPES[0])
    assert r.status_code == 200, r.text
    # ignore_eos goes to the backend, which honours it or refuses it (tests/unit/test_protocol_adapters.py).
    r = await post(client, path, {**BASES[path], "ignore_eos": True}, CONTENT_TYPES[0])
    assert r.status_code == 200, r.text
    err = error_of(await post(client, path, {**BASES[path], "skip_special_tokens": False}, CONTENT_TYPES[0]), 400)
    assert (err["param"], err["code"]) == ("skip_special_tokens", "unsupported_parameter")

"""`services.schema_refs`: a schema's references keep their meaning inside every guide the gateway builds (the
forms pydantic does not write but JSON Schema allows: pointer escapes, references into nested `$defs`, array
indices, anchors, `#`), data that looks like a reference is left alone, each part is copied once; and a guide
the backend cannot compile is the client's 400 naming the tool and the schema path (`guides.backend_refusal`).
Each guide here is compiled as the reference model compiles it (`tests.reference_guides`) and must take a
valid output and refuse an invalid one."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from openai_api.errors import BackendError
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.guides import backend_refusal, check_schema, schema_guide
from openai_api.services.schema_refs import RootDefs
from openai_api.services.tools import plan_tools
from openai_api.triton.errors import guide_refusal
from openai_api.triton.llm import Guide
from tests.reference_guides import accepts, compile_error

S = {"type": "string"}
RT = SimpleNamespace(tool_parser="hermes", template=None, reasoning_parser=None)


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


def forced(schemas: dict[str, dict[str, Any]], choice: Any = "required", parallel: bool = False) -> Guide:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": choice,
            "parallel_tool_calls": parallel,
            "tools": [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in schemas.items()]}
    guide = plan_tools(RT, ChatCompletionRequest.model_validate(body)).guide  # type: ignore[arg-type]
    assert guide is not None
    return guide


# Each: (schema, a valid instance, an invalid one). jsonschema is the oracle for both (checked below).
CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "pointer escapes": ({"$defs": {"a/b": S, "a~b": {"type": "integer"}, "a b": {"type": "boolean"}},
                         **obj(x={"$ref": "#/$defs/a~1b"}, y={"$ref": "#/$defs/a~0b"}, z={"$ref": "#/$defs/a%20b"})},
                        {"x": "s", "y": 1, "z": True}, {"x": "s", "y": "1", "z": True}),
    "nested $defs": ({"$defs": {"A": {"$defs": {"B": {"type": "integer"}}, **obj(b={"$ref": "#/$defs/A/$defs/B"})}},
                      **obj(a={"$ref": "#/$defs/A"}, b={"$ref": "#/$defs/A/$defs/B"})},
                     {"a": {"b": 1}, "b": 2}, {"a": {"b": "1"}, "b": 2}),
    "array index": ({**obj(pair={"type": "array", "prefixItems": [S, {"type": "integer"}], "items": False},
                           second={"$ref": "#/properties/pair/prefixItems/1"})},
                    {"pair": ["a", 1], "second": 2}, {"pair": ["a", 1], "second": "2"}),
    "anchor": ({"$defs": {"x": {"$anchor": "item", **obj(n={"type": "integer"})}},
                **obj(one={"$ref": "#item"}, many={"type": "array", "items": {"$ref": "#item"}})},
               {"one": {"n": 1}, "many": [{"n": 2}]}, {"one": {"n": 1}, "many": [{"n": "2"}]}),
    "a property's schema": (obj(a=obj(v={"type": "integer"}), b={"$ref": "#/properties/a"}),
                            {"a": {"v": 1}, "b": {"v": 2}}, {"a": {"v": 1}, "b": {"v": "2"}}),
    "root recursion": ({**obj(v={"type": "integer"}, kids={"type": "array", "items": {"$ref": "#"}})},
                       {"v": 1, "kids": [{"v": 2, "kids": []}]}, {"v": 1, "kids": [{"v": 2}]}),
    "legacy definitions, root $ref": ({"$ref": "#/definitions/N", "definitions": {
        "N": obj(v={"type": "integer"}, next={"anyOf": [{"$ref": "#/definitions/N"}, {"type": "null"}]})}},
        {"v": 1, "next": {"v": 2, "next": None}}, {"v": 1, "next": {"v": "2", "next": None}}),
    "keyword-named properties": ({"$defs": {"A": {"type": "integer"}},
                                  **obj(**{"$ref": S, "$defs": {"$ref": "#/$defs/A"}, "definitions": S})},
                                 {"$ref": "x", "$defs": 1, "definitions": "y"}, {"$ref": "x", "$defs": "1",
                                                                                 "definitions": "y"}),
    "reference-like data": ({"$defs": {"A": {"type": "integer"}},
                             **obj(c={"const": "#/$defs/A", "default": {"$ref": "#/$defs/A"}},
                                   e={"enum": ["#/$defs/A"]},
                                   n={"$ref": "#/$defs/A", "examples": [{"$ref": "#/$defs/A"}]})},
                            {"c": "#/$defs/A", "e": "#/$defs/A", "n": 3},
                            {"c": "#/$defs/B", "e": "#/$defs/A", "n": 3}),
    "discriminated union": ({"$defs": {"Cat": obj(kind={"const": "cat"}, lives={"type": "integer"}),
                                       "Dog": obj(kind={"const": "dog"}, good={"type": "boolean"})},
                             **obj(pet={"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                                        "discriminator": {"propertyName": "kind",
                                                          "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}})},
                            {"pet": {"kind": "dog", "good": True}}, {"pet": {"kind": "dog", "lives": 1}}),
}


def _valid(schema: dict[str, Any], value: Any) -> bool:
    import jsonschema

    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


@pytest.mark.parametrize("name", list(CASES))
def test_references_keep_their_meaning_in_every_guide(name: str) -> None:
    schema, good, bad = CASES[name]
    assert _valid(schema, good) and not _valid(schema, bad)  # the oracle agrees with the case
    alone = schema_guide(schema, "response_format.json_schema.schema")
    named = forced({"t": schema}, {"type": "function", "function": {"name": "t"}})
    listed = forced({"t": schema}, parallel=True)
    among = forced({"other": {"$defs": {"A": S, "N": S, "Cat": S}, **obj(a={"$ref": "#/$defs/A"})}, "t": schema})
    for guide, write in ((alone, lambda v: v), (named, lambda v: v),
                         (listed, lambda v: [{"name": "t", "arguments": v}]),
                         (among, lambda v: {"name": "t", "arguments": v})):
        assert compile_error(guide) is None, (compile_error(guide), guide.value)
        assert accepts(guide, write(good)), guide.value
        assert not accepts(guide, write(bad)), guide.value
    assert accepts(among, {"name": "other", "arguments": {"a": "s"}})
    assert not accepts(among, {"name": "other", "arguments": {"a": 1}})  # its own A, not the other tool's


def test_data_that_looks_like_a_reference_is_left_as_it_is() -> None:
    schema, _, _ = CASES["reference-like data"]
    props = json.loads(schema_guide(schema, "p").value or "")["properties"]
    assert props["c"]["default"] == {"$ref": "#/$defs/A"} and props["n"]["examples"] == [{"$ref": "#/$defs/A"}]
    assert props["e"] == {"enum": ["#/$defs/A"]}


def test_every_reference_names_the_guides_root_defs() -> None:
    schema, _, _ = CASES["pointer escapes"]
    guide = json.loads(forced({"t": schema}).value or "")
    args = guide["properties"]["arguments"]
    assert "$defs" not in args  # the tool's own definitions: hoisted, not left where nothing points
    refs = {p: args["properties"][p]["$ref"] for p in "xyz"}
    assert refs == {"x": "#/$defs/a_b", "y": "#/$defs/a_b_2", "z": "#/$defs/a_b_3"}
    assert guide["$defs"] == {"a_b": S, "a_b_2": {"type": "integer"}, "a_b_3": {"type": "boolean"}}


def test_discriminator_mapping_follows_the_renamed_definitions() -> None:
    schema, _, _ = CASES["discriminated union"]
    guide = json.loads(forced({"one": {"$defs": {"Cat": S}, **obj(c={"$ref": "#/$defs/Cat"})}, "t": schema}).value
                       or "")
    pet = guide["anyOf"][1]["properties"]["arguments"]["properties"]["pet"]
    assert pet["discriminator"]["mapping"] == {"cat": "#/$defs/Cat_2", "dog": "#/$defs/Dog"}
    assert [r["$ref"] for r in pet["oneOf"]] == ["#/$defs/Cat_2", "#/$defs/Dog"]
    assert guide["$defs"]["Cat"] == S


def test_a_schema_without_references_is_used_as_it_is() -> None:
    schema = {"$defs": {"unused": S}, **obj(a=S)}
    defs = RootDefs()
    assert defs.place(check_schema(schema, "p"), "#") is schema
    assert defs.root(schema) is schema and not defs.defs
    assert json.loads(schema_guide(schema, "p").value or "") == schema


def test_each_part_of_the_schema_is_copied_once() -> None:
    """References into each other's insides (`#/properties/a`, `#/properties/a/properties/a`, ...) would copy
    the inner parts again for every outer one; each is written once and referenced."""
    depth = 40
    inner: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        inner = obj(a=inner)
    refs = {f"r{k}": {"$ref": "#/properties/a" + "/properties/a" * k} for k in range(depth)}
    schema = {**inner, "properties": {**inner["properties"], **refs}}
    text = schema_guide(schema, "p").value or ""
    assert text.count('"integer"') == 1  # the innermost schema, once
    assert len(text) < 3 * len(json.dumps(schema))


def test_a_backend_refusal_names_the_tool_and_the_path() -> None:
    weather, parcel = obj(city=S), {"$defs": {"Address": obj(zip={"type": "integer"})},
                                    **obj(to={"$ref": "#/$defs/Address"})}
    guide = forced({"weather": weather, "parcel": parcel})

    def refusal(text: str) -> tuple[str | None, str]:
        err = backend_refusal(guide, BackendError("x", detail=text))
        assert err is not None and err.status == 400 and err.code == "unsupported_schema"
        return err.param, err.message

    # A pointer into the hoisted definition: the client's own `$defs` entry.
    param, message = refusal("guided_decoding_guide: the JSON schema cannot be compiled: bad thing at "
                             "#/$defs/Address/properties/zip")
    assert param == "tools[1].function.parameters.$defs.Address.properties.zip"
    assert "'parcel'" in message and "bad thing" in message
    # A pointer into the second tool's arguments.
    param, _ = refusal("Error generating stream: Failed to transform json schema into a grammar: "
                       "#/anyOf/1/properties/arguments/properties/to")
    assert param == "tools[1].function.parameters.properties.to"
    # No pointer, several tools: the guide's parameter, with every tool named.
    param, message = refusal("[09:14:02] /src/cpp/json_schema_converter.cc:512: Invalid range: minimum greater "
                             "than maximum")
    assert param == "tool_choice" and "'weather' (tools[0].function.parameters)" in message
    assert "json_schema_converter" not in message and message.endswith("Invalid range: minimum greater than maximum")
    # No pointer, one tool: that tool.
    one = forced({"weather": weather}, {"type": "function", "function": {"name": "weather"}})
    err = backend_refusal(one, BackendError("x", detail="x: the JSON schema cannot be compiled: Schema 'false' "
                                                        "cannot accept any value"))
    assert err is not None and err.param == "tools[0].function.parameters" and "'weather'" in err.message


@pytest.mark.parametrize(("text", "guide"), [
    ("guided_decoding_guide: the JSON schema cannot be compiled: Cannot find field $defs in #/$defs/A", True),
    ("Error generating stream: The provided JSON schema contains features not supported by xgrammar.", True),
    ("Invalid JSON grammar specification.", True),
    ("Regex uses unsupported feature for structured outputs: lookaround.", True),
    ("guided decoding is unavailable on this server: ImportError: xgrammar", False),
    ("guided decoding failed: RuntimeError: CUDA error: out of memory", False),
    ("Stub process is unhealthy and it will be restarted.", False),
])
def test_what_reads_as_a_guide_refusal(text: str, guide: bool) -> None:
    assert (guide_refusal(text) is not None) is guide


# --- a refusal through every route, over the real app and a backend that refuses as Triton does ------------------
NESTED = {"$defs": {"Address": obj(city=S)}, **obj(home={"$ref": "#/$defs/Address"})}
REFUSED = ("guided_decoding_guide: the JSON schema cannot be compiled: Invalid range: minimum greater than maximum")


@pytest.fixture
async def app(tmp_path: Any) -> Any:
    from openai_api.app import create_app
    from openai_api.settings import Settings
    from tests.unit.fakes import llm_only_config

    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, api_keys=["k"]))
    yield app
    await app.state.gateway.process.close()


def _refusing(app: Any, detail: str = REFUSED) -> Any:
    from tests.unit.fakes import MODEL, FakeBackend

    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = FakeBackend([[1]], fail_at=0, error=BackendError("Triton failed the request.", detail=detail))
    return rt.backend


async def _post(app: Any, path: str, body: dict[str, Any]) -> Any:
    import httpx

    from tests.unit.fakes import MODEL

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post(path, json={"model": MODEL, **body},
                            headers={"authorization": "Bearer k", "x-api-key": "k", "anthropic-version": "2023-06-01"})


@pytest.mark.parametrize("stream", [False, True])
async def test_a_guide_the_backend_cannot_compile_is_a_400_on_every_route(app: Any, stream: bool) -> None:
    user = [{"role": "user", "content": "hi"}]
    chat_tool = {"type": "function", "function": {"name": "where", "parameters": NESTED}}
    routes = [
        ("/v1/chat/completions", {"messages": user, "tools": [chat_tool], "tool_choice": "required"},
         "tools[0].function.parameters"),
        ("/v1/chat/completions", {"messages": user, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": NESTED}}}, "response_format.json_schema.schema"),
        ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "where", "parameters": NESTED}],
                           "tool_choice": "required"}, "tools[0].function.parameters"),
        ("/v1/messages", {"max_tokens": 16, "messages": user, "tool_choice": {"type": "any"},
                          "tools": [{"name": "where", "input_schema": NESTED}]}, None),
        ("/v1/messages", {"max_tokens": 16, "messages": user, "tool_choice": {"type": "tool", "name": "where"},
                          "tools": [{"name": "where", "input_schema": NESTED}]}, None),
    ]
    for path, body, param in routes:
        _refusing(app)
        r = await _post(app, path, {**body, "stream": stream})
        assert r.status_code == 400, (path, r.status_code, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error", r.text
        assert "minimum greater than maximum" in error["message"], r.text
        if path == "/v1/messages":  # Anthropic's errors carry no param: the message names the tool
            assert "'where'" in error["message"], r.text
        else:
            assert error["param"] == param and error["code"] == "unsupported_schema", r.text


async def test_a_backend_failure_that_is_not_the_guides_stays_a_5xx(app: Any) -> None:
    user = [{"role": "user", "content": "hi"}]
    chat_tool = {"type": "function", "function": {"name": "where", "parameters": NESTED}}
    _refusing(app, "guided decoding failed: RuntimeError: CUDA error: an illegal memory access")
    r = await _post(app, "/v1/chat/completions", {"messages": user, "tools": [chat_tool], "tool_choice": "required"})
    assert r.status_code == 502 and "CUDA" not in r.text
    _refusing(app, REFUSED)  # the same words, without a guide: Triton's failure, not the client's
    r = await _post(app, "/v1/chat/completions", {"messages": user})
    assert r.status_code == 502 and "minimum" not in r.text

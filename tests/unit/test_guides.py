"""Constrained decoding in the gateway, no Triton: what becomes a guide (response_format, vLLM's fields,
forced tool calls), which schemas are refused and where, how each protocol carries a guide on the wire,
and how a forced call's guided output comes back as tool_calls, plain and streamed alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openai_api.errors import BackendError, InvalidRequestError
from openai_api.schemas.openai import ChatCompletionRequest, CompletionRequest
from openai_api.services.bounds import MAX_GUIDE_CHARS
from openai_api.services.guides import check_schema, request_guide
from openai_api.triton.llm import GenerationRequest, Guide
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter, trtllm_guide
from openai_api.triton.vllm import VLLMAdapter, vllm_guide
from openai_api.triton.wire import parse_model_config

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
          "required": ["city"]}


def chat(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], **kw})


# --- what becomes a guide ------------------------------------------------------------------------------------
def test_response_format_becomes_a_guide() -> None:
    assert request_guide(chat()) is None
    assert request_guide(chat(response_format={"type": "text"})) is None
    g = request_guide(chat(response_format={"type": "json_object"}))
    assert g == Guide("json_object", None, "response_format")
    g = request_guide(chat(response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA,
                                                                                     "strict": True}}))
    assert g is not None and g.kind == "json_schema" and json.loads(g.value or "") == SCHEMA
    assert g.param == "response_format.json_schema.schema"


def test_vllm_extension_fields_become_guides() -> None:
    assert request_guide(chat(guided_json=SCHEMA)).kind == "json_schema"  # type: ignore[union-attr]
    assert request_guide(chat(guided_json=json.dumps(SCHEMA))).kind == "json_schema"  # type: ignore[union-attr]
    assert request_guide(chat(guided_regex="[a-z]+")) == Guide("regex", "[a-z]+", "guided_regex")
    assert request_guide(chat(guided_choice=["yes", "no"])) == Guide("choice", '["yes", "no"]', "guided_choice")
    assert request_guide(chat(guided_grammar='root ::= "a"')) == Guide("grammar", 'root ::= "a"', "guided_grammar")
    assert request_guide(chat(structured_outputs={"regex": "a+"})) == Guide("regex", "a+", "structured_outputs")
    assert request_guide(chat(structured_outputs={"json_object": True})).kind == "json_object"  # type: ignore[union-attr]
    comp = CompletionRequest.model_validate({"model": "m", "prompt": "x", "guided_choice": ["a", "b"]})
    assert request_guide(comp) == Guide("choice", '["a", "b"]', "guided_choice")


@pytest.mark.parametrize(("body", "param"), [
    ({"guided_regex": "(" + "|".join(f"w{i}" for i in range(10_000)) + ")"}, "guided_regex"),
    ({"guided_grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(10_000))}, "guided_grammar"),
    ({"structured_outputs": {"regex": "a" * (MAX_GUIDE_CHARS + 1)}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "a" * (MAX_GUIDE_CHARS + 1)}}, "structured_outputs.grammar"),
    ({"guided_choice": [f"choice {i}" for i in range(5_000)]}, "guided_choice"),
])
def test_regexes_grammars_and_choices_past_the_bound_are_a_400_before_any_backend(
        body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        request_guide(chat(**body))
    assert e.value.param == param and e.value.code == "guide_too_large", e.value.message
    assert f"{MAX_GUIDE_CHARS:,}" in e.value.message


def test_guides_at_the_bound_are_taken() -> None:
    pattern = "a" * MAX_GUIDE_CHARS
    assert request_guide(chat(guided_regex=pattern)) == Guide("regex", pattern, "guided_regex")
    grammar = 'root ::= "' + "a" * (MAX_GUIDE_CHARS - 11) + '"'
    assert request_guide(chat(structured_outputs={"grammar": grammar})) == Guide("grammar", grammar,
                                                                                 "structured_outputs")


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
])
def test_bad_guide_requests_are_a_400_naming_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        request_guide(chat(**body))
    assert e.value.param == param, e.value.message


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "object", "properties": {"a": {"type": "strng"}}}, ".properties.a.type"),  # invalid JSON Schema
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, ".properties.a.not"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, ".if"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, ".uniqueItems"),
    ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, ".allOf"),
    ({"type": "number", "multipleOf": 0.5}, ".multipleOf"),
    ({"$ref": "https://example.com/schema.json"}, ".$ref"),
    ({"type": "string", "pattern": "^(?!admin).*$"}, ".pattern"),
    ({"type": "string", "pattern": "(a)\\1"}, ".pattern"),
    ({"type": "array", "minItems": 1}, ".minItems"),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 2}, ".minProperties"),
    ({"$defs": {"x": {"type": "object", "dependentRequired": {"a": ["b"]}}}}, ".$defs.x.dependentRequired"),
    # Bounds no value meets, and integer bounds xgrammar cannot enforce (it refuses to compile each of these).
    ({"type": "integer", "minimum": 5, "maximum": 1}, ".minimum"),
    ({"type": "number", "exclusiveMinimum": 5, "exclusiveMaximum": 5}, ".exclusiveMinimum"),
    ({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 6}, ".exclusiveMinimum"),
    ({"type": "integer", "minimum": 1.5}, ".minimum"),
    ({"type": ["integer", "null"], "maximum": 2**63}, ".maximum"),
    ({"type": "string", "minLength": 5.0, "maxLength": 1}, ".minLength"),
    ({"type": "array", "items": {}, "minItems": 3, "maxItems": 1}, ".minItems"),
    ({"type": "object", "additionalProperties": {}, "minProperties": 3, "maxProperties": 1}, ".minProperties"),
])
def test_schemas_guided_decoding_cannot_enforce_are_a_400_naming_the_path(schema: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check_schema(schema, "response_format.json_schema.schema")
    assert e.value.param == "response_format.json_schema.schema" + where, e.value.message
    assert e.value.status == 400


def test_ordinary_schemas_pass() -> None:
    pydantic_style = {"$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                                        "required": ["kind"]}},
                      "type": "object", "properties": {
                          "pet": {"$ref": "#/$defs/Pet", "description": "the pet"},
                          "alt": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                          "one": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
                          "age": {"type": "integer", "minimum": 0, "maximum": 9, "multipleOf": 3},
                          "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
                          "when": {"type": "string", "format": "date-time"}},
                      "required": ["pet"], "additionalProperties": False}
    check_schema(pydantic_style, "p")
    check_schema({"allOf": [{"$ref": "#/$defs/Pet"}], "$defs": pydantic_style["$defs"]}, "p")
    for bounded in ({"minimum": 5, "maximum": 1}, {"type": "integer", "minimum": 2.0, "maximum": 2**63 - 1},
                    {"type": "number", "minimum": 1.5, "maximum": 1.5}, {"type": "integer", "exclusiveMinimum": 5,
                                                                          "exclusiveMaximum": 7}):
        check_schema(bounded, "p")  # (no type: the bounds apply to no value the schema must take)


# --- forced tool calls ---------------------------------------------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]


def plan(**kw: Any) -> Any:
    from types import SimpleNamespace

    from openai_api.services.tools import plan_tools

    rt = SimpleNamespace(tool_parser=kw.pop("parser", "hermes"), reasoning_parser=None, template=None)
    return plan_tools(rt, chat(tools=TOOLS, **kw))  # type: ignore[arg-type]


def test_a_named_tool_choice_is_guided_to_the_functions_arguments() -> None:
    p = plan(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert p.forced == "named" and p.forced_name == "get_time" and not p.parallel
    assert p.prefill == '<tool_call>\n{"name": "get_time", "arguments": '
    assert p.guide.param == "tool_choice" and json.loads(p.guide.value) == TOOLS[1]["function"]["parameters"]
    [call] = p.calls_from('{"tz": "UTC"}')
    assert (call.name, json.loads(call.arguments)) == ("get_time", {"tz": "UTC"})
    llama = plan(tool_choice={"type": "function", "function": {"name": "get_time"}}, parser="llama3_json")
    assert llama.prefill == '{"name": "get_time", "parameters": '


def test_required_is_guided_to_one_of_the_offered_calls_or_a_list_of_them() -> None:
    one = plan(tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(one.guide.value)
    assert [c["properties"]["name"]["const"] for c in schema["anyOf"]] == ["get_weather", "get_time"]
    many = json.loads(plan(tool_choice="required").guide.value)
    assert many["type"] == "array" and many["minItems"] == 1
    calls = plan(tool_choice="required").calls_from(
        '[{"name": "get_time", "arguments": {"tz": "UTC"}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    assert [c.name for c in calls] == ["get_time", "get_weather"]
    assert plan(tool_choice="required").calls_from('[{"name": "get_time", "argu') is None  # not cut: malformed
    # Cut by max_tokens: the calls complete before the cut are the answer's calls.
    cut = plan(tool_choice="required").calls_from(
        '[{"name": "get_time", "arguments": {"tz": "UTC"}}, {"name": "get_weather", "argu', cut=True)
    assert [(c.name, json.loads(c.arguments)) for c in cut] == [("get_time", {"tz": "UTC"})]
    assert plan(tool_choice="required").calls_from('[{"name": "get_time", "argu', cut=True) is None
    mistral = plan(tool_choice={"type": "function", "function": {"name": "get_time"}}, parser="mistral")
    assert mistral.prefill == "" and mistral.forced == "named"  # no JSON opening in Mistral's own format


def test_a_tool_schema_guided_decoding_cannot_enforce_is_a_400_naming_the_tool() -> None:
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}]
    from types import SimpleNamespace

    from openai_api.services.tools import plan_tools
    rt = SimpleNamespace(tool_parser="hermes", reasoning_parser=None, template=None)
    with pytest.raises(InvalidRequestError) as e:
        plan_tools(rt, chat(tools=bad, tool_choice="required"))  # type: ignore[arg-type]
    assert e.value.param == "tools[0].function.parameters.not"


# --- on the wire ---------------------------------------------------------------------------------------------
def test_tensorrt_llm_guide_inputs() -> None:
    assert trtllm_guide(Guide("json_schema", '{"type":"string"}')) == ("json_schema", '{"type":"string"}')
    assert trtllm_guide(Guide("json_object", None)) == ("json_schema", '{"type": "object"}')
    assert trtllm_guide(Guide("regex", "a+")) == ("regex", "a+")
    assert trtllm_guide(Guide("grammar", 'root ::= "x"')) == ("ebnf_grammar", 'root ::= "x"')
    assert trtllm_guide(Guide("choice", '["yes", "n\\"o"]')) == ("ebnf_grammar", 'root ::= "yes" | "n\\"o"')


def _config(inputs: list[tuple[str, str]], backend: str = "tensorrtllm") -> dict[str, Any]:
    return {"name": "m", "backend": backend, "max_batch_size": 1, "model_transaction_policy": {"decoupled": True},
            "input": [{"name": n, "data_type": f"TYPE_{t}", "dims": [-1]} for n, t in inputs],
            "output": [{"name": "output_ids", "data_type": "TYPE_INT32", "dims": [-1]}]}


TRT_BASE = [("input_ids", "INT32"), ("input_lengths", "INT32"), ("request_output_len", "INT32"), ("streaming", "BOOL")]


def test_tensorrt_llm_sends_a_guide_only_to_a_model_that_declares_the_inputs() -> None:
    guided = TensorRTLLMAdapter(None, parse_model_config(_config(  # type: ignore[arg-type]
        [*TRT_BASE, ("guided_decoding_guide_type", "STRING"), ("guided_decoding_guide", "STRING")])),
        model="m", triton_model="t")
    req = GenerationRequest(prompt_ids=[1, 2], max_tokens=4, guide=Guide("regex", "a+"))
    inputs = guided._request(req, streaming=True).inputs()
    assert inputs["guided_decoding_guide_type"][2].endswith(b"regex")
    assert inputs["guided_decoding_guide"][2].endswith(b"a+")
    assert guided.guide_kinds
    plain = TensorRTLLMAdapter(None, parse_model_config(_config(TRT_BASE)), model="m", triton_model="t")  # type: ignore[arg-type]
    assert not plain.guide_kinds
    with pytest.raises(InvalidRequestError) as e:
        plain._request(req, streaming=True)
    assert e.value.param == "response_format" and "cannot enforce" in e.value.message


def test_vllm_guide_spellings() -> None:
    g = Guide("json_schema", '{"type":"object"}')
    assert vllm_guide(g, "structured_outputs") == '{"json":{"type":"object"}}'  # the backend json.loads it
    assert vllm_guide(g, "guided_decoding") == {"json": {"type": "object"}}
    assert vllm_guide(Guide("choice", '["a"]'), "guided_decoding") == {"choice": ["a"]}
    assert vllm_guide(Guide("json_object", None), "guided_decoding") == {"json_object": True}


async def test_vllm_falls_back_to_the_older_spelling_when_the_backend_refuses_the_newer_by_name() -> None:
    from tests.unit.test_protocol_adapters import VLLM_CONFIG, FakeClient, vllm_result

    class Refusing(FakeClient):
        def stream(self, request: Any, **kw: Any) -> Any:
            params = json.loads(self.__class__._params(request))
            if "structured_outputs" not in params:
                return super().stream(request, **kw)

            async def refused() -> Any:  # as TritonRPC.stream: the error comes with the first response
                raise BackendError("Triton failed.", detail="sampling_parameters: not supported: structured_outputs")
                yield

            self.requests.append(request)
            return refused()

        @staticmethod
        def _params(request: Any) -> str:
            from tritonclient.utils import deserialize_bytes_tensor
            raw = request.inputs()["sampling_parameters"][2]
            return str(deserialize_bytes_tensor(raw)[0].decode())

    client = Refusing(VLLM_CONFIG, [vllm_result('{"a": 1}', 3)])
    adapter = VLLMAdapter(client, parse_model_config(VLLM_CONFIG), model="m", triton_model="v")  # type: ignore[arg-type]
    req = GenerationRequest(prompt_ids=[1], prompt_text="Hi", max_tokens=8, guide=Guide("json_object", None))
    chunks = [c async for c in adapter.generate(req)]
    assert chunks and adapter.guide_key == "guided_decoding"
    assert '"guided_decoding":{"json_object":true}' in Refusing._params(client.requests[-1])
    fixed = VLLMAdapter(client, parse_model_config(VLLM_CONFIG), model="m", triton_model="v",  # type: ignore[arg-type]
                        guide_key="structured_outputs")
    with pytest.raises(BackendError):
        [c async for c in fixed.generate(req)]  # configured spelling: no fallback


@pytest.mark.parametrize("family", ["hermes", "qwen3_xml", "llama3_json", "llama4", "pythonic", "mistral",
                                    "deepseek_v3", "deepseek_v31", "deepseek_dsml", "harmony", "kimi_k2", "glm45"])
def test_a_forced_call_comes_back_as_a_call_on_every_family(family: str) -> None:
    """Forced calls are guided to JSON whatever the family's own call format, and the gateway reads that
    JSON itself: a named call streams its arguments, `required` returns its calls - also when cut by
    max_tokens after the first call (the calls complete before the cut, not the guide's raw JSON)."""
    from openai_api.services.output import ChoiceOutput, assemble

    reasoning = "harmony" if family == "harmony" else None
    named = plan(tool_choice={"type": "function", "function": {"name": "get_time"}}, parser=family)
    out = ChoiceOutput(named, reasoning, family)
    deltas = out.push('{"tz": ', produced=2) + out.push('"UTC"}', last=True, produced=4)
    answer = assemble(deltas)
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == [("get_time", {"tz": "UTC"})]
    assert answer.content == ""
    required = plan(tool_choice="required", parser=family)
    key = required.args_key
    text = f'[{{"name": "get_time", "{key}": {{"tz": "UTC"}}}}, {{"name": "get_weather", "{key}": {{"ci'
    out = ChoiceOutput(required, reasoning, family)
    answer = assemble([d for ch in text for d in out.push(ch)] + out.push("", last=True, cut=True))
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == [("get_time", {"tz": "UTC"})]
    assert answer.content == ""

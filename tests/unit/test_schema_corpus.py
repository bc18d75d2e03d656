"""Every schema of the corpus (tests/data/schemas, written by its capture.py: what pydantic generates for nested,
recursive, union, discriminated-union, Optional, enum, list/dict/tuple-of-model, generic and pydantic-v1 models,
and the request bodies instructor, pydantic-ai, the Agents SDK, LangChain and the anthropic SDK send for them)
becomes, in every guide the gateway builds from it, a guide the reference model compiles (xgrammar, as
`tests.reference_guides` compiles it) that lets the model write a valid instance and refuses an invalid one.

The guides: `response_format` (the schema alone), a named tool choice (the tool's arguments), `required` (one
call, or a list of calls with parallel tool calls), and `required` among two tools whose schemas both define
an `Address` (`Parcel`'s is another model), where each tool's call must take its own `Address` and not the
other's. Framework bodies go through the gateway as sent (their dialect's own translation to chat for
Responses and Messages bodies), and each of their tools is also forced by name and by `required`.

The oracle for "valid" and "invalid" is jsonschema on the client's own schema, never the gateway's guide.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from openai_api.http.dialects import anthropic_messages as messages
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services import responses
from openai_api.services.guides import request_guide
from openai_api.services.response_tools import ResponseTools
from openai_api.services.tools import plan_tools
from openai_api.triton.llm import Guide
from tests.reference_guides import accepts, compile_error

CORPUS = Path(__file__).resolve().parents[1] / "data" / "schemas"
PYDANTIC = json.loads((CORPUS / "pydantic.json").read_text(encoding="utf-8"))["cases"]
FRAMEWORKS = json.loads((CORPUS / "frameworks.json").read_text(encoding="utf-8"))["cases"]
PARCEL = next(c for c in PYDANTIC if c["name"] == "Parcel")
RT = SimpleNamespace(tool_parser="hermes", template=None, reasoning_parser=None)  # SmolLM2's: no tool template


def _chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 **{k: v for k, v in body.items() if v is not None}})


def _tool(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def _forced(tools: list[dict[str, Any]], choice: Any, parallel: bool | None = None) -> tuple[Guide, Any]:
    plan = plan_tools(RT, _chat({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}))  # type: ignore[arg-type]
    assert plan.guide is not None and plan.forced is not None
    return plan.guide, plan


def _call(plan: Any, name: str, arguments: Any) -> Any:
    """What the model writes for one call under `plan`'s guide."""
    if plan.forced == "named":
        return arguments
    call = {"name": name, plan.args_key: arguments}
    return [call] if plan.parallel else call


def _mutated(value: Any) -> Any:
    """`value` with its first string (else number) replaced by a value of another type."""
    done = False

    def walk(v: Any) -> Any:
        nonlocal done
        if done:
            return v
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str) or (isinstance(v, int | float) and not isinstance(v, bool)):
            done = True
            return 12345 if isinstance(v, str) else "x"
        return v

    return walk(value)


def _valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


def _check(guide: Guide, schema: dict[str, Any], value: Any, write: Any = lambda v: v) -> None:
    """The guide compiles, takes `write(value)` and refuses `write(<value made invalid>)`."""
    assert compile_error(guide) is None, (compile_error(guide), guide.value)
    assert _valid(schema, value), "the corpus instance does not match its own schema"
    assert accepts(guide, write(value)), (guide.value, value)
    bad = _mutated(value)
    if not _valid(schema, bad):
        assert not accepts(guide, write(bad)), (guide.value, bad)


@pytest.mark.parametrize("case", PYDANTIC, ids=[c["name"] for c in PYDANTIC])
def test_pydantic_schemas_in_every_guide(case: dict[str, Any]) -> None:
    schema, value = case["schema"], case["valid"]
    fmt = request_guide(_chat({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": schema}}}))
    assert fmt is not None
    _check(fmt, schema, value)
    tools = [_tool("t", schema)]
    for choice, parallel in (({"type": "function", "function": {"name": "t"}}, None), ("required", True),
                             ("required", False)):
        guide, plan = _forced(tools, choice, parallel)
        _check(guide, schema, value, lambda v, plan=plan: _call(plan, "t", v))


@pytest.mark.parametrize("case", [c for c in PYDANTIC if c is not PARCEL], ids=lambda c: c["name"])
def test_two_tools_defining_the_same_name_keep_their_own_definitions(case: dict[str, Any]) -> None:
    schema, value = case["schema"], case["valid"]
    parcel, parcel_value = PARCEL["schema"], PARCEL["valid"]
    guide, plan = _forced([_tool("t", schema), _tool("parcel", parcel)], "required", False)
    assert compile_error(guide) is None
    assert accepts(guide, _call(plan, "t", value)) and accepts(guide, _call(plan, "parcel", parcel_value))
    assert not accepts(guide, _call(plan, "parcel", value))  # `value` is no Parcel (jsonschema agrees:)
    assert not _valid(parcel, value)
    if not _valid(schema, parcel_value):
        assert not accepts(guide, _call(plan, "t", parcel_value))


def _as_chat(case: dict[str, Any]) -> dict[str, Any]:
    """A captured body as the chat request its route makes of it (the dialects' own translation)."""
    body = case["body"]
    if case["path"] == "/v1/responses":
        tools = ResponseTools(body.get("tools"))
        choice = tools.choice(body.get("tool_choice"))  # before `tools.chat`: allowed_tools narrows it
        return {"tools": tools.chat, "tool_choice": choice if tools.chat else None,
                "response_format": responses.response_format(body.get("text"))}
    if case["path"] == "/v1/messages":
        choice, parallel = messages.chat_tool_choice(body.get("tool_choice"))
        return {"tools": messages.chat_tools(body.get("tools")), "tool_choice": choice, "parallel_tool_calls": parallel}
    assert case["path"] == "/v1/chat/completions"
    return {k: body.get(k) for k in ("tools", "tool_choice", "parallel_tool_calls", "response_format")}


@pytest.mark.parametrize("case", FRAMEWORKS, ids=[f"{c['framework']}-{c['how']}-{c['model']}" for c in FRAMEWORKS])
def test_framework_bodies_as_sent_and_with_every_tool_forced(case: dict[str, Any]) -> None:
    chat = _as_chat(case)
    value = case["valid"]
    guides = 0
    fmt = chat.get("response_format")
    if fmt is not None:
        guide = request_guide(_chat(chat))
        assert guide is not None
        _check(guide, fmt["json_schema"]["schema"], value)
        guides += 1
    tools = chat.get("tools") or []
    if tools:
        [tool] = tools  # each capture offers the one tool that takes the model
        name, schema = tool["function"]["name"], tool["function"]["parameters"]
        plan = plan_tools(RT, _chat(chat))  # type: ignore[arg-type]
        forced = [(plan.guide, plan)] if plan.guide is not None else []
        forced += [_forced(tools, {"type": "function", "function": {"name": name}}), _forced(tools, "required", True),
                   _forced(tools, "required", False)]
        for guide, p in forced:
            _check(guide, schema, value, lambda v, p=p: _call(p, name, v))
            guides += 1
    assert guides

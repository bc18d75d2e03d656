"""Each family's prompt side: the calls the gateway writes into a prompt are the family's own format.

Where a chat template does not render `tools` or `tool_calls`, the gateway writes them itself (`services.tools`,
`text.families.CallPrompt`): the call format in a system message, earlier calls and tool results as text. The
oracles are the golden corpus (tests/data/families/corpus/: what each family's models write, from vLLM's and
SGLang's parser tests and the families' docs), each family's parse side reading back what its prompt side wrote,
and DeepSeek V3.1's own chat template (tests/data/families/deepseek_v31/), which renders calls and results itself.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.tools import apply_plan_to_messages, plan_tools, written_call
from openai_api.text.families import FAMILIES, ToolContext, WrittenCall, make_parser
from openai_api.text.templates import ChatTemplate
from tests.helpers import REPO

DATA = REPO / "tests" / "data" / "families"
CORPORA = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted((DATA / "corpus").glob("*.json"))}
# Where the corpus writes a call exactly as the family's writer does (DeepSeek V3.1's corpus writes compact JSON,
# `{"x":1}`; its template writes the arguments as the client sent them, which the V3.1 test below checks).
WRITTEN_AS_CORPUS = ("deepseek_dsml", "deepseek_v3", "glm45", "harmony", "hermes", "kimi_k2", "llama3_json", "llama4",
                     "mistral", "pythonic", "qwen3_xml")
NO_TOOLS = ChatTemplate.from_string("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")


def _case(family: str, name: str) -> dict[str, Any] | None:
    return next((c for c in CORPORA[family]["cases"] if c["name"] == name), None)


def _written(case: dict[str, Any]) -> list[WrittenCall]:
    return [WrittenCall(c["name"], c["arguments"], c.get("id", "")) for c in case["expect"]["tool_calls"]]


def _read(family: str, text: str, tools: list[dict[str, Any]] | None) -> list[tuple[str, Any, str]]:
    parser = make_parser(family, None, tools_active=True, ctx=ToolContext.from_tools(tools))
    assert parser is not None
    pieces = parser.push(text) + parser.finish()
    assert not [p for p in pieces if p.kind == "content" and p.text.strip()], pieces  # all of it is calls
    return [(p.call.name, json.loads(p.call.arguments), p.call.id) for p in pieces if p.call is not None]


# The cases whose completion ends in calls (harmony's `one_call` thinks first; it ends a generation at each call).
WHOLE_CALLS = [(f, n) for f in WRITTEN_AS_CORPUS
               for n in (("call_without_analysis",) if f == "harmony" else ("one_call", "parallel_calls"))]


@pytest.mark.parametrize(("family", "name"), WHOLE_CALLS)
def test_calls_are_written_as_the_familys_models_write_them(family: str, name: str) -> None:
    case = _case(family, name)
    assert case is not None
    calls = case["completion"].strip().removeprefix(case["expect"]["content"] or "").strip()  # (text before them)
    assert FAMILIES[family].prompt.write(_written(case)) == calls


ARGS = {"city": "Oslo", "days": 3, "ratio": 0.5, "tags": ["a", "b"], "strict": True, "where": {"lat": 59.9}}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_parse_side_reads_back_what_its_prompt_side_writes(family: str) -> None:
    calls = [WrittenCall("get_weather", ARGS, "functions.get_weather:0"), WrittenCall("get_time", {}, "")]
    if FAMILIES[family].parser is not None:
        calls = calls[:1]  # harmony: one call per generation
    got = _read(family, FAMILIES[family].prompt.write(calls), None)
    assert [(name, args) for name, args, _ in got] == [(c.name, c.arguments) for c in calls]
    if family == "kimi_k2":  # the model's own ids come back unchanged; a foreign one is written as Kimi's
        assert [i for _, _, i in got] == ["functions.get_weather:0", "functions.get_time:1"]


def _chat(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 **body})


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_template_that_ignores_tools_is_told_the_models_own_call_format(family: str) -> None:
    rt = SimpleNamespace(tool_parser=family, reasoning_parser=None, template=NO_TOOLS)
    text = plan_tools(rt, _chat(tools=TOOLS)).system_text  # type: ignore[arg-type]
    assert text is not None and FAMILIES[family].prompt.form in text and '"get_weather"' in text
    # Only the families whose calls are wrapped in `<tool_call>` tags describe them.
    assert ("<tool_call>" in text) == (family in ("hermes", "qwen3_xml", "glm45"))


def test_deepseek_v31_history_written_by_the_gateway_is_what_its_own_template_renders() -> None:
    """DeepSeek V3.1's template renders `tool_calls` and tool results itself but not `tools`: the gateway
    describes the tools in DeepSeek's own call format (its model card's), and the calls and results it writes as
    text render to exactly the prompt the template makes of them."""
    template = ChatTemplate.from_file(DATA / "deepseek_v31" / "chat_template.jinja")
    assert not template.uses_tools
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo?"},
                                      {"role": "assistant", "content": None, "tool_calls": [call]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
                                      {"role": "assistant", "content": "It is cold."},
                                      {"role": "user", "content": "Thanks"}]
    rt = SimpleNamespace(tool_parser="deepseek_v31", reasoning_parser=None, template=template)
    plan = plan_tools(rt, _chat(tools=TOOLS))  # type: ignore[arg-type]
    begin, sep = "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581sep\uff5c>"
    assert plan.system_text is not None and f"{begin}<function-name>{sep}" in plan.system_text
    written = apply_plan_to_messages(plan, messages, rt)  # type: ignore[arg-type]
    assert not any(m.get("tool_calls") for m in written)
    reference: list[dict[str, Any]] = [{"role": "system", "content": plan.system_text}, *messages[:1],
                                       {**messages[1], "content": ""}, *messages[2:]]  # (the template adds content)
    cfg = json.loads((DATA / "deepseek_v31" / "tokenizer_config.json").read_text(encoding="utf-8"))
    bos, eos = (t if isinstance(t, str) else t["content"] for t in (cfg["bos_token"], cfg["eos_token"]))
    assert template.render(written, bos_token=bos, eos_token=eos) == \
        template.render(reference, bos_token=bos, eos_token=eos)


def test_written_call_keeps_arguments_that_are_no_json_as_their_text() -> None:
    assert written_call({"function": {"name": "f", "arguments": "not json"}}) == WrittenCall("f", "not json")
    assert written_call({"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}) == \
        WrittenCall("f", {"a": 1}, "c")
    hermes = FAMILIES["hermes"].prompt
    assert hermes.write([WrittenCall("f", "not json")]) == \
        '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>'
    assert hermes.result_text("{}") == "<tool_response>\n{}\n</tool_response>"

"""The prompt side of tool calling: how `tools` and `tool_choice` shape the prompt and the output guide.

Templates that read `tools` get them as the `tools` variable. Templates that ignore tools (SmolLM2's, DeepSeek
V3.1's) get a system message describing them and the call format of the model's own family, as the chatglm.cpp
seed server does, and an earlier assistant turn's calls written back as text in that format: what each family
writes is its own definition's prompt side (`text.families.CallPrompt`), never named here. With `tool_choice`
"auto" the model may call a tool or answer; the family's parse side reads its output.

A forced call is enforced, not hoped for: `tool_choice` naming a function prefills the assistant turn
with the start of that call in the model's own format (`<tool_call>\n{"name": "f", "arguments": ` for hermes)
and guides the rest to the function's parameters schema, so the output *is* the arguments; `required`
prefills the start of a call and guides the output to one of the offered calls (`{"name": <one of
them>, <the family's arguments key>: <its schema>}`), or to a non-empty list of them when `parallel_tool_calls`
allows. The gateway then builds `tool_calls` from that JSON itself. A model whose backend takes no guide gets a
400 for a forced `tool_choice` instead of a call that may not come. Each tool's `$ref`s are hoisted into the
guide's root `$defs` (`schema_refs.RootDefs`): inside the wrapper, `#` is no longer the tool's schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.guides import check_schema
from openai_api.services.registry import LLMRuntime
from openai_api.services.schema_refs import CheckedSchema, RootDefs
from openai_api.text.families import FAMILIES, ParsedToolCall, ToolContext, WrittenCall
from openai_api.triton.llm import Guide


@dataclass
class ToolPlan:
    tools: list[dict[str, Any]] | None = None  # passed to the template's `tools` variable
    system_text: str | None = None  # injected when the template ignores `tools`
    prefill: str = ""  # appended after the generation prompt
    # The tool format read from the output with `tool_choice` auto (`text.families.FAMILIES`); None: no
    # tools, or the output is a forced call's guided JSON.
    family: str | None = None
    ctx: ToolContext = field(default_factory=ToolContext)
    parallel: bool = True
    stops: list[str] = field(default_factory=list)  # extra stop strings
    # A forced call: "named" (the output is `forced_name`'s arguments) or "required" (the output is a
    # call object, or a list of them with `parallel`), with the guide that enforces it.
    forced: Literal["named", "required"] | None = None
    forced_name: str = ""
    guide: Guide | None = None
    args_key: str = "arguments"

    def calls_from(self, text: str, cut: bool = False) -> list[ParsedToolCall] | None:
        """The tool calls a forced call's guided output holds (None: it does not parse). `cut`: the output
        was cut by max_tokens: a `required` list returns the calls that were complete before the cut."""
        if self.forced == "named":
            return [ParsedToolCall(self.forced_name, text)]
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = _complete_items(text) if cut else None
            if not data:
                return None
        items = data if isinstance(data, list) else [data]
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            calls.append(ParsedToolCall(item["name"], json.dumps(item.get(self.args_key, {}), ensure_ascii=False)))
        return calls or None


def _complete_items(text: str) -> list[Any]:
    """The complete items at the start of a JSON array cut short (`[{...}, {...}, {"na`)."""
    body = text.lstrip()
    if not body.startswith("["):
        return []
    decoder = json.JSONDecoder()
    items: list[Any] = []
    pos = 1
    while True:
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError):
            return items
        items.append(item)


def _validate_tools(tools: list[dict[str, Any]]) -> list[str]:
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}.",
                                      param=f"tools[{i}]")
        names.append(fn["name"])
    return names


def _parameters(tools: list[dict[str, Any]], index: int) -> CheckedSchema:
    """A tool's parameters schema, checked (no parameters: an object with none)."""
    param = f"tools[{index}].function.parameters"
    params = tools[index]["function"].get("parameters")
    if params is None:
        return CheckedSchema({"type": "object", "properties": {}}, param)
    return check_schema(params, param)


def _guide(schema: dict[str, Any], defs: RootDefs) -> Guide:
    return Guide("json_schema", json.dumps(defs.root(schema), ensure_ascii=False), "tool_choice", tuple(defs.origins))


def _call_schema(tools: list[dict[str, Any]], args_key: str, at: str, defs: RootDefs) -> dict[str, Any]:
    """Any one of the offered calls, at JSON pointer `at` of the guide: `{"name": <const>, <args_key>: <its
    parameters>}`, each tool's references hoisted into `defs` (`schema_refs`)."""
    calls = []
    for i, t in enumerate(tools):
        name = t["function"]["name"]
        where = f"{at}/properties/{args_key}" if len(tools) == 1 else f"{at}/anyOf/{i}/properties/{args_key}"
        calls.append({"type": "object",
                      "properties": {"name": {"const": name}, args_key: defs.place(_parameters(tools, i), where, name)},
                      "required": ["name", args_key]})
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def plan_tools(rt: LLMRuntime, req: ChatCompletionRequest) -> ToolPlan:
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools.", param="tool_choice")
        return ToolPlan()
    names = _validate_tools(req.tools)
    if choice == "none":
        return ToolPlan()
    family = rt.tool_parser
    prompt = FAMILIES[family].prompt
    plan = ToolPlan(family=family, ctx=ToolContext.from_tools(req.tools), parallel=req.parallel_tool_calls is not False)
    if rt.template is not None and rt.template.uses_tools:
        plan.tools = req.tools
    else:
        plan.system_text = prompt.system_text(req.tools)
    if choice in (None, "auto"):
        return plan
    plan.family = None  # a forced call: the output is guided JSON, read by `calls_from`
    plan.args_key = prompt.args_key
    # A reasoning model thinks first: no prefill (it would skip the thinking), and its backend applies
    # the guide once the reasoning section has ended. Only the JSON formats have a call opening to prefill.
    reasons = rt.reasoning_parser is not None
    opening = "" if reasons else prompt.opening
    if choice == "required":
        defs = RootDefs()
        call = _call_schema(req.tools, plan.args_key, "#/items" if plan.parallel else "#", defs)
        schema = {"type": "array", "items": call, "minItems": 1} if plan.parallel else call
        plan.forced, plan.prefill = "required", opening
        plan.guide = _guide(schema, defs)
        return plan
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise InvalidRequestError(f"tool_choice names function {name!r}, which is not in tools.",
                                      param="tool_choice")
        defs = RootDefs()
        params = defs.place(_parameters(req.tools, names.index(name)), "#", name)
        # The call's start in the model's own format keeps the model in context; the guide does the rest.
        opens = f'{{"name": {json.dumps(name)}, "{plan.args_key}": '
        plan.prefill = "" if reasons or not prompt.json_call else opening + opens
        plan.forced, plan.forced_name, plan.parallel = "named", name, False
        plan.guide = _guide(params, defs)
        return plan
    raise InvalidRequestError("tool_choice must be 'none', 'auto', 'required' or "
                              "{'type': 'function', 'function': {'name': ...}}.", param="tool_choice")


def written_call(call: dict[str, Any]) -> WrittenCall:
    """An assistant's earlier tool call (OpenAI's shape), for its family to write back: arguments as the JSON
    value they hold (the text itself when they hold none)."""
    fn = call.get("function") or {}
    args: Any = fn.get("arguments", "{}")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        pass
    return WrittenCall(str(fn.get("name") or ""), args, str(call.get("id") or ""))


def apply_plan_to_messages(plan: ToolPlan, messages: list[dict[str, Any]], rt: LLMRuntime) -> list[dict[str, Any]]:
    """`messages` for a template that ignores tools: earlier calls and tool results written as text in the model's
    own family's format, and the plan's system text (the tools and the call format) in the first system message."""
    if rt.template is not None and rt.template.uses_tools:
        return messages
    prompt = FAMILIES[rt.tool_parser].prompt
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = prompt.write([written_call(c) for c in m["tool_calls"]])
            m = {**m, "content": ((m.get("content") or "") + ("\n" if m.get("content") else "") + calls)}
            m.pop("tool_calls")
        elif m["role"] == "tool":
            m = {**m, "content": prompt.result_text(str(m.get("content") or ""))}
        out.append(m)
    if plan.system_text:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{plan.system_text}"}
        else:
            out.insert(0, {"role": "system", "content": plan.system_text})
    return out

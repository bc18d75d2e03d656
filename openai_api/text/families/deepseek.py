"""DeepSeek's formats: V3 / R1-0528 (`deepseek_v3`), V3.1 (`deepseek_v31`) and V3.2 / V4 "DSML" (`deepseek_dsml`).

The markers are DeepSeek's tokenizer's own (`<` U+FF5C name U+FF5C `>`, spaces as U+2581; `DS_*` below):
V3:   `CALLS_BEGIN CALL_BEGIN function SEP NAME\\n```json\\n{...}\\n``` CALL_END ... CALLS_END`
V3.1: `CALLS_BEGIN CALL_BEGIN NAME SEP {...} CALL_END ... CALLS_END` (DeepSeek's model card describes exactly
      this form in the system prompt: its template does not render `tools`)
DSML: `<DSML function_calls>` (V3.2; `tool_calls` in V4) holding `<DSML invoke name="NAME">` blocks of
      `<DSML parameter name="K" string="true|false">V</DSML parameter>` tags or a JSON object (`DSML`: U+FF5C
      DSML U+FF5C).
DeepSeek's templates wrap a tool's result in their own output markers, so the gateway writes it bare.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from openai_api.text.families.calls import RawCall, ToolContext, all_matches, as_object, json_calls, typed_value
from openai_api.text.families.family import CallPrompt, Marks, Region, ToolFormat, WrittenCall, as_text, dump


def _ds(name: str) -> str:
    """A DeepSeek marker as its tokenizer writes it: `<` U+FF5C name U+FF5C `>`, spaces as U+2581."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


DS_CALLS_BEGIN, DS_CALLS_END = _ds("tool calls begin"), _ds("tool calls end")
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = _ds("tool call begin"), _ds("tool call end"), _ds("tool sep")
DSML = "\uff5cDSML\uff5c"
_DS = (DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP)
_DS_V3_CALL = re.compile(re.escape(DS_CALL_BEGIN) + "(?:.*?)" + re.escape(DS_SEP)
                         + r"(?P<name>.*?)\n```(?:json)?\n(?P<args>.*?)\n```\s*" + re.escape(DS_CALL_END), re.DOTALL)
_DS_V31_CALL = re.compile(re.escape(DS_CALL_BEGIN) + "(?P<name>.*?)" + re.escape(DS_SEP) + "(?P<args>.*?)"
                          + re.escape(DS_CALL_END), re.DOTALL)
_BARE = "{}"  # a tool's result: the template writes DeepSeek's own output markers around it

_decode_deepseek_v3 = json_calls(_DS_V3_CALL, "`CALL_BEGIN function SEP NAME\\n```json\\n{...}\\n``` CALL_END` "
                                 "(V3, R1-0528; markers `DS_*`).")
_decode_deepseek_v31 = json_calls(_DS_V31_CALL, "`CALL_BEGIN NAME SEP {...} CALL_END` (V3.1; markers `DS_*`).")


def _calls_block(calls: Sequence[str]) -> str:
    return DS_CALLS_BEGIN + "".join(calls) + DS_CALLS_END


DEEPSEEK_V3 = ToolFormat(
    "deepseek_v3", (Region(DS_CALLS_BEGIN, DS_CALLS_END),), _decode_deepseek_v3,
    CallPrompt(_calls_block([f"{DS_CALL_BEGIN}function{DS_SEP}<function-name>\n```json\n<arguments-json-object>\n```"
                             f"{DS_CALL_END}"]),
               lambda calls: _calls_block([f"{DS_CALL_BEGIN}function{DS_SEP}{c.name}\n```json\n{dump(c.arguments)}\n```"
                                           f"{DS_CALL_END}" for c in calls]), result=_BARE),
    Marks(template=lambda t: DS_CALLS_BEGIN in t and "```json" in t, token=DS_CALLS_BEGIN, shared=("deepseek_v31",)),
    inner=_DS, models="DeepSeek V3, V3-0324, R1-0528")

DEEPSEEK_V31 = ToolFormat(
    "deepseek_v31", (Region(DS_CALLS_BEGIN, DS_CALLS_END),), _decode_deepseek_v31,
    CallPrompt(_calls_block([f"{DS_CALL_BEGIN}<function-name>{DS_SEP}<arguments-json-object>{DS_CALL_END}"]),
               lambda calls: _calls_block([f"{DS_CALL_BEGIN}{c.name}{DS_SEP}{dump(c.arguments)}{DS_CALL_END}"
                                           for c in calls]), result=_BARE),
    Marks(template=lambda t: DS_CALLS_BEGIN in t),
    inner=_DS, models="DeepSeek V3.1, V3.1-Terminus")


_DSML_INVOKE = re.compile(f"<(?:{DSML})?" + r'invoke\s+name="([^"]+)"\s*>(.*?)' + f"</(?:{DSML})?invoke>", re.DOTALL)
_DSML_PARAM = re.compile(f"<(?:{DSML})?" + r'parameter\s+name="([^"]+)"\s+string="(true|false)"\s*>(.*?)'
                         + f"</(?:{DSML})?parameter>", re.DOTALL)


def _decode_dsml(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """DeepSeek V3.2/V4 "DSML": `<\uff5cDSML\uff5cinvoke name="NAME">` holding `<\uff5cDSML\uff5cparameter name="K"
    string="true|false">V</\uff5cDSML\uff5cparameter>` tags (typed by the schema, else by `string`) or a JSON object."""
    matches = all_matches(_DSML_INVOKE, text, partial)
    if matches is None:
        return None
    calls = []
    for m in matches:
        body = m.group(2).strip()
        args: dict[str, Any] | None
        if body.startswith("{"):
            args = as_object(body)
        else:
            args = {}
            name = m.group(1).strip()
            for p in _DSML_PARAM.finditer(body):
                # The tool's schema decides the type when it has one (as vLLM's parser); else the tag's
                # `string` attribute: "true" keeps the text, "false" reads it as JSON.
                kind = ctx.param_type(name, p.group(1)) or ("string" if p.group(2) == "true" else None)
                args[p.group(1)] = typed_value(p.group(3), kind)
            if _DSML_PARAM.sub("", body).strip():
                args = None
        if args is None:
            return None
        calls.append(RawCall(m.group(1).strip(), args))
    return calls


def _dsml_param(key: str, value: Any) -> str:
    string = "true" if isinstance(value, str) else "false"
    return f'<{DSML}parameter name="{key}" string="{string}">{as_text(value)}</{DSML}parameter>\n'


def _write_dsml(calls: Sequence[WrittenCall]) -> str:
    """V3.2's `function_calls` block (V4's `tool_calls` block holds the same invokes; the parser reads both)."""
    invokes = "".join(f'<{DSML}invoke name="{c.name}">\n' + "".join(_dsml_param(k, v) for k, v in c.items())
                      + f"</{DSML}invoke>\n" for c in calls)
    return f"<{DSML}function_calls>\n{invokes}</{DSML}function_calls>"


# V3.2 writes its invokes in a `function_calls` block; V4 keeps the invoke / parameter grammar in a
# `tool_calls` block (DeepSeek's encoding_dsv4.py `tool_calls_block_name`, vLLM's `deepseek_v4` parser).
DEEPSEEK_DSML = ToolFormat(
    "deepseek_dsml", (Region(f"<{DSML}function_calls>", f"</{DSML}function_calls>"),
                      Region(f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"),
                      Region("<function_calls>", "</function_calls>")), _decode_dsml,
    CallPrompt(f'<{DSML}function_calls>\n<{DSML}invoke name="<function-name>">\n<{DSML}parameter name="<argument>" '
               f'string="<true for a string value, else false>"><value></{DSML}parameter>\n...\n</{DSML}invoke>\n'
               f"</{DSML}function_calls>", _write_dsml, result=_BARE),
    Marks(template=lambda t: DSML in t, token=DSML, tokens=lambda t: any(DSML in x for x in t)),
    models="DeepSeek V3.2, V4")

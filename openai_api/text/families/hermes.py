"""The `<tool_call>` families of Hermes and Qwen: a JSON call (`hermes`) or Qwen3-Coder's XML (`qwen3_xml`).

hermes: `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`, one call per region, the regions on
lines of their own. It is also the format the gateway describes to a model whose template ignores tools when
nothing the model ships names a family (`detect.py`).
qwen3_xml: `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>`,
values as text typed by the tool's schema.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from openai_api.text.families.calls import RawCall, ToolContext, as_object, loads, typed_value
from openai_api.text.families.family import CallPrompt, Marks, Region, ToolFormat, WrittenCall, as_text, dump_object

TOOL_CALL = Region("<tool_call>", "</tool_call>")


def _decode_hermes(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`{"name": ..., "arguments": {...}}` (Hermes, Qwen 2.5/3, SmolLM2); one call per region."""
    if partial:
        return []
    obj = loads(text.strip())
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = as_object(obj.get("arguments", obj.get("parameters", {})))
    return None if args is None else [RawCall(obj["name"], args)]


def _write_hermes(calls: Sequence[WrittenCall]) -> str:
    return "\n".join("<tool_call>\n" + dump_object(("name", c.name), ("arguments", c.arguments)) + "\n</tool_call>"
                     for c in calls)


HERMES = ToolFormat(
    "hermes", (TOOL_CALL,), _decode_hermes,
    CallPrompt('<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>',
               _write_hermes, opening="<tool_call>\n", json_call=True),
    Marks(template=lambda t: "<tool_call>" in t, token="<tool_call>", shared=("qwen3_xml",)),
    models="Hermes 2/3, Qwen2.5, Qwen3 (instruct and thinking), QwQ, SmolLM2/3")


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _decode_qwen3_xml(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>` (Qwen3-Coder, Qwen3.5): values
    are text, typed by the tool's schema; one newline after the opening and before the closing tag is
    layout."""
    if partial:
        end = text.rfind("</function>")
        if end == -1:
            return []
        text = text[: end + len("</function>")]
    calls = []
    for fm in _FUNCTION.finditer(text):
        name, body = fm.group(1).strip(), fm.group(2)
        args: dict[str, Any] = {}
        for pm in _PARAMETER.finditer(body):
            value = pm.group(2).removeprefix("\n").removesuffix("\n")
            key = pm.group(1).strip()
            args[key] = typed_value(value, ctx.param_type(name, key))
        calls.append(RawCall(name, args))
    if not calls or _FUNCTION.sub("", text).strip():
        return None
    return calls


def _write_qwen3_xml(calls: Sequence[WrittenCall]) -> str:
    return "\n".join(f"<tool_call>\n<function={c.name}>\n"
                     + "".join(f"<parameter={k}>\n{as_text(v)}\n</parameter>\n" for k, v in c.items())
                     + "</function>\n</tool_call>" for c in calls)


QWEN3_XML = ToolFormat(
    "qwen3_xml", (TOOL_CALL,), _decode_qwen3_xml,
    CallPrompt("<tool_call>\n<function=<function-name>>\n<parameter=<argument>>\n<value>\n</parameter>\n"
               "...\n</function>\n</tool_call>", _write_qwen3_xml),
    Marks(template=lambda t: "<function=" in t or "<parameter=" in t),
    models="Qwen3-Coder, Qwen3.5")

"""GLM-4.5 / 4.6 / 4.7 (`glm45`): `<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>...</tool_call>`.

Values are text typed by the tool's schema (strings stay text, everything else is read as JSON); one call per
region, and a region without its end marker is not a call (`needs_end`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from openai_api.text.families.calls import RawCall, ToolContext, typed_value
from openai_api.text.families.family import CallPrompt, Marks, Region, ToolFormat, WrittenCall, as_text

_ARG_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _decode_glm45(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>...` (GLM-4.5/4.6/4.7): values typed by
    the schema (strings stay text, everything else is read as JSON); one call per region."""
    if partial:
        return []
    cut = text.find("<arg_key>")
    name = (text if cut == -1 else text[:cut]).strip()
    if not name or "<" in name or "\n" in name:
        return None
    rest = "" if cut == -1 else text[cut:]
    args = {m.group(1).strip(): typed_value(m.group(2), ctx.param_type(name, m.group(1).strip()))
            for m in _ARG_PAIR.finditer(rest)}
    if _ARG_PAIR.sub("", rest).strip():
        return None
    return [RawCall(name, args)]


def _write_glm45(calls: Sequence[WrittenCall]) -> str:
    return "\n".join(f"<tool_call>{c.name}\n"
                     + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{as_text(v)}</arg_value>\n" for k, v in c.items())
                     + "</tool_call>" for c in calls)


GLM45 = ToolFormat(
    "glm45", (Region("<tool_call>", "</tool_call>"),), _decode_glm45,
    CallPrompt("<tool_call><function-name>\n<arg_key><argument></arg_key>\n<arg_value><value></arg_value>\n"
               "...\n</tool_call>", _write_glm45),
    Marks(template=lambda t: "<arg_key>" in t, token="<arg_key>"),
    inner=("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"), needs_end=True,
    models="GLM-4.5, GLM-4.6, GLM-4.7")

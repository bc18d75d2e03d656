"""Kimi K2 (`kimi_k2`): `<|tool_calls_section_begin|>` holding `<|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{...}<|tool_call_end|>` per call. The id (`functions.NAME:IDX`) is the model's own: it
is the call's id, and must come back unchanged in history."""

from __future__ import annotations

import re
from collections.abc import Sequence

from openai_api.text.families.calls import json_calls
from openai_api.text.families.family import CallPrompt, Marks, Region, ToolFormat, WrittenCall, dump

_KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>")
_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(?P<id>.*?)\s*<\|tool_call_argument_begin\|>(?P<args>.*?)"
                        r"<\|tool_call_end\|>", re.DOTALL)
_KIMI_ID = re.compile(r"functions\.[^:\s]+:\d+")

_decode_kimi_k2 = json_calls(_KIMI_CALL, "`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}"
                             "<|tool_call_end|>`: the id is the model's own and must come back unchanged in history.")


def _write_kimi_k2(calls: Sequence[WrittenCall]) -> str:
    """Each call under its own id when it is one Kimi writes, else `functions.NAME:IDX` by its place."""
    body = "".join(f"{_KIMI[2]}{c.id if _KIMI_ID.fullmatch(c.id) else f'functions.{c.name}:{i}'}{_KIMI[3]}"
                   f"{dump(c.arguments)}{_KIMI[4]}" for i, c in enumerate(calls))
    return f"{_KIMI[0]}{body}{_KIMI[1]}"


KIMI_K2 = ToolFormat(
    "kimi_k2", (Region(_KIMI[0], _KIMI[1]),), _decode_kimi_k2,
    CallPrompt(f"{_KIMI[0]}{_KIMI[2]}functions.<function-name>:<call-index>{_KIMI[3]}<arguments-json-object>"
               f"{_KIMI[4]}{_KIMI[1]}", _write_kimi_k2),
    Marks(template=lambda t: _KIMI[0] in t, token=_KIMI[0]),
    inner=_KIMI, ids=lambda: "", models="Kimi K2, K2-Instruct-0905, K2-Thinking")

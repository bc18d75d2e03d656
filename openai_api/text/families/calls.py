"""Tool calls as the parsers read them, and the readers every family's decoder shares.

A decoder (`Decoder`) reads one call region's text into `RawCall`s - the function's name, its arguments as a
JSON object, the id the model wrote if it writes one - or None when the text is not a well-formed region of
its family (the engine then shows it as content). `ToolContext` is what a decoder may know of the request:
the offered functions and their parameter schemas (formats that write values as text are typed by them).
The engine turns `RawCall`s into `ParsedToolCall`s: the OpenAI call, arguments as a JSON string.

Readers here never evaluate what they read (`ast.literal_eval` at most) and are bounded: a region over
`MAX_REGION_CHARS` is never decoded, and recursion or memory errors of a hostile nesting read as "not a call".
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A region longer than this is not decoded (it falls back to content): bounds the work a hostile or
# runaway output can cause in the decoders (regexes, `ast.parse`).
MAX_REGION_CHARS = 4 * 1024 * 1024


def openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it
    id: str = field(default_factory=openai_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class RawCall:
    """A call as a decoder read it: the function's name, its arguments as a JSON object, and the id the
    model wrote itself (Kimi K2's `functions.name:0`), if any."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class ToolContext:
    """What decoders may know of the request: the offered functions (None: any name) and their parameter
    schemas (formats that write values as text, such as Qwen3-Coder's XML, type them by the schema)."""

    allowed: frozenset[str] | None = None
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_tools(cls, tools: list[dict[str, Any]] | None) -> ToolContext:
        if not tools:
            return cls()
        schemas = {}
        for t in tools:
            fn = t.get("function") if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                params = fn.get("parameters")
                schemas[fn["name"]] = params if isinstance(params, dict) else {}
        return cls(frozenset(schemas), schemas)

    def param_type(self, function: str, param: str) -> str | None:
        """The JSON-schema type of a parameter (the first non-null one of a list), or None if unknown."""
        props = self.schemas.get(function, {}).get("properties")
        spec = props.get(param) if isinstance(props, dict) else None
        if not isinstance(spec, dict):
            return None
        kind = spec.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        if kind is None and "enum" in spec:
            return "string" if all(isinstance(v, str) for v in spec["enum"]) else None
        if kind is None:
            for key in ("anyOf", "oneOf"):
                for alt in spec.get(key) or []:
                    if isinstance(alt, dict) and isinstance(alt.get("type"), str) and alt["type"] != "null":
                        return str(alt["type"])
        return kind if isinstance(kind, str) else None


Decoder = Callable[[str, ToolContext, bool], list[RawCall] | None]
# `partial`: the output was cut by max_tokens inside this region: return the calls that are complete
# before the cut (possibly none), and drop the rest.


def loads(text: str) -> Any:
    """JSON text's value, or None when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def json_prefix(text: str) -> tuple[Any, str] | None:
    """The JSON value at the start of `text` (after whitespace) and what follows it, or None."""
    body = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except (ValueError, RecursionError):
        return None
    return value, body[end:]


def as_object(value: Any) -> dict[str, Any] | None:
    """Arguments as a JSON object: a dict, or a string holding one (some models quote them)."""
    if isinstance(value, str):
        value = loads(value)
    return value if isinstance(value, dict) else None


def typed_value(raw: str, kind: str | None) -> Any:
    """A value written as text (XML formats), typed by its parameter's schema type, as vLLM and SGLang do:
    strings stay text; numbers, booleans, objects and arrays are read as JSON (then as a Python literal);
    a value that does not read as its type stays text."""
    if kind in ("string", "str", "text"):
        return raw
    text = raw.strip()
    if text.lower() in ("null", "none") and kind != "string":
        return None
    if kind in ("integer", "int"):
        try:
            return int(text)
        except ValueError:
            return raw
    if kind in ("number", "float"):
        try:
            num = float(text)
        except ValueError:
            return raw
        return int(num) if num.is_integer() and "." not in text and "e" not in text.lower() else num
    if kind in ("boolean", "bool"):
        return text.lower() == "true" if text.lower() in ("true", "false") else raw
    value = loads(text)
    if value is not None:
        return value
    if kind in ("object", "array"):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
            return raw
    return raw


def split_top_level(text: str, sep: str) -> list[str]:
    """Split on `sep` outside JSON strings and brackets."""
    parts, depth, in_str, esc, start = [], 0, False, False, 0
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def all_matches(pattern: re.Pattern[str], text: str, partial: bool) -> list[re.Match[str]] | None:
    """Every match of `pattern`, or None when anything but whitespace lies outside them (`partial`: the
    text was cut, so what follows the last whole match is the cut call, dropped)."""
    matches = list(pattern.finditer(text))
    if partial:
        return matches
    if not matches or pattern.sub("", text).strip():
        return None
    return matches


def json_calls(pattern: re.Pattern[str], doc: str) -> Decoder:
    """A decoder for formats whose calls each match `pattern`, with named groups `name` (or `id`, whose
    part before `:` less `functions.` is the name) and `args` (a JSON object)."""

    def decode(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
        matches = all_matches(pattern, text, partial)
        if matches is None:
            return None
        calls = []
        for m in matches:
            groups = m.groupdict()
            call_id = (groups.get("id") or "").strip() or None
            name = (groups.get("name") or (call_id or "").split(":", 1)[0].removeprefix("functions.")).strip()
            args = as_object(m.group("args").strip())
            if args is None or not name:
                return None
            calls.append(RawCall(name, args, call_id))
        return calls

    decode.__doc__ = doc
    return decode

"""Bounds on the client JSON the gateway walks, so that what it cannot check is a 400, never a 5xx.

Every part of the gateway that walks a client's JSON recursively (schema checks, the chat template's
`tojson`, `json.dumps` of a guide, copies of stored responses, the error formatter) would die in a
`RecursionError` on JSON nested deeply enough, and a check that is linear in a schema's size still
holds the event loop for as long as the schema is large. So, before any of that runs:

* a request body (chat, completions, responses, tokenize) is nested at most `MAX_JSON_DEPTH` levels,
  each JSON object and array one level, the body itself level 1 (in `{"tools": [{"function":
  {"parameters": {...}}}]}` the parameters object is level 5); a body nested past the JSON parser's own
  limit (`PARSER_DEPTH`) is refused as it is read (`http.fastpath`);
* a JSON schema (`response_format`, `tools[].function.parameters` when a call is forced, vLLM's
  `guided_json` / `structured_outputs.json`, the Responses API's `text.format`) is nested at most
  `MAX_JSON_DEPTH` levels of its own and holds at most `MAX_SCHEMA_VALUES` JSON values (every object,
  array, string, number, boolean and null, at any depth; an `enum` of 100,000 values is 100,000);
* its objects leave at most `MAX_OPTIONAL_PROPERTIES` properties optional, all together
  (`services.guides`: the grammar engine's compile time grows steeply with them);
* a regular expression or grammar (vLLM's `guided_regex` / `guided_grammar`, `structured_outputs.regex` /
  `.grammar`) and a list of choices (`guided_choice`, as JSON) are at most `MAX_GUIDE_CHARS` characters:
  the backend compiles them before the first token, in time that grows with their size;
* its `$ref`s (`services.guides`) point inside it, follow at most `MAX_REF_HOPS` references in a row
  before reaching a schema that is not a reference, and never close a loop that produces no output
  (`a` -> `b` -> `a`, or `a` -> `anyOf: [a, ...]`).

Each limit is a 400 naming the parameter (the path inside it where it was crossed) and the limit.
The walk here is iterative (no recursion of its own) and stops at the first excess, so its cost is
bounded by the limit, not by what a client sends.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import ChatMessage, ToolCall, ToolCallFunction

# Levels of JSON nesting in a request body, and in a schema of its own. A 50-level object schema
# (`{"type": "object", "properties": {"a": ...}}` 50 times, 101 levels) fits; OpenAI's own structured
# outputs take 10 levels. Every recursive walk downstream stays far below Python's recursion limit.
MAX_JSON_DEPTH = 128
# JSON values in one schema: 5,000 properties (about 10,000 values) fit; checking the largest takes
# tens of milliseconds on the event loop.
MAX_SCHEMA_VALUES = 50_000
# `$ref`s followed in a row before a schema that is not one.
MAX_REF_HOPS = 32
# Properties a schema's objects may leave out (not in `required`), all objects together. The grammar
# engine behind guided decoding compiles optional properties in time that grows steeply with their
# number (xgrammar 0.2.8, one object on this 2-core CPU: 600 in 0.3 s, 1,000 in 1.2 s, 2,000 in 24 s,
# 5,000 in minutes); required ones are cheap (5,000 in 1.4 s).
MAX_OPTIONAL_PROPERTIES = 1000
# Characters of a regex, grammar or choice list. xgrammar (0.2.8, the SmolLM2 tokenizer, one thread on this
# 2-core CPU) compiles a 14,000-character alternation regex in 0.13 s, 50,000 characters in 1.3 s (grammars
# are cheaper: 127,000 characters in 0.24 s); real patterns and grammars are a few thousand characters.
MAX_GUIDE_CHARS = 32 * 1024
# pydantic's JSON parser (jiter) refuses JSON nested deeper than this.
PARSER_DEPTH = 200

Excess = tuple[Literal["depth", "values"], list[str | int]]
# JSON's scalars: what the walk counts without looking inside (one set lookup instead of three isinstance
# checks per value: an agent turn's body has tens of thousands of them).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _items(node: Any) -> Iterator[tuple[str | int, Any]] | None:
    if isinstance(node, dict):
        return iter(node.items())
    if isinstance(node, list):
        return iter(enumerate(node))
    if isinstance(node, BaseModel):  # a validated request: its fields, then its unknown (extra) ones
        return iter([*node.__dict__.items(), *(node.model_extra or {}).items()])
    return None


# Levels a plain chat message (`_plain_message`) spans, itself included: the message, its `tool_calls`, a call,
# the call's `function`.
_MESSAGE_LEVELS = 4


def _plain_message(node: Any) -> bool:
    """Whether `node` is a `ChatMessage` that spans at most `_MESSAGE_LEVELS` levels by its shape alone: every
    field a leaf of the walk (a scalar, or typed parts, `TypedContent`) but `tool_calls`, a list of calls
    (`_plain_call`), and scalar extra fields. Every message a dialect builds from typed parts is one, and an
    agent turn holds a hundred or more of them: walking each value of each cost ~0.1 ms a turn for nothing.
    (False only means "walk it".)"""
    if type(node) is not ChatMessage:
        return False
    for name, v in node.__dict__.items():
        if type(v) in _SCALARS:
            continue
        if name == "tool_calls" and type(v) is list:
            for call in v:
                if not _plain_call(call):
                    return False
        elif _items(v) is not None:
            return False
    extra = node.__pydantic_extra__
    if extra:
        for v in extra.values():
            if type(v) not in _SCALARS:
                return False
    return True


def _plain_call(call: Any) -> bool:
    """A call of the schema's own types, without extra fields, whose fields and function's fields are scalars."""
    if type(call) is not ToolCall or call.__pydantic_extra__:
        return False
    for name, v in call.__dict__.items():
        if type(v) in _SCALARS:
            continue
        if name != "function" or type(v) is not ToolCallFunction or v.__pydantic_extra__:
            return False
        for x in v.__dict__.values():
            if type(x) not in _SCALARS:
                return False
    return True


def find_excess(value: Any, max_depth: int, max_values: int | None = None) -> Excess | None:
    """The first place where `value` (JSON, or a pydantic model of JSON) is nested more than `max_depth`
    levels (the value itself, when an object or array, is level 1) or, with `max_values`, where its
    values pass that many: ("depth" | "values", the path to it). None when it is within both."""
    top = _items(value)
    if top is None:
        return None
    count = 1
    path: list[str | int] = []
    stack = [top]
    while stack:
        for key, child in stack[-1]:
            count += 1
            if max_values is not None and count > max_values:
                return "values", [*path, key]
            if type(child) in _SCALARS:
                continue
            # A plain chat message within reach of the limit holds no excess: not walked (nor counted, so only
            # where values are not).
            if type(child) is ChatMessage and max_values is None and len(stack) + _MESSAGE_LEVELS <= max_depth \
                    and _plain_message(child):
                continue
            children = _items(child)
            if children is not None:
                if len(stack) >= max_depth:
                    return "depth", [*path, key]
                path.append(key)
                stack.append(children)
                break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def json_path(parts: list[str | int]) -> str:
    """`[0, "function", "parameters"]` -> `[0].function.parameters`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _shown(where: str, limit: int = 120) -> str:
    """A path short enough for a message: its start and its end."""
    return where if len(where) <= limit else f"{where[:60]}...{where[-50:]}"


def check_body_depth(body: BaseModel) -> None:
    """400 naming the field when a validated request body is nested more than `MAX_JSON_DEPTH` levels."""
    excess = find_excess(body, MAX_JSON_DEPTH)
    if excess is not None:
        where = json_path(excess[1]).lstrip(".")
        top = str(excess[1][0])
        raise InvalidRequestError(
            f"'{top}' is nested too deeply: '{_shown(where)}' is past the gateway's limit of {MAX_JSON_DEPTH} "
            "levels of JSON nesting in a request body.", param=top, code="too_deeply_nested")


def check_schema_bounds(schema: Any, param: str) -> None:
    """400 naming `param` and the path inside it when a schema passes `MAX_JSON_DEPTH` levels of nesting
    or `MAX_SCHEMA_VALUES` values."""
    excess = find_excess(schema, MAX_JSON_DEPTH, MAX_SCHEMA_VALUES)
    if excess is None:
        return
    kind, parts = excess
    where = _shown(f"{param}{json_path(parts)}")
    if kind == "depth":
        raise InvalidRequestError(
            f"'{param}' is nested too deeply to check: '{where}' is past the limit of {MAX_JSON_DEPTH} levels "
            "of JSON nesting in a schema.", param=param, code="schema_too_deep")
    raise InvalidRequestError(
        f"'{param}' is too large to check: it has more than {MAX_SCHEMA_VALUES:,} JSON values (passed at "
        f"'{where}'), the limit for a schema.", param=param, code="schema_too_large")


_POSITION = re.compile(r"recursion limit exceeded at line (\d+) column (\d+)")


def deep_body_error(body: bytes) -> InvalidRequestError | None:
    """The 400 for a request body nested past the JSON parser's limit (`PARSER_DEPTH`), naming the
    top-level field that holds the deep part; None when the body is not nested that deep. The body up
    to where the parser stopped is JSON within its limit, parsed as partial JSON to find that field."""
    try:
        pydantic_core.from_json(body)
        return None
    except ValueError as e:
        found = _POSITION.search(str(e))
    if found is None:
        return None
    line, column = int(found[1]), int(found[2])
    start = 0
    for _ in range(line - 1):
        start = body.find(b"\n", start) + 1
    try:
        head = pydantic_core.from_json(body[: start + column - 1], allow_partial=True)
    except ValueError:
        head = None
    param = str(list(head)[-1]) if isinstance(head, dict) and head else None
    where = f"'{param}' is nested too deeply" if param else "The request body is nested too deeply"
    return InvalidRequestError(
        f"{where}: past {PARSER_DEPTH} levels of JSON nesting (at line {line}, column {column}), while the "
        f"gateway's limit is {MAX_JSON_DEPTH} levels in a request body.", param=param, code="too_deeply_nested")

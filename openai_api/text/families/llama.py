"""Meta's formats: Llama 3.1-3.3 JSON calls (`llama3_json`) and pythonic calls (`pythonic`, and `llama4` between
`<|python_start|>` and `<|python_end|>`).

llama3_json: the whole answer is `{"name": NAME, "parameters": {...}}`, several separated by `;`, or the same
after `<|python_tag|>`. pythonic: the whole answer is `[f(a=1), g(b="x")]`, read with `ast` - parsed, never
evaluated.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from openai_api.text.families.calls import RawCall, ToolContext, as_object, loads, split_top_level
from openai_api.text.families.family import CallPrompt, Marks, Region, ToolFormat, WrittenCall, dump_object


def _decode_llama3_json(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`{"name": ..., "parameters": {...}}`, several separated by `;` (Llama 3.1-3.3 JSON tool calling)."""
    calls: list[RawCall] = []
    for part in split_top_level(text.strip(), ";"):
        obj = loads(part.strip())
        # The arguments' key is required (`{"name": "f"}` alone is text, as vLLM's llama3_json reads it).
        args = as_object(obj.get("parameters", obj.get("arguments"))) if isinstance(obj, dict) else None
        if args is None or not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return calls if partial else None
        calls.append(RawCall(obj["name"], args))
    return calls if partial else calls or None


def _write_llama3_json(calls: Sequence[WrittenCall]) -> str:
    return "; ".join(dump_object(("name", c.name), ("parameters", c.arguments)) for c in calls)


LLAMA3_JSON = ToolFormat(
    "llama3_json", (Region("<|python_tag|>"), Region("{", lead=True)), _decode_llama3_json,
    CallPrompt('{"name": <function-name>, "parameters": <arguments-json-object>}', _write_llama3_json,
               args_key="parameters", json_call=True),
    Marks(template=lambda t: "<|python_tag|>" in t or ("<|eot_id|>" in t and '"parameters"' in t),
          token="<|python_tag|>"),
    models="Llama 3.1, 3.2, 3.3 (JSON tool calling)")


def _decode_pythonic(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`[f(a=1), g(b="x")]` (Llama 3.2/4 pythonic, Gemma, ...): read with `ast`, values as literals -
    parsed, never evaluated; positional arguments, attribute calls and non-literal values are not calls."""
    if partial:  # the longest list of whole calls before the cut: `[f(a=1), g(b=` -> `[f(a=1)]`
        body = text.strip()
        for cut in sorted((i for i, ch in enumerate(body) if ch == ","), reverse=True)[:64]:
            calls = _decode_pythonic(body[:cut] + "]", ctx)
            if calls:
                return calls
        return []
    body = text.strip()
    if not body.startswith("["):
        body = f"[{body}]"
    try:
        tree = ast.parse(body, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                return None
        calls.append(RawCall(node.func.id, args))
    return calls or None


def _write_pythonic(calls: Sequence[WrittenCall]) -> str:
    """Values as Python literals (`repr` of the JSON value: `'LA'`, `True`, `None`, `[1, 2]`)."""
    return "[" + ", ".join(f"{c.name}(" + ", ".join(f"{k}={v!r}" for k, v in c.items()) + ")" for c in calls) + "]"


_PYTHONIC_FORM = "[<function-name>(<argument>=<value>, ...)]"

PYTHONIC = ToolFormat(
    "pythonic", (Region("[", lead=True),), _decode_pythonic,
    CallPrompt(_PYTHONIC_FORM, _write_pythonic),
    models="Llama 3.2 pythonic, Gemma 3, Granite, ToolACE")

LLAMA4 = ToolFormat(
    "llama4", (Region("<|python_start|>", "<|python_end|>"), Region("[", lead=True)), _decode_pythonic,
    CallPrompt(f"<|python_start|>{_PYTHONIC_FORM}<|python_end|>",
               lambda calls: f"<|python_start|>{_write_pythonic(calls)}<|python_end|>"),
    Marks(template=lambda t: "<|python_start|>" in t, token="<|python_start|>"),
    models="Llama 4 Scout / Maverick (pythonic)")

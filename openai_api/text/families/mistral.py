"""Mistral's `[TOOL_CALLS]` format (`mistral`): `[TOOL_CALLS]NAME[ARGS]{...}` per call (tokenizer v11+, with
`[CALL_ID]id` before `[ARGS]` in v13+), or a JSON list `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (before
v11). Call ids are 9 alphanumeric characters: Mistral's templates refuse any other."""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence

from openai_api.text.families.calls import RawCall, ToolContext, as_object, json_prefix
from openai_api.text.families.family import CallPrompt, Marks, Region, ToolFormat, WrittenCall, dump

_ALNUM = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """Mistral's templates require 9 alphanumeric characters (`[a-zA-Z0-9]{9}`) for a call id."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def _decode_mistral(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """After `[TOOL_CALLS]`: `name[ARGS]{...}` (tokenizer v11+, `[CALL_ID]id` before `[ARGS]` in v13+),
    repeated with `[TOOL_CALLS]`; or a JSON list `[{"name": ..., "arguments": {...}}]` (before v11)."""
    calls: list[RawCall] = []
    if partial:  # the pieces that decode, up to the first that does not (the one the cut fell in)
        for piece in text.split("[TOOL_CALLS]"):
            got = _decode_mistral(piece, ctx) if piece.strip() else []
            if got is None:
                break
            calls += got
        return calls
    for piece in text.split("[TOOL_CALLS]"):
        rest = piece.strip()
        while rest:
            if rest[0] in "[{":
                found = json_prefix(rest)
                if found is None:
                    return None
                value, rest = found[0], found[1].strip()
                for item in value if isinstance(value, list) else [value]:
                    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                        return None
                    args = as_object(item.get("arguments", item.get("parameters", {})))
                    if args is None:
                        return None
                    calls.append(RawCall(item["name"], args, item.get("id") if isinstance(item.get("id"), str)
                                         else None))
                continue
            head, sep, tail = rest.partition("[ARGS]")
            if not sep:
                return None
            name, _, call_id = head.partition("[CALL_ID]")
            found = json_prefix(tail)
            args = as_object(found[0]) if found is not None else None
            if args is None or found is None or not name.strip():
                return None
            calls.append(RawCall(name.strip(), args, call_id.strip() or None))
            rest = found[1].strip()
    return calls or None


def _write_mistral(calls: Sequence[WrittenCall]) -> str:
    """The v11+ form, without `[CALL_ID]` (which only v13+ tokenizers know)."""
    return "".join(f"[TOOL_CALLS]{c.name}[ARGS]{dump(c.arguments)}" for c in calls)


MISTRAL = ToolFormat(
    "mistral", (Region("[TOOL_CALLS]"),), _decode_mistral,
    CallPrompt("[TOOL_CALLS]<function-name>[ARGS]<arguments-json-object>", _write_mistral),
    Marks(template=lambda t: "[TOOL_CALLS]" in t, token="[TOOL_CALLS]"),
    inner=("[ARGS]", "[CALL_ID]"), ids=mistral_call_id,
    models="Mistral Small 3.x, Mistral Large 2, Devstral, Magistral, Ministral")

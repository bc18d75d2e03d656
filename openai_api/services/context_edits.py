"""Anthropic's context editing (`context_management.edits`, beta `context-management-2025-06-27`) applied to
the chat messages a Messages request became, before its prompt is rendered.

As Anthropic documents it, the edits change only what the model sees: the client keeps its full history
and sends it again next turn. Edits apply in the order given (Anthropic requires `clear_thinking` first
when both are sent). Each edit the request names is reported in the answer's
`context_management.applied_edits` (plain message and `message_delta`), with what it cleared (0 when it
did not trigger).

* `clear_thinking_20251015`, `keep` `{type: thinking_turns, value: N}` (default N = 1) or `"all"`: the
  reasoning of all but the last N assistant turns that have any is removed. `cleared_thinking_turns` and
  `cleared_input_tokens` (the removed reasoning's tokens) are reported.
* `clear_tool_uses_20250919`: once `trigger` is passed (`{type: input_tokens, value}`, default 100,000
  prompt tokens, or `{type: tool_uses, value}` tool uses in the conversation), the results of the oldest
  tool uses are replaced by `CLEARED_RESULT`, all but the last `keep` (`{type: tool_uses, value}`,
  default 3) and those of `exclude_tools`; `clear_tool_inputs` (true, or a list of tool names) also
  empties those calls' inputs. With `clear_at_least` (`{type: input_tokens, value}`) the oldest are
  cleared only until that many tokens are gone, and not at all when the clearable ones hold fewer (so
  a cleared prefix is worth the cache it invalidates, as Anthropic words it). `cleared_tool_uses` and
  `cleared_input_tokens` are reported.

Tokens are the model's own tokenizer's count of the removed text (less the placeholder's). Shapes are
checked: a wrong one is a 400 naming `context_management.edits[i]...`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from openai_api.errors import InvalidRequestError

CLEAR_THINKING = "clear_thinking_20251015"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
# What the model reads in place of a cleared tool result.
CLEARED_RESULT = "[Tool result cleared from the context to save space.]"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1
MAX_EDITS = 8  # Anthropic defines two strategies; a long list is a client bug, not work to do


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def _count(value: Any, where: str, kind: str) -> int:
    """A `{type: kind, value: n >= 0}` object's n."""
    if not isinstance(value, dict) or value.get("type") != kind:
        raise _bad(f"must be an object {{\"type\": \"{kind}\", \"value\": <integer>}}.", where)
    n = value.get("value")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise _bad("value must be a non-negative integer.", f"{where}.value")
    return n


@dataclass
class ThinkingEdit:
    keep: int | None  # None: keep all


@dataclass
class ToolUsesEdit:
    trigger_kind: str  # "input_tokens" or "tool_uses"
    trigger: int
    keep: int
    clear_at_least: int | None
    exclude: frozenset[str]
    clear_inputs: bool | frozenset[str]


Edit = ThinkingEdit | ToolUsesEdit


def parse_edits(cm: Any) -> list[Edit]:
    """`context_management` as the edits to apply (see the module docstring); [] when absent."""
    if cm is None:
        return []
    if not isinstance(cm, dict) or not isinstance(cm.get("edits", []), list):
        raise _bad("must be an object with a list 'edits'.", "context_management")
    edits = cm.get("edits", [])
    if len(edits) > MAX_EDITS:
        raise _bad(f"at most {MAX_EDITS} edits are allowed.", "context_management.edits")
    out: list[Edit] = []
    for i, e in enumerate(edits):
        where = f"context_management.edits[{i}]"
        kind = e.get("type") if isinstance(e, dict) else None
        if kind == CLEAR_THINKING:
            keep = e.get("keep", {"type": "thinking_turns", "value": DEFAULT_KEEP_THINKING_TURNS})
            out.append(ThinkingEdit(None if keep == "all" else _count(keep, f"{where}.keep", "thinking_turns")))
        elif kind == CLEAR_TOOL_USES:
            out.append(_tool_uses_edit(e, where))
        else:
            raise _bad(f"type must be '{CLEAR_THINKING}' or '{CLEAR_TOOL_USES}'.", f"{where}.type")
    return out


def _names(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad("must be a list of tool names.", where)
    return frozenset(value)


def _tool_uses_edit(e: dict[str, Any], where: str) -> ToolUsesEdit:
    trigger = e.get("trigger") or {"type": "input_tokens", "value": DEFAULT_TRIGGER_TOKENS}
    kind = trigger.get("type") if isinstance(trigger, dict) else None
    if kind not in ("input_tokens", "tool_uses"):
        raise _bad("type must be 'input_tokens' or 'tool_uses'.", f"{where}.trigger.type")
    keep = e.get("keep") or {"type": "tool_uses", "value": DEFAULT_KEEP_TOOL_USES}
    least = e.get("clear_at_least")
    inputs = e.get("clear_tool_inputs", False)
    return ToolUsesEdit(
        trigger_kind=str(kind), trigger=_count(trigger, f"{where}.trigger", str(kind)),
        keep=_count(keep, f"{where}.keep", "tool_uses"),
        clear_at_least=None if least is None else _count(least, f"{where}.clear_at_least", "input_tokens"),
        exclude=_names(e.get("exclude_tools") or [], f"{where}.exclude_tools"),
        clear_inputs=inputs if isinstance(inputs, bool) else _names(inputs, f"{where}.clear_tool_inputs"))


def needs_prompt_tokens(edits: list[Edit]) -> bool:
    """Whether an edit triggers on the prompt's token count (which costs a render to know)."""
    return any(isinstance(e, ToolUsesEdit) and e.trigger_kind == "input_tokens" for e in edits)


@dataclass
class Applied:
    """What the edits cleared, as `context_management.applied_edits`."""

    edits: list[dict[str, Any]] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        return {"applied_edits": self.edits}


TokenCounter = Callable[[str], Awaitable[int]]


async def apply_edits(edits: list[Edit], messages: list[dict[str, Any]], prompt_tokens: int | None,
                      tokens: TokenCounter) -> tuple[list[dict[str, Any]], Applied]:
    """`messages` (chat messages, not changed in place) after `edits`; `prompt_tokens` is the unedited
    prompt's length (needed only by an `input_tokens` trigger, see `needs_prompt_tokens`), `tokens` counts
    a text's tokens with the model's tokenizer."""
    out = [dict(m) for m in messages]
    applied = Applied()
    for edit in edits:
        if isinstance(edit, ThinkingEdit):
            applied.edits.append(await _clear_thinking(edit, out, tokens))
        else:
            applied.edits.append(await _clear_tool_uses(edit, out, prompt_tokens, tokens))
            if prompt_tokens is not None:
                prompt_tokens -= applied.edits[-1]["cleared_input_tokens"]
    return out, applied


async def _clear_thinking(edit: ThinkingEdit, out: list[dict[str, Any]], tokens: TokenCounter) -> dict[str, Any]:
    turns = [m for m in out if m["role"] == "assistant" and m.get("reasoning_content")]
    cleared = [] if edit.keep is None else turns[:max(0, len(turns) - edit.keep)]
    removed = 0
    for m in cleared:
        removed += await tokens(m.pop("reasoning_content"))
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": len(cleared), "cleared_input_tokens": removed}


async def _clear_tool_uses(edit: ToolUsesEdit, out: list[dict[str, Any]], prompt_tokens: int | None,
                           tokens: TokenCounter) -> dict[str, Any]:
    none = {"type": CLEAR_TOOL_USES, "cleared_tool_uses": 0, "cleared_input_tokens": 0}
    calls = [(m, c) for m in out if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    used = len(calls) if edit.trigger_kind == "tool_uses" else (prompt_tokens or 0)
    if used <= edit.trigger:
        return none
    results = {m.get("tool_call_id"): m for m in out if m["role"] == "tool"}
    candidates = [(m, c) for m, c in calls if c["function"]["name"] not in edit.exclude]
    keep_ids = {c["id"] for _, c in calls[len(calls) - edit.keep:]} if edit.keep else set()
    candidates = [(m, c) for m, c in candidates if c["id"] not in keep_ids]
    placeholder = await tokens(CLEARED_RESULT)
    plan: list[tuple[dict[str, Any], dict[str, Any], int]] = []
    total = 0
    for m, c in candidates:
        result = results.get(c["id"])
        if result is None or result.get("content") == CLEARED_RESULT:
            continue
        text = result.get("content")
        gain = max(0, await tokens(text if isinstance(text, str) else json.dumps(text)) - placeholder)
        if _clears_inputs(edit, c["function"]["name"]):
            gain += await tokens(c["function"]["arguments"])
        plan.append((m, c, gain))
        total += gain
        if edit.clear_at_least is not None and total >= edit.clear_at_least:
            break
    if not plan or (edit.clear_at_least is not None and total < edit.clear_at_least):
        return none
    for m, c, _ in plan:
        results[c["id"]]["content"] = CLEARED_RESULT
        if _clears_inputs(edit, c["function"]["name"]):
            m["tool_calls"] = [{**t, "function": {**t["function"], "arguments": "{}"}} if t is c else t
                               for t in m["tool_calls"]]
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(plan), "cleared_input_tokens": total}


def _clears_inputs(edit: ToolUsesEdit, name: str) -> bool:
    return edit.clear_inputs if isinstance(edit.clear_inputs, bool) else name in edit.clear_inputs

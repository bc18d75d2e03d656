"""Anthropic `cache_control` breakpoints -> the KV-cache retention a TensorRT-LLM engine takes per request.

Anthropic caches the prompt prefix up to a block marked `cache_control: {"type": "ephemeral"}` for 5 minutes
(`"ttl": "1h"`: an hour), at most `MAX_BREAKPOINTS` marks per request. TensorRT-LLM keeps every prefilled block
anyway (`enable_kv_cache_reuse`) but evicts by priority and age; its Triton backend takes, per request, token
ranges to keep at a priority for a duration (`retention_token_range_starts` / `_ends` / `_priorities` /
`_durations_ms`, INT32 [n]). So each breakpoint the gateway can place becomes the range from the previous
breakpoint's end (the first: token 0) to the token just after its block, kept for its TTL.

**Where a block ends, in tokens of the prompt the engine gets.** The dialect appends a private marker
(`mark_block`: a per-process random tag and the TTL, never client text) to the text of each marked block it
can place - a system block, a user or assistant text block, a tool_result (or a text block inside one), a
`system`-role message's block - before the trailing whitespace of that text, so a template that trims content
trims the same. The template renders the markers where the text stands (`services.preprocess`), which removes
them (`strip_marks`: every rendered prompt loses them, whatever the backend) and keeps their character offsets
in the prompt text. The prompt is tokenized as always; then, only for a backend that takes retention, the text
before each offset is tokenized the same way and the breakpoint's token offset is the length of the longest
common prefix of those ids and the prompt's (`token_offset`): the prompt's own token boundary at the block's
end, or the last one before it where the block's last token merges with what follows. Through the prompt cache
(a long prompt) the text tokenized is the prompt up to the last cut at or before the offset (whole cached
segments: nothing is tokenized twice; `services.preprocess`). A block whose marker the template does not render
intact (it escapes or rewrites content) gives no range.

Blocks whose end has no text to mark - `tool_use`, `thinking` and image blocks, and `tools` (the template
decides where tool definitions go) - are counted and checked but place no marker: a later breakpoint's range,
which starts at 0 or at an earlier breakpoint, covers them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from openai_api.errors import InvalidRequestError
from openai_api.triton.llm import RetainedRange

MAX_BREAKPOINTS = 4  # Anthropic's limit on blocks with cache_control per request
TTL_MS = {"5m": 5 * 60_000, "1h": 60 * 60_000}
_TAG = uuid.uuid4().hex[:8]
# A marker's first and last character. DEL: no text holds it in practice, and every way a template passes
# content on keeps it as it is, as the private-use character it replaced (strip and trim leave it, `tojson`
# writes it raw, or escapes it as it does any character outside ASCII's printable range with ensure_ascii);
# unlike that character it keeps an ASCII prompt ASCII. A private-use character made every marked prompt (every
# Claude Code turn) two bytes a character through the render and the markers' removal (~0.1 ms a turn at ~117k
# tokens) for nothing.
_EDGE = "\x7f"
_MARK = re.compile(_EDGE + _TAG + "(5m|1h)" + _EDGE)
MARK_START = _EDGE + _TAG
# A marker's first character: searched for alone, since CPython finds one character at memchr speed (~30x a
# regular expression's scan or a multi-character `find` over a ~500k-character agent prompt).
_FIRST = MARK_START[0]


def cache_ttl(block: Any, where: str) -> str | None:
    """A block's `cache_control` checked: None (none), else its TTL ("5m" by default, or "1h"); a 400 naming
    `where.cache_control` for anything else, as Anthropic answers."""
    control = block.get("cache_control") if isinstance(block, dict) else None
    if control is None:
        return None
    field = f"{where}.cache_control"
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise InvalidRequestError(f"{field}: must be {{\"type\": \"ephemeral\"}} (with an optional \"ttl\").",
                                  param=field)
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_MS:
        raise InvalidRequestError(f"{field}.ttl: must be '5m' or '1h'.", param=f"{field}.ttl")
    return str(ttl)


def check_breakpoints(count: int) -> None:
    if count > MAX_BREAKPOINTS:
        raise InvalidRequestError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                                  f"Found {count}.", param="cache_control")


def mark_block(text: str, ttl: str | None) -> str:
    """`text` with the breakpoint marker of `ttl` before its trailing whitespace (unchanged without a TTL)."""
    if ttl is None:
        return text
    body = text.rstrip()
    return body + MARK_START + ttl + _EDGE + text[len(body):]


def strip_marks(rendered: str) -> tuple[str, list[tuple[int, str]]]:
    """`rendered` without its breakpoint markers, and each marker's (character offset in the result, TTL)."""
    at = rendered.find(_FIRST)
    if at < 0:
        return rendered, []
    out: list[str] = []
    marks: list[tuple[int, str]] = []
    pos = size = 0
    while at >= 0:  # what `_MARK.finditer` finds, one character search per marker
        m = _MARK.match(rendered, at)
        if m is None:
            at = rendered.find(_FIRST, at + 1)
            continue
        out.append(rendered[pos:at])
        size += at - pos
        marks.append((size, m.group(1)))
        pos = m.end()
        at = rendered.find(_FIRST, pos)
    if not marks:
        return rendered, []
    out.append(rendered[pos:])
    return "".join(out), marks


def token_offset(prefix_ids: Sequence[int], ids: Sequence[int]) -> int:
    """How many of the prompt's `ids` the ids of a prefix of its text agree with: the prompt's token boundary at
    the prefix's end, or the last one before it."""
    n = min(len(prefix_ids), len(ids))
    a, b = getattr(prefix_ids, "int32_le", None), getattr(ids, "int32_le", None)
    if isinstance(a, bytes) and isinstance(b, bytes):  # both from the prompt cache: compared as bytes, no copies
        if (b.startswith(a) if len(a) <= len(b) else a.startswith(b)):
            return n
    elif list(prefix_ids[:n]) == list(ids[:n]):
        return n
    i = 0
    while prefix_ids[i] == ids[i]:
        i += 1
    return i


def retained_ranges(marks: list[tuple[int, str]], ids: Sequence[int],
                    encode_prefix: Callable[[int], Sequence[int]]) -> tuple[RetainedRange, ...]:
    """The ranges to retain for breakpoints at character offsets `marks` of a prompt tokenized as `ids`
    (`encode_prefix(k)`: the ids of its first k characters, tokenized as the prompt was): consecutive,
    [previous end, this end) each with its own TTL; empty ones left out."""
    ranges: list[RetainedRange] = []
    start = 0
    for chars, ttl in marks[:MAX_BREAKPOINTS]:
        end = token_offset(encode_prefix(chars), ids)
        if end > start:
            ranges.append(RetainedRange(start, end, TTL_MS[ttl]))
            start = end
    return tuple(ranges)

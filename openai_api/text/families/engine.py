"""The engine that reads one choice's output through its families: reasoning, content and tool calls.

`OutputParser` runs the output through a family's `ToolFormat` (its call regions and their decoder) and a
`ReasoningFormat` (its thinking section), incrementally: `push(text)` returns the `Piece`s that are safe to
send now, `finish()` the rest. Work is O(new text) per push: only a possible partial marker at the end of the
text is held back (`partial_tail`), and a call region is searched for its end from where the previous search
stopped (`Collector`); a region's text is decoded once, when it ends. A plain answer is the same machine fed
the whole text at once, so the streamed and the plain answer are one answer (content, reasoning, every call's
name, id and arguments), at every split of the text. The rules every family shares are in the package
docstring (`openai_api.text.families`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Literal

from openai_api.text.families.calls import MAX_REGION_CHARS, ParsedToolCall, ToolContext
from openai_api.text.families.family import Piece, Region, ToolFormat
from openai_api.text.families.reasoning import ReasoningFormat


def partial_tail(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of one of `markers` (held back). Only
    where the marker's first character occurs in the last len(marker)-1 characters is compared: per
    token, a `find` or two instead of a slice per prefix length."""
    best = 0
    n = len(text)
    for m in markers:
        j = text.find(m[0], max(0, n - len(m) + 1))
        while j != -1 and n - j > best:
            if m.startswith(text[j:]):
                best = n - j
                break
            j = text.find(m[0], j + 1)
    return best


def strip_markers(text: str, markers: Iterable[str]) -> str:
    for m in markers:
        text = text.replace(m, "")
    return text


def add_text(out: list[Piece], kind: Literal["reasoning", "content"], text: str) -> None:
    """Append text to `out`, into its last piece when that is of the same kind."""
    if not text:
        return
    if out and out[-1].kind == kind:
        out[-1].text += text
    else:
        out.append(Piece(kind, text))


class Collector:
    """Text gathered until one of `ends` appears (none: until the output ends). Each `feed` costs O(new
    text): the search runs over the new text plus the few characters before it that could start an end
    marker, and the text is joined once, when an end is found."""

    __slots__ = ("_k", "_parts", "_tail", "ends")

    def __init__(self, ends: tuple[str, ...]) -> None:
        self.ends = ends
        self._k = max(map(len, ends), default=1) - 1
        self._parts: list[str] = []
        self._tail = ""

    def feed(self, text: str) -> tuple[str, str, str] | None:
        """`(text before the end, the end marker, what follows it)` once an end appears, else None."""
        combined = self._tail + text
        best, which = -1, ""
        for e in self.ends:
            i = combined.find(e)
            if i != -1 and (best == -1 or i < best):
                best, which = i, e
        if best == -1:
            self._parts.append(text)
            self._tail = combined[-self._k:] if self._k else ""
            return None
        joined = "".join(self._parts)
        body = joined[: len(joined) - len(self._tail)] + combined[:best]
        self._parts, self._tail = [], ""
        return body, which, combined[best + len(which):]

    def take(self) -> str:
        """Everything gathered (the output ended before an end marker)."""
        text = "".join(self._parts)
        self._parts, self._tail = [], ""
        return text


class OutputParser:
    """One choice's output -> `Piece`s (module docstring). `tools`: the active tool format (None: no tool
    parsing, e.g. a forced call whose guided output the caller reads itself); `reasoning`: the thinking
    section's format; `prompt`: the rendered prompt, which tells whether the output starts inside a
    thinking section.

    States: `lead` (nothing decisive yet: whitespace, a partial start tag), `think_lead` (inside thinking,
    a start tag the model writes anyway may still come and is dropped), `reasoning`, `content`, `region`
    (inside a call region, held until its end marker or the end of the output)."""

    def __init__(self, tools: ToolFormat | None, reasoning: ReasoningFormat | None, ctx: ToolContext | None = None,
                 prompt: str | None = None, control: Iterable[str] = ()) -> None:
        if tools is not None and tools.decode is None:
            raise ValueError(f"the {tools.name} family reads its output with its own parser")
        self.tools = tools
        self.control = tuple(control)
        self.reasoning = reasoning
        self.ctx = ctx or ToolContext()
        self._reasoning: list[str] = []
        self.calls = 0
        self._buf = ""
        self._collector = Collector(())  # a call region's text, until its end marker
        self._raw = 0  # characters pushed so far
        self._think_end: int | None = None  # where in them the thinking section ended (after its end tag)
        self._think_done = False
        self._region: Region | None = None
        self._ws = ""  # content whitespace held back: dropped before a region and at the end
        self._region_ws = ""
        self._content_seen = False
        self._state = "think_lead" if reasoning is not None and reasoning.starts_inside(prompt) else "lead"
        self._starts = tuple(r for r in tools.regions if not r.lead) if tools else ()
        self._start_texts = tuple(r.start for r in self._starts)
        self._lead_regions = tuple(r for r in tools.regions if r.lead) if tools else ()

    @property
    def reasoning_text(self) -> str:
        """All the reasoning so far (for usage)."""
        return "".join(self._reasoning)

    @property
    def undecided(self) -> bool:
        """Nothing decisive seen yet: whitespace, or a partial thinking start tag."""
        return self._state == "lead" and self.reasoning is not None and not self._think_done

    @property
    def thinking(self) -> bool:
        """Inside the thinking section (its end not seen yet)."""
        return self._state in ("reasoning", "think_lead")

    @property
    def thinking_chars(self) -> int:
        """How many of the characters pushed so far are the thinking section, tags included."""
        if self._think_end is not None:
            return self._think_end
        return self._raw if self.thinking else 0

    def push(self, text: str) -> list[Piece]:
        """The pieces of the output's next text that are safe to send now."""
        self._raw += len(text)
        out: list[Piece] = []
        self._run(self._buf + text, out, final=False)
        return out

    def finish(self, cut: bool = False) -> list[Piece]:
        """The end of the output (`cut`: by max_tokens): what was held back, as what it turned out to be."""
        out: list[Piece] = []
        self._run(self._buf, out, final=True)
        if self._state == "region":
            self._close_region(self._collector.take(), out, terminated=False, cut=cut)
            self._state = "content"
        self._ws = ""  # trailing whitespace of the answer: layout
        return out

    def _run(self, buf: str, out: list[Piece], final: bool) -> None:
        self._buf = ""
        while buf and not self._buf:
            state = self._state
            if state == "lead":
                buf = self._lead(buf, out, final)
            elif state == "region":
                buf = self._in_region(buf, out)
            elif state == "content":
                buf = self._content(buf, out, final)
            else:
                buf = self._think(buf, out, final)

    def _hold(self, text: str) -> str:
        self._buf = text
        return ""

    def _lead(self, buf: str, out: list[Piece], final: bool) -> str:
        stripped = buf.lstrip()
        r = None if self._think_done else self.reasoning
        if r is not None:
            if not final and (not stripped or r.start.startswith(stripped)):
                return self._hold(buf)
            if stripped.startswith(r.start):
                self._state = "reasoning"
                return stripped[len(r.start):].removeprefix("\n")
        for region in self._lead_regions:
            if stripped.startswith(region.start):
                self._enter(region)
                return stripped
        if not stripped and not final and (self._lead_regions or self._think_done):
            return self._hold(buf)
        self._state = "content"
        if self.tools is not None:
            return stripped
        return buf.lstrip("\n") if self._think_done else buf  # blank lines after `</think>` are layout

    def _think(self, buf: str, out: list[Piece], final: bool) -> str:
        r = self.reasoning
        assert r is not None
        if self._state == "think_lead":
            stripped = buf.lstrip()
            if not final and (not stripped or r.start.startswith(stripped)):
                return self._hold(buf)
            self._state = "reasoning"
            if stripped.startswith(r.start):
                buf = stripped[len(r.start):].removeprefix("\n")
        i = buf.find(r.end)
        if i == -1:
            keep = 0 if final else partial_tail(buf, (r.end,))
            self._emit_reasoning(buf[: len(buf) - keep], out)
            return self._hold(buf[len(buf) - keep:]) if keep else ""
        self._emit_reasoning(buf[:i], out)
        rest = buf[i + len(r.end):]
        self._think_end = self._raw - len(rest)
        self._state, self._think_done = "lead", True
        return rest

    def _emit_reasoning(self, text: str, out: list[Piece]) -> None:
        self._reasoning.append(text)
        add_text(out, "reasoning", text)

    def _emit_content(self, text: str, out: list[Piece]) -> None:
        if self.tools is None:
            add_text(out, "content", text)
            return
        if not self._content_seen:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        add_text(out, "content", self._ws + body)
        self._ws = text[len(body):]
        self._content_seen = True

    def _content(self, buf: str, out: list[Piece], final: bool) -> str:
        if not self._starts:
            self._emit_content(buf, out)
            return ""
        best, region = -1, None
        for r in self._starts:
            i = buf.find(r.start)
            if i != -1 and (best == -1 or i < best):
                best, region = i, r
        if region is None:
            keep = 0 if final else partial_tail(buf, self._start_texts)
            self._emit_content(buf[: len(buf) - keep], out)
            return self._hold(buf[len(buf) - keep:]) if keep else ""
        self._emit_content(buf[:best], out)
        self._region_ws, self._ws = self._ws, ""  # whitespace before a region is layout (if it is a call)
        self._enter(region)
        return buf[best + len(region.start):]

    def _enter(self, region: Region) -> None:
        self._state, self._region = "region", region
        self._collector = Collector((region.end,) if region.end else ())

    def _in_region(self, buf: str, out: list[Piece]) -> str:
        done = self._collector.feed(buf)
        if done is None:
            return ""  # still inside (a region without an end marker runs to the end of the output)
        body, _, rest = done
        self._close_region(body, out, terminated=True)
        self._state = "content"
        return rest

    def _close_region(self, body: str, out: list[Piece], terminated: bool, cut: bool = False) -> None:
        region = self._region
        assert region is not None and self.tools is not None
        if len(body) > MAX_REGION_CHARS or (not terminated and not cut and region.end and self.tools.needs_end):
            raw = None
        else:  # a region cut by max_tokens keeps only its whole calls
            decode = self.tools.decode
            assert decode is not None  # (refused at construction)
            raw = decode(body, self.ctx, cut and not terminated)
        if raw is not None and self.ctx.allowed is not None and any(c.name not in self.ctx.allowed for c in raw):
            raw = None  # a call to a function the request did not offer is not a tool call
        self._region = None
        if raw is None:
            shown = ("" if region.lead else region.start) + body + (region.end or "" if terminated else "")
            self._ws = self._region_ws  # the whitespace before it is text again
            self._emit_content(strip_markers(shown, self.control), out)
            self._ws = ""
            return
        for c in raw:
            call_id = c.id or self.tools.ids() or f"functions.{c.name}:{self.calls}"
            args = json.dumps(c.arguments, ensure_ascii=False)
            out.append(Piece("call", call=ParsedToolCall(c.name, args, call_id)))
            self.calls += 1
        self._ws = ""

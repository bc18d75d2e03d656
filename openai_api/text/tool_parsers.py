"""Turning model output into OpenAI `tool_calls`, whole or while streaming.

Two families:
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen 2.5, Hermes,
  SmolLM-style templates), any number of them, with free text around.
- `llama3_json`: the whole answer is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`, several separated by `;`), as Llama 3.1 emits for JSON tool calling.

Malformed tool output never fails a request: it falls back to plain content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call_from_json(obj: Any, args_key: str, allowed: frozenset[str] | None = None) -> ParsedToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if allowed is not None and obj["name"] not in allowed:
        return None  # a call to a function the request did not offer is not a tool call
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        return ParsedToolCall(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class ToolParser:
    """Whole-text parsing: `parse(text) -> (content, calls)`; no calls means "answer as content"."""

    name = "base"

    def __init__(self, allowed: frozenset[str] | None = None) -> None:
        self.allowed = allowed

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        raise NotImplementedError

    def streamer(self) -> ToolStreamParser:
        return ToolStreamParser(self)


class HermesToolParser(ToolParser):
    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        calls: list[ParsedToolCall] = []
        content: list[str] = []
        pos = 0
        while True:
            i = text.find(self.start, pos)
            if i == -1:
                content.append(text[pos:])
                break
            j = text.find(self.end, i)
            body = text[i + len(self.start): j if j != -1 else len(text)]
            call = _call_from_json(_loads(body.strip()), "arguments", self.allowed)
            if call is None:
                return text, []  # malformed: the whole answer stays plain content
            content.append(text[pos:i])
            calls.append(call)
            if j == -1:
                break
            pos = j + len(self.end)
        rest = "".join(content).strip()
        return (rest or None), calls


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        calls = []
        for part in _split_top_level(body, ";"):
            call = _call_from_json(_loads(part.strip()), "parameters", self.allowed)
            if call is None:
                return text, []
            calls.append(call)
        return None, calls


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on `sep` outside JSON strings and brackets."""
    parts, depth, in_str, esc, start = [], 0, False, False, 0
    for i, ch in enumerate(text):
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
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


PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}


def get_parser(name: str | None, allowed: frozenset[str] | None = None) -> ToolParser:
    return PARSERS[name or "hermes"](allowed)


@dataclass
class ToolStreamEvent:
    """What to send for one piece of streamed text: content, and/or completed tool calls."""

    content: str = ""
    calls: list[ParsedToolCall] = field(default_factory=list)


class ToolStreamParser:
    """Streaming counterpart: content flows through until a tool call may be starting; tool-call text
    is held back (never leaked into `content`) and released as a whole call once it parses, or as
    content if it turns out malformed at the end."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self._held = ""
        self._in_call = False
        self._json_mode = False  # llama3_json: the answer started with "{": hold everything
        self._seen_text = False
        self.emitted_calls = 0

    def push(self, text: str) -> ToolStreamEvent:
        if isinstance(self.parser, Llama3JsonToolParser):
            return self._push_json(text)
        return self._push_hermes(text)

    def _push_json(self, text: str) -> ToolStreamEvent:
        if self._json_mode:
            self._held += text
            return ToolStreamEvent()
        if not self._seen_text:
            buf = self._held + text
            stripped = buf.lstrip()
            if not stripped:
                self._held = buf
                return ToolStreamEvent()
            if stripped.startswith(("{", "<|python_tag|>")) or "<|python_tag|>".startswith(stripped):
                self._json_mode = stripped.startswith(("{", "<|python_tag|>"))
                self._held = buf
                return ToolStreamEvent()
            self._seen_text = True
            self._held = ""
            return ToolStreamEvent(content=buf)
        return ToolStreamEvent(content=text)

    def _push_hermes(self, text: str) -> ToolStreamEvent:
        start, end = HermesToolParser.start, HermesToolParser.end
        buf = self._held + text
        out = ToolStreamEvent()
        while buf:
            if self._in_call:
                j = buf.find(end)
                if j == -1:
                    self._held = buf
                    return out
                call = _call_from_json(_loads(buf[:j].strip()), "arguments", self.parser.allowed)
                if call is None:
                    # Malformed call: give the text back verbatim rather than fail.
                    out.content += start + buf[: j + len(end)]
                else:
                    out.calls.append(call)
                self._in_call = False
                buf = buf[j + len(end):]
                continue
            i = buf.find(start)
            if i != -1:
                out.content += buf[:i]
                self._in_call = True
                buf = buf[i + len(start):]
                continue
            keep = next((k for k in range(min(len(start) - 1, len(buf)), 0, -1) if start.startswith(buf[-k:])), 0)
            out.content += buf[: len(buf) - keep]
            self._held = buf[len(buf) - keep:]
            return out
        self._held = ""
        return out

    def finish(self) -> ToolStreamEvent:
        """End of generation: parse what is held; anything that is not a valid call becomes content."""
        held, self._held = self._held, ""
        if isinstance(self.parser, Llama3JsonToolParser):
            if not held:
                return ToolStreamEvent()
            _, calls = self.parser.parse(held)
            return ToolStreamEvent(calls=calls) if calls else ToolStreamEvent(content=held)
        if self._in_call:
            self._in_call = False
            # An unterminated call (generation stopped at the closing tag) is still a call if its JSON is whole.
            call = _call_from_json(_loads(held.strip()), "arguments", self.parser.allowed)
            return ToolStreamEvent(calls=[call]) if call else ToolStreamEvent(content=HermesToolParser.start + held)
        return ToolStreamEvent(content=held)

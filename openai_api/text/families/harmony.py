"""gpt-oss in OpenAI's harmony format (`harmony`): messages on channels, not call regions in running text.

`<|channel|>CH[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY` ended by `<|end|>`, `<|call|>` or `<|return|>`,
later ones opened by `<|start|>assistant`. `analysis` is reasoning, `final` is content, `commentary` to
`functions.NAME` is a tool call whose body is its JSON arguments. The family brings its own parser
(`HarmonyParser`); its thinking is its `analysis` channel (reasoning parser `harmony`), and `<|return|>` (an answer)
and `<|call|>` (a tool call) end a generation whatever the model's configured EOS: its tokenizer config names only
the first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from openai_api.text.families.calls import MAX_REGION_CHARS, ParsedToolCall, ToolContext, as_object
from openai_api.text.families.engine import Collector, add_text, partial_tail, strip_markers
from openai_api.text.families.family import CallPrompt, ChoiceParser, Marks, Piece, ToolFormat, WrittenCall, dump

HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")


class HarmonyParser:
    """gpt-oss output in OpenAI's harmony format: messages `<|channel|>CH[ to=RECIPIENT][ <|constrain|>json]
    <|message|>BODY` ended by `<|end|>`, `<|call|>` or `<|return|>`, later ones opened by `<|start|>assistant`
    (the recipient may also stand before the channel). `analysis` is reasoning; `final` is content;
    `commentary` to `functions.NAME` is a tool call whose body is its JSON arguments; `commentary` without a
    recipient (a preamble) is content. Output with no message at all (a model that ignored the format) is
    content, its markers removed. Same interface and guarantees as `OutputParser`."""

    def __init__(self, tools_active: bool, ctx: ToolContext | None = None) -> None:
        self.tools_active = tools_active
        self.ctx = ctx or ToolContext()
        self._reasoning: list[str] = []
        self.calls = 0
        self._state = "header"
        self._buf = ""
        self._header = Collector(("<|message|>",))
        self._call = Collector(_HARMONY_ENDS)
        self._channel = ""
        self._recipient = ""
        self._raw = 0
        self._think_end: int | None = None
        self._messages = 0

    @property
    def reasoning_text(self) -> str:
        return "".join(self._reasoning)

    @property
    def undecided(self) -> bool:
        return self._state == "header" and not self._messages

    @property
    def thinking(self) -> bool:
        return self._state == "body" and self._channel == "analysis"

    @property
    def thinking_chars(self) -> int:
        if self.thinking:
            return self._raw
        return self._think_end or 0

    def push(self, text: str) -> list[Piece]:
        self._raw += len(text)
        out: list[Piece] = []
        self._run(self._buf + text, out, final=False)
        return out

    def finish(self, cut: bool = False) -> list[Piece]:
        out: list[Piece] = []
        self._run(self._buf, out, final=True)
        self._buf = ""
        if self._state == "header":
            held = self._header.take()
            if held and not self._messages:
                add_text(out, "content", strip_markers(held, HARMONY_MARKERS).strip())
        elif self._state == "body" and self._is_call():
            body = self._call.take()
            if not cut:  # (a call cut by max_tokens is dropped)
                self._end_message(body, out)
        elif self._state == "body":
            self._end_message("", out)
        return out

    def _run(self, buf: str, out: list[Piece], final: bool) -> None:
        self._buf = ""
        while buf and not self._buf:
            if self._state == "header":
                done = self._header.feed(buf)
                if done is None:
                    return
                header, _, buf = done
                m = _CHANNEL.search(header)
                r = _RECIPIENT.search(header)
                self._channel = m.group(1) if m else ""
                self._recipient = r.group(1) if r else ""
                self._state = "body"
                self._messages += 1
                continue
            # body
            if self._is_call():
                done = self._call.feed(buf)
                if done is None:
                    return
                body, _, buf = done
                self._end_message(body, out)
                continue
            i, end = self._find_end(buf)
            if i == -1:
                keep = 0 if final else partial_tail(buf, _HARMONY_ENDS)
                self._stream(buf[: len(buf) - keep], out)
                self._buf = buf[len(buf) - keep:]
                return
            self._stream(buf[:i], out)
            self._end_message("", out)
            buf = buf[i + len(end):]

    @staticmethod
    def _find_end(buf: str) -> tuple[int, str]:
        best, which = -1, ""
        for e in _HARMONY_ENDS:
            i = buf.find(e)
            if i != -1 and (best == -1 or i < best):
                best, which = i, e
        return best, which

    def _is_call(self) -> bool:
        return bool(self._recipient) and self._channel != "analysis"

    def _stream(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self._channel == "analysis":
            self._reasoning.append(text)
            add_text(out, "reasoning", text)
        else:
            add_text(out, "content", text)

    def _end_message(self, body: str, out: list[Piece]) -> None:
        """A message ended: a call's body becomes the call (or content, if it is not one)."""
        if self._channel == "analysis":
            self._think_end = self._raw - len(self._buf)
        if self._is_call():
            name = self._recipient.removeprefix("functions.")
            args = as_object(body.strip()) if len(body) <= MAX_REGION_CHARS else None
            allowed = self.ctx.allowed is None or name in self.ctx.allowed
            if args is not None and allowed and self.tools_active and self._recipient.startswith("functions."):
                out.append(Piece("call", call=ParsedToolCall(name, json.dumps(args, ensure_ascii=False))))
                self.calls += 1
            else:
                add_text(out, "content", body)
        self._state, self._channel, self._recipient = "header", "", ""



def _harmony_parser(tools_active: bool, ctx: ToolContext) -> ChoiceParser:
    return HarmonyParser(tools_active, ctx)


def _write_harmony(calls: Sequence[WrittenCall]) -> str:
    return "<|start|>assistant".join(f"<|channel|>commentary to=functions.{c.name} <|constrain|>json<|message|>"
                                     f"{dump(c.arguments)}<|call|>" for c in calls)


HARMONY = ToolFormat(
    "harmony", (), None,
    CallPrompt("<|channel|>commentary to=functions.<function-name> <|constrain|>json<|message|><arguments-json-object>"
               "<|call|>", _write_harmony),
    Marks(template=lambda t: "<|channel|>" in t, token="<|channel|>",
          tokens=lambda t: {"<|channel|>", "<|constrain|>"} <= t),
    inner=HARMONY_MARKERS, stops=("<|return|>", "<|call|>"), parser=_harmony_parser, reasoning="harmony",
    models="gpt-oss-20b, gpt-oss-120b")

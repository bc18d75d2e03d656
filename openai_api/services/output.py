"""One choice's generated text as what an API returns: reasoning, content and tool calls.

`ChoiceOutput` takes a choice's text as it is generated (or all of it at once, `last=True`) and returns
`Delta`s in order. The model's parser families (`text.families`) split it: the thinking goes to
`reasoning` deltas, and with `tool_choice: auto` the family's call markup is held back (never sent as
content) and each call is sent once its region ends. A forced call's guided JSON is read here instead
(`services.tools`: a named call streams its arguments as generated, a `required` call is sent whole once
its JSON is complete, or as the calls complete before a cut by max_tokens). Chat streams, plain chat
answers and the Responses API read the same deltas, so the streamed and the plain answer to a request
are one answer.

A plain chat without tools or reasoning does not come here: its text is its content, and the encoders
skip this per-token work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from openai_api.services.tools import ToolPlan
from openai_api.text.families import ChoiceParser, ParsedToolCall, make_parser, thinks
from openai_api.tracing import traced_step


@dataclass(slots=True)
class Delta:
    """`reasoning` / `content`: new text. `call`: a tool call starts (`index`, `call_id`, `name`).
    `arguments`: more of call `index`'s arguments (JSON text)."""

    kind: Literal["reasoning", "content", "call", "arguments"]
    text: str = ""
    index: int = 0
    call_id: str = ""
    name: str = ""


@dataclass
class Assembled:
    """A whole choice, from its deltas: what a plain (non-streamed) answer holds."""

    reasoning: str = ""
    content: str = ""
    calls: list[ParsedToolCall] = field(default_factory=list)


class ChoiceOutput:
    """Per choice (see the module docstring). `calls` counts the tool calls sent so far; `reasoning_tokens`
    the generated tokens that belong to the thinking, when pushes say how many tokens exist so far.
    `reasoning`: the model's reasoning family; `prompt`: the rendered prompt (whether it opened the
    thinking section itself)."""

    def __init__(self, plan: ToolPlan, reasoning: str | None, tool_parser: str | None = None,
                 prompt: str | None = None, control: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        family = plan.family if plan.forced is None else None
        self.parser: ChoiceParser | None = make_parser(family or tool_parser, reasoning,
                                                       tools_active=family is not None, ctx=plan.ctx, prompt=prompt,
                                                       control=control)
        # Reasoning tokens are counted only for a model with a thinking section (per-token bookkeeping).
        self._thinks = thinks(tool_parser, reasoning)
        self.calls = 0
        self.reasoning_tokens = 0
        self._produced = 0
        self._undecided = 0  # tokens pushed before the parser knew whether they open a thinking section
        self._held: list[str] = []  # a required call's JSON until it is complete
        self._named_id = ""
        self._cut = False
        self._tool_parser, self._reasoning_parser = tool_parser, reasoning
        self._first_ns = 0  # the first push (a traced request's `output parsing` span runs from it to the last)
        if self.parser is not None and family is not None and plan.prefill:
            self.parser.push(plan.prefill)

    @property
    def reasoning_text(self) -> str:
        return self.parser.reasoning_text if self.parser is not None else ""

    @property
    def thinking_chars(self) -> int:
        return self.parser.thinking_chars if self.parser is not None else 0

    def push(self, text: str, last: bool = False, produced: int | None = None, cut: bool = False) -> list[Delta]:
        """The deltas of `text`, the choice's next piece (`last`: its end; `cut`: it ended at max_tokens).
        `produced`: tokens generated so far; those new since the previous push count as reasoning tokens
        when they are (part of) thinking (the token that ends the thinking counts too: it is the end tag)."""
        out: list[Delta] = []
        self._cut = cut
        if not self._first_ns:
            self._first_ns = time.time_ns()
        parser = self.parser
        if parser is None:
            self._route(text, last, out)
            if last and self.plan.forced is not None:  # a forced call's JSON was parsed; plain text was not
                self._end_span()
            return out
        was_thinking = parser.thinking
        pieces = parser.push(text) if text else []
        if last:
            pieces += parser.finish(cut)
        if produced is not None and self._thinks:
            new, self._produced = produced - self._produced, produced
            if parser.undecided:
                self._undecided += new
            else:
                if was_thinking or parser.thinking or any(p.kind == "reasoning" for p in pieces):
                    self.reasoning_tokens += self._undecided + new
                self._undecided = 0
        content: list[str] = []
        for p in pieces:
            if p.kind == "reasoning":
                out.append(Delta("reasoning", p.text))
            elif p.kind == "content":
                if self.plan.forced is None:
                    out.append(Delta("content", p.text))
                else:
                    content.append(p.text)
            elif p.call is not None and (self.plan.parallel or self.calls == 0):
                self._add_calls([p.call], out)
        if self.plan.forced is not None:
            self._route("".join(content), last, out)
        if last:
            self._end_span()
        return out

    def _end_span(self) -> None:
        """A traced request's `output parsing` span, once per choice whose output is parsed (a tool or reasoning
        parser, or a forced call), at its end: from its first piece of output to its last, with the parsers and
        what they found (nothing when tracing is off)."""
        traced_step("output parsing", self._first_ns, time.time_ns(), **{
            "openai_api.parser.tool": self._tool_parser or "", "openai_api.parser.reasoning":
                self._reasoning_parser or "", "openai_api.parser.tool_calls": self.calls,
            "gen_ai.usage.reasoning_tokens": self.reasoning_tokens})

    def _route(self, text: str, last: bool, out: list[Delta]) -> None:
        """Text that is not thinking: a forced call's guided JSON, or plain content."""
        if self.plan.forced == "named":
            self._named(text, last, out)
        elif self.plan.forced == "required":
            self._required(text, last, out)
        elif text:
            out.append(Delta("content", text))

    def _named(self, text: str, last: bool, out: list[Delta]) -> None:
        if not self.calls and (text or last):
            self.calls = 1
            self._named_id = ParsedToolCall(self.plan.forced_name, "").id
            out.append(Delta("call", index=0, call_id=self._named_id, name=self.plan.forced_name))
        if text:
            out.append(Delta("arguments", text, index=0))

    def _required(self, text: str, last: bool, out: list[Delta]) -> None:
        self._held.append(text)
        if not last:
            return
        whole = "".join(self._held)
        calls = self.plan.calls_from(whole, cut=self._cut)
        if not calls:  # nothing complete (cut by max_tokens before the first call ended): the text as produced
            if whole:
                out.append(Delta("content", whole))
            return
        self._add_calls(calls, out)

    def _add_calls(self, calls: list[ParsedToolCall], out: list[Delta]) -> None:
        for call in calls:
            k = self.calls
            self.calls += 1
            out.append(Delta("call", index=k, call_id=call.id, name=call.name))
            out.append(Delta("arguments", call.arguments, index=k))


def assemble(deltas: list[Delta]) -> Assembled:
    """A whole answer from its deltas (a plain response)."""
    result = Assembled()
    reasoning, content = [], []
    for d in deltas:
        if d.kind == "reasoning":
            reasoning.append(d.text)
        elif d.kind == "content":
            content.append(d.text)
        elif d.kind == "call":
            result.calls.append(ParsedToolCall(d.name, "", id=d.call_id))
        else:
            result.calls[d.index].arguments += d.text
    result.reasoning, result.content = "".join(reasoning), "".join(content)
    return result

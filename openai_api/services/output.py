"""One choice's generated text as what an API returns: reasoning, content and tool calls.

`ChoiceOutput` takes a choice's text as it is generated (or all of it at once, `last=True`) and returns
`Delta`s in order. It applies the model's reasoning parser first (`text.reasoning`: the thinking goes
to `reasoning` deltas), then the request's tool handling to what remains: a forced call's guided JSON
(`services.tools`: a named call streams its arguments as generated, a `required` call is sent whole
once its JSON is complete), or the model's tool parser for `tool_choice: auto` (call text held back,
never sent as content, each call sent once it parses). Chat streams, plain chat answers and the
Responses API read the same deltas, so the streamed and the plain answer to a request are one answer.

A plain chat without tools or reasoning does not come here: its text is its content, and the encoders
skip this per-token work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from openai_api.services.tools import ToolPlan
from openai_api.text.reasoning import ReasoningParserName, ReasoningSplitter
from openai_api.text.tool_parsers import ParsedToolCall, ToolStreamParser


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
    the generated tokens that belong to the thinking, when pushes say how many tokens exist so far."""

    def __init__(self, plan: ToolPlan, reasoning: ReasoningParserName | None) -> None:
        self.plan = plan
        self.splitter = ReasoningSplitter(reasoning) if reasoning else None
        self.calls = 0
        self.reasoning_tokens = 0
        self._produced = 0
        self._undecided = 0  # tokens pushed before the splitter knew whether they open a thinking section
        self._held: list[str] = []  # a required call's JSON until it is complete
        self._named_id = ""
        self._parser: ToolStreamParser | None = None
        if plan.forced is None and plan.parser is not None:
            self._parser = plan.parser.streamer()
            if plan.prefill:
                self._parser.push(plan.prefill)

    @property
    def reasoning_text(self) -> str:
        return self.splitter.reasoning_text if self.splitter is not None else ""

    def push(self, text: str, last: bool = False, produced: int | None = None) -> list[Delta]:
        """The deltas of `text`, the choice's next piece (`last`: its end). `produced`: tokens generated so
        far; those new since the previous push count as reasoning tokens when they are (part of) thinking
        (the token that ends the thinking counts too: it is the end tag)."""
        out: list[Delta] = []
        content = text
        if self.splitter is not None:
            was_thinking = self.splitter.thinking
            reasoning, content = self.splitter.push(text)
            if last:
                r2, c2 = self.splitter.finish()
                reasoning, content = reasoning + r2, content + c2
            if produced is not None:
                new, self._produced = produced - self._produced, produced
                if self.splitter.undecided:
                    self._undecided += new
                else:
                    if was_thinking or reasoning or self.splitter.thinking:
                        self.reasoning_tokens += self._undecided + new
                    self._undecided = 0
            if reasoning:
                out.append(Delta("reasoning", reasoning))
        if self.plan.forced == "named":
            self._named(content, last, out)
        elif self.plan.forced == "required":
            self._required(content, last, out)
        elif self._parser is not None:
            self._parsed(content, last, out)
        elif content:
            out.append(Delta("content", content))
        return out

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
        calls = self.plan.calls_from(whole)
        if not calls:  # cut by max_tokens: the text as produced
            if whole:
                out.append(Delta("content", whole))
            return
        self._add_calls(calls, out)

    def _parsed(self, text: str, last: bool, out: list[Delta]) -> None:
        assert self._parser is not None
        events = [self._parser.push(text)] if text else []
        if last:
            events.append(self._parser.finish())
        for ev in events:
            if ev.content:
                out.append(Delta("content", ev.content))
            calls = ev.calls if self.plan.parallel else ev.calls[: max(0, 1 - self.calls)]
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

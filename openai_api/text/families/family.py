"""What one tool-call family is: the format it reads (parse side), the format it writes (prompt side), and how
`tool_parser: auto` recognises it.

A `ToolFormat` is one family's whole definition, registered under its config name in `registry.FAMILIES`:

* **Parse side**: its call `regions` (the markers that open and close them, as text), the `decode`r of a
  region's text into calls, how call ids are made, and the markers inside regions the detokenizer must keep.
  A family whose output is not call regions in running text (harmony's channels) brings its own `parser`.
* **Prompt side** (`CallPrompt`): how the gateway writes the family's calls into a prompt when the chat
  template cannot - an earlier assistant turn's calls, the call format described in a system message for a
  template that ignores `tools` - and how a forced call opens (`services.tools`).
* **Marks** (`Marks`): what in a chat template or a tokenizer's added tokens names the family (`detect.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from openai_api.text.families.calls import Decoder, ParsedToolCall, ToolContext, openai_call_id
from openai_api.text.families.reasoning import ReasoningParserName
from openai_api.text.json_args import canonical


@dataclass(frozen=True, slots=True)
class Region:
    """A call region: `start` ... `end` (None: to the end of the output). `lead`: the start counts only at
    the very start of the answer (a JSON or pythonic answer), and is itself part of the region's text."""

    start: str
    end: str | None = None
    lead: bool = False


@dataclass(slots=True)
class Piece:
    """A piece of one choice's output, in order: reasoning or content text, or a whole tool call."""

    kind: Literal["reasoning", "content", "call"]
    text: str = ""
    call: ParsedToolCall | None = None


class ChoiceParser(Protocol):
    """One choice's output -> `Piece`s, incrementally: `push(text)` returns what is safe to send now,
    `finish(cut)` the rest at the end of the output (`cut`: by max_tokens). `engine.OutputParser` for
    region families, a family's own `parser` otherwise (harmony)."""

    calls: int

    @property
    def reasoning_text(self) -> str: ...

    @property
    def undecided(self) -> bool: ...

    @property
    def thinking(self) -> bool: ...

    @property
    def thinking_chars(self) -> int: ...

    def push(self, text: str) -> list[Piece]: ...

    def finish(self, cut: bool = False) -> list[Piece]: ...


@dataclass(frozen=True, slots=True)
class WrittenCall:
    """An earlier call, to be written back into a prompt: its name, its arguments (a JSON object as the
    client sent them; anything else when the client's history held no object) and its id."""

    name: str
    arguments: Any
    id: str = ""

    def items(self) -> list[tuple[str, Any]]:
        """The arguments one by one, for formats that name each argument (none when they are no object)."""
        return list(self.arguments.items()) if isinstance(self.arguments, dict) else []


def dump(value: Any) -> str:
    """JSON as the families' own templates write it (`json.dumps` separators, characters kept); an earlier
    call's decoded arguments by what their source text gives (`text.json_args`: no re-encoding per turn)."""
    return canonical(value)


def dump_object(*pairs: tuple[str, Any]) -> str:
    """`dump(dict(pairs))`, built from each value's `dump` (so decoded arguments inside are not re-encoded):
    `json.dumps`'s own output for an object, with its separators."""
    return "{" + ", ".join(canonical(k) + ": " + dump(v) for k, v in pairs) + "}"


def as_text(value: Any) -> str:
    """A value written as text (XML formats): strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else dump(value)


_PREAMBLE = ("You are a function calling AI model. You may call one or more of the functions described in "
             "<tools></tools> to answer the user.\n<tools>\n{tools}\n</tools>\nTo call a function, reply with the "
             "call in exactly this form:\n{form}\nIf no function is needed, answer normally.")


@dataclass(frozen=True)
class CallPrompt:
    """A family's prompt side: how the gateway writes its calls where the chat template does not.

    `form`: the call's shape as a system message describes it (`<...>` placeholders), for a template that ignores
    `tools`. `write`: one assistant turn's calls as the model itself writes them (a template that does not render
    `tool_calls` gets them as text). `result`: a tool's result in such a history (`{}` is the result's text).
    A forced call (`tool_choice` required or a named function) is guided JSON `{"name": ..., <args_key>: ...}`
    (`services.tools`); `opening` is what the family writes before a call's JSON object, prefilled so the model
    stays in its format; `json_call`: the family's call *is* that JSON object after `opening`, so a named call is
    prefilled up to its arguments."""

    form: str
    write: Callable[[Sequence[WrittenCall]], str]
    args_key: str = "arguments"
    opening: str = ""
    json_call: bool = False
    result: str = "<tool_response>\n{}\n</tool_response>"

    def system_text(self, tools: Iterable[dict[str, Any]]) -> str:
        """The system message that describes `tools` and this call format to a model whose template ignores them."""
        return _PREAMBLE.format(tools="\n".join(dump(t) for t in tools), form=self.form)

    def result_text(self, content: str) -> str:
        return self.result.replace("{}", content, 1)


@dataclass(frozen=True)
class Marks:
    """How `tool_parser: auto` recognises the family (`detect.py`). `template`: its chat template writes the
    format; `token`: an added token of its tokenizer that marks it (`tokens`, when more than its presence
    decides); `shared`: other families that use `token` too, so that the tokenizer alone leaves a guess."""

    template: Callable[[str], bool] | None = None
    token: str | None = None
    tokens: Callable[[set[str]], bool] | None = None
    shared: tuple[str, ...] = ()

    def in_tokens(self, added: set[str]) -> bool:
        if self.tokens is not None:
            return self.tokens(added)
        return self.token is not None and self.token in added


@dataclass(frozen=True)
class ToolFormat:
    """One family's definition (module docstring). `inner`: the markers inside its regions (kept by the detokenizer
    with the regions' own). `ids`: how call ids are made (the model's own id when it writes one). `needs_end`: a
    region without its end marker (and not cut) is not a call. `stops`: tokens that end a generation whatever the
    model's configured EOS (gpt-oss's `<|call|>`). `parser`: the family's own output parser, for a grammar that is
    not regions (then `decode` is None). `reasoning`: the reasoning parser its own grammar implies. Which markers
    are control tokens depends on the model's tokenizer: the registry tells the parser (`OutputParser.control`)."""

    name: str
    regions: tuple[Region, ...]
    decode: Decoder | None
    prompt: CallPrompt
    marks: Marks = field(default_factory=Marks)
    inner: tuple[str, ...] = ()
    ids: Callable[[], str] = openai_call_id
    needs_end: bool = False
    stops: tuple[str, ...] = ()
    parser: Callable[[bool, ToolContext], ChoiceParser] | None = None
    reasoning: ReasoningParserName | None = None
    models: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker of the format: what the detokenizer must keep when it is a special token."""
        out = [r.start for r in self.regions if not r.lead] + [r.end for r in self.regions if r.end]
        return tuple(dict.fromkeys([*out, *self.inner]))

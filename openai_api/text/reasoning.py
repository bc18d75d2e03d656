"""Splitting a reasoning model's output into its thinking and its answer, whole or while streaming.

Reasoning models (DeepSeek-R1, Qwen3, gpt-oss style) write a thinking section first, between `<think>`
and `</think>`; every major server returns it apart, as `reasoning_content`. Two parsers, after vLLM's:

* `deepseek_r1`: the model's chat template already opened the section (its prompt ends with
  `<think>\\n`), so output starts *inside* it: everything up to `</think>` is reasoning, the rest is the
  answer; an output without `</think>` is all reasoning (it was cut, or never ended). A `<think>` the
  model writes anyway at the start is dropped.
* `qwen3`: the section is optional: only output that starts with `<think>` (after whitespace) has one;
  other output is all answer (Qwen3 with thinking turned off).

`ReasoningSplitter.push(text)` returns `(reasoning, content)` safe to send now: text that could be the
start of a tag (`</thi`) is held back until the next piece says what it is, so a tag split across
tokens never leaks into either part. The newline that follows `<think>` and the blank lines after
`</think>` are layout, not text: they are dropped.
"""

from __future__ import annotations

from typing import Literal

ReasoningParserName = Literal["deepseek_r1", "qwen3"]
START, END = "<think>", "</think>"


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag` (what must be held back)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """One output's split into reasoning and content (see the module docstring); O(new text) per push."""

    __slots__ = ("_end", "_held", "_lead", "_raw", "_state", "_strip_content", "name", "reasoning_text")

    def __init__(self, name: ReasoningParserName) -> None:
        self.name = name
        # "lead": before anything decisive (whitespace only so far); "reasoning"; "content".
        self._state = "reasoning" if name == "deepseek_r1" else "lead"
        self._lead = name == "deepseek_r1"  # deepseek: a leading <think> the model writes anyway is dropped
        self._held = ""
        self._strip_content = False  # drop the blank lines right after </think>
        self.reasoning_text = ""  # all reasoning so far (for usage)
        self._raw = 0  # characters pushed so far
        self._end: int | None = None  # where in them the thinking section ended (after its end tag)

    def push(self, text: str) -> tuple[str, str]:
        self._raw += len(text)
        buf = self._held + text
        self._held = ""
        reasoning, content = "", ""
        while buf:
            if self._state == "lead":
                stripped = buf.lstrip()
                if not stripped or START.startswith(stripped):
                    self._held = buf  # whitespace, or the start of "<think>": wait
                    return reasoning, content
                if stripped.startswith(START):
                    buf = stripped[len(START):].removeprefix("\n")
                    self._state = "reasoning"
                    continue
                self._state = "content"
                continue
            if self._state == "reasoning":
                if self._lead:
                    stripped = buf.lstrip()
                    if not stripped or START.startswith(stripped):
                        self._held = buf
                        return reasoning, content
                    self._lead = False
                    if stripped.startswith(START):
                        buf = stripped[len(START):].removeprefix("\n")
                        continue
                i = buf.find(END)
                if i == -1:
                    keep = _partial_tail(buf, END)
                    part, self._held = (buf[:-keep], buf[-keep:]) if keep else (buf, "")
                    reasoning += part
                    self.reasoning_text += part
                    return reasoning, content
                reasoning += buf[:i]
                self.reasoning_text += buf[:i]
                buf = buf[i + len(END):]
                self._end = self._raw - len(buf)
                self._state = "content"
                self._strip_content = True
                continue
            # content
            if self._strip_content:
                buf = buf.lstrip("\n")
                if not buf:
                    return reasoning, content
                self._strip_content = False
            content += buf
            buf = ""
        return reasoning, content

    @property
    def undecided(self) -> bool:
        """Nothing decisive seen yet (`qwen3`: whitespace, or the start of `<think>`)."""
        return self._state == "lead"

    @property
    def thinking(self) -> bool:
        """Inside the thinking section (its end not seen yet)."""
        return self._state == "reasoning"

    @property
    def thinking_chars(self) -> int:
        """How many of the characters pushed so far are the thinking section, tags included."""
        if self._end is not None:
            return self._end
        return self._raw if self._state == "reasoning" else 0

    def finish(self) -> tuple[str, str]:
        """The end of the output: whatever was held back is released as what it turned out to be."""
        held, self._held = self._held, ""
        if not held:
            return "", ""
        if self._state == "reasoning":
            self.reasoning_text += held
            return held, ""
        if self._state == "lead":
            return "", held.strip() and held
        return "", held

    def split(self, text: str) -> tuple[str, str]:
        """A whole output at once: (reasoning, content)."""
        r1, c1 = self.push(text)
        r2, c2 = self.finish()
        return r1 + r2, c1 + c2

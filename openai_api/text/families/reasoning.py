"""Thinking sections: the part of an answer a reasoning model writes before it answers (`reasoning_content`).

Each `ReasoningFormat` is one family's section markers, registered in `REASONING` under the names the model
config uses (`reasoning_parser`). Harmony's thinking is its `analysis` channel, read by the harmony family's
own parser (`harmony.py`), not a section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ReasoningParserName = Literal["deepseek_r1", "qwen3", "mistral", "harmony"]
REASONING_PARSER_NAMES: tuple[str, ...] = get_args(ReasoningParserName)


@dataclass(frozen=True)
class ReasoningFormat:
    """A thinking section: `start` ... `end`. `opened_by_prompt`: the template opens it, so output starts
    inside (DeepSeek-R1); otherwise the section is optional and only output that starts with `start` has
    one - unless the rendered prompt itself ends inside an open section (`prompt_opens`). `close`: the text
    the gateway writes after the model's output to end an open section when a thinking budget is spent
    (`services.generation.budgeted_chunks`), as the family itself ends it; None: the section cannot be
    closed from outside, so a budget only caps what is sent."""

    name: str
    start: str
    end: str
    opened_by_prompt: bool = False
    close: str | None = None

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.start, self.end)

    def prompt_opens(self, prompt: str) -> bool:
        """Whether the rendered prompt ends inside a thinking section (Qwen3-Thinking, DeepSeek V3.1 and
        GLM templates open it themselves; a `</think>` after it - thinking turned off - closes it)."""
        tail = prompt[-256:].rstrip()
        i = tail.rfind(self.start)
        return i != -1 and tail.find(self.end, i) == -1

    def starts_inside(self, prompt: str | None) -> bool:
        if prompt is not None:
            tail = prompt[-256:].rstrip()
            if tail.endswith(self.end):
                return False  # the template closed the section itself: the answer follows
            if self.prompt_opens(prompt):
                return True
        return self.opened_by_prompt


REASONING: dict[str, ReasoningFormat] = {r.name: r for r in (
    # Qwen3 and DeepSeek-R1 end their thinking with a newline, the tag and a blank line (their templates and
    # Qwen3's own budget forcing write the same); Magistral's `[/THINK]` is followed directly by the answer.
    ReasoningFormat("deepseek_r1", "<think>", "</think>", opened_by_prompt=True, close="\n</think>\n\n"),
    ReasoningFormat("qwen3", "<think>", "</think>", close="\n</think>\n\n"),
    ReasoningFormat("mistral", "[THINK]", "[/THINK]", close="[/THINK]"),
)}  # harmony's thinking is its `analysis` channel: the harmony family's own parser reads it


def detect_reasoning_section(template: str) -> ReasoningParserName | None:
    """The thinking section a chat template speaks of (None: it has none)."""
    if "[THINK]" in template:
        return "mistral"
    if "<think>" in template:
        return "qwen3"
    return None

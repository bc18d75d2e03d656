"""`tool_parser: auto` and `reasoning_parser: auto`: the families a model speaks, read from what it ships.

The chat template first (what the model is prompted with), then the tokenizer's added tokens (a model folder may
ship no template: DeepSeek V3.2 and V4 ship none). Each family's `Marks` say what names it; the registry's order
decides between families that share a marker (most specific first). With no marker anywhere the family is
hermes - the format the gateway itself describes to a model whose template does not render tools - as a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, cast

from openai_api.text.families.reasoning import ReasoningParserName, detect_reasoning_section
from openai_api.text.families.registry import FAMILIES, ToolParserName


@dataclass(frozen=True)
class Detection:
    """What `tool_parser: auto` found. `family`; `evidence`: where its marker was (`template`, `tokenizer`)
    or `none` (no marker anywhere: hermes, the format the gateway itself describes to a model whose template
    does not render tools); `why`, for the log; `guess`: nothing the model ships names one family (no
    marker, or markers several families share)."""

    family: ToolParserName
    evidence: Literal["template", "tokenizer", "none"]
    why: str
    guess: bool = False


def detect_tool_format(template: str, tokens: Iterable[str] = ()) -> Detection:
    """The tool format a model speaks: from its chat template first, then from its tokenizer's added tokens,
    most specific first; hermes when neither has a marker."""
    for family in FAMILIES.values():
        if family.marks.template is not None and family.marks.template(template):
            return Detection(cast(ToolParserName, family.name), "template",
                             "its chat template writes the format's markers")
    added = set(tokens)
    for family in FAMILIES.values():
        marks = family.marks
        if marks.in_tokens(added):
            why = f"its tokenizer has the token {marks.token!r}"
            if marks.shared:
                why += f", which {', '.join(marks.shared)} also use{'s' if len(marks.shared) == 1 else ''}"
            return Detection(cast(ToolParserName, family.name), "tokenizer", why, guess=bool(marks.shared))
    return Detection("hermes", "none", "no tool-call marker in its chat template or its tokenizer", guess=True)


def detect_family(template: str, special_tokens: Iterable[str] = ()) -> ToolParserName:
    """The tool format a chat template (and tokenizer) speaks (`detect_tool_format`); hermes by default."""
    return detect_tool_format(template, special_tokens).family


def detect_reasoning(template: str, family: str | None) -> ReasoningParserName | None:
    """The thinking section a chat template speaks of (None: it has none); a family whose own grammar carries
    its thinking (harmony's `analysis` channel) names its own."""
    implied = FAMILIES[family].reasoning if family in FAMILIES else None
    return implied or detect_reasoning_section(template)

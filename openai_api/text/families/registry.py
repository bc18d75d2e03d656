"""The families the model config can name, and the parser of one choice's output built from them.

`FAMILIES` registers each `ToolFormat` under its `tool_parser` name, in the order `tool_parser: auto` tries their
marks (`detect.py`): most specific first, since several families share a marker (`<tool_call>` opens hermes,
qwen3_xml and glm45 regions; DeepSeek's markers open V3's and V3.1's). `ToolParserName` is the same names for the
config's validation: a name the registry does not hold is a start-up error, and a unit test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from openai_api.text.families.calls import ToolContext
from openai_api.text.families.deepseek import DEEPSEEK_DSML, DEEPSEEK_V3, DEEPSEEK_V31
from openai_api.text.families.engine import OutputParser
from openai_api.text.families.family import ChoiceParser, ToolFormat
from openai_api.text.families.glm import GLM45
from openai_api.text.families.harmony import HARMONY
from openai_api.text.families.hermes import HERMES, QWEN3_XML
from openai_api.text.families.kimi import KIMI_K2
from openai_api.text.families.llama import LLAMA3_JSON, LLAMA4, PYTHONIC
from openai_api.text.families.mistral import MISTRAL
from openai_api.text.families.reasoning import REASONING

ToolParserName = Literal["hermes", "qwen3_xml", "llama3_json", "llama4", "pythonic", "mistral", "deepseek_v3",
                         "deepseek_v31", "deepseek_dsml", "harmony", "kimi_k2", "glm45"]
TOOL_PARSER_NAMES: tuple[str, ...] = get_args(ToolParserName)

FAMILIES: dict[str, ToolFormat] = {f.name: f for f in (
    HARMONY, KIMI_K2, DEEPSEEK_DSML, DEEPSEEK_V3, DEEPSEEK_V31, MISTRAL, GLM45, QWEN3_XML, LLAMA4, LLAMA3_JSON,
    HERMES, PYTHONIC,
)}


def own_parser(tool_parser: str | None, reasoning_parser: str | None) -> ToolFormat | None:
    """The family that reads the whole output with its own parser (harmony), when either parser names one."""
    for name in (tool_parser, reasoning_parser):
        family = FAMILIES.get(name or "")
        if family is not None and family.parser is not None:
            return family
    return None


def thinks(tool_parser: str | None, reasoning_parser: str | None) -> bool:
    """Whether the model's output may hold thinking: a reasoning parser, or a family whose grammar carries it."""
    family = FAMILIES.get(tool_parser or "")
    return reasoning_parser is not None or (family is not None and family.reasoning is not None)


def keep_markers(tool_parser: str | None, reasoning_parser: str | None) -> tuple[str, ...]:
    """The marker texts a model's detokenizer must keep (the rest of its special tokens are dropped)."""
    out: list[str] = []
    own = own_parser(tool_parser, reasoning_parser)
    if own is not None:
        out += own.markers
    elif tool_parser in FAMILIES:
        out += FAMILIES[tool_parser].markers
    if reasoning_parser in REASONING:
        out += REASONING[reasoning_parser].markers
    return tuple(dict.fromkeys(out))


def make_parser(tool_parser: str | None, reasoning_parser: str | None, *, tools_active: bool,
                ctx: ToolContext | None = None, prompt: str | None = None, control: Iterable[str] = ()
                ) -> ChoiceParser | None:
    """The parser of one choice's output, or None when the output is plain content (no tool format is
    active and the model has no thinking section). `tools_active`: the request offered tools and lets the
    model call them (`tool_choice` auto); `control`: the family's markers that are special tokens of the
    model's tokenizer."""
    own = own_parser(tool_parser, reasoning_parser)
    if own is not None and own.parser is not None:
        return own.parser(tools_active, ctx or ToolContext())
    tools = FAMILIES[tool_parser] if tools_active and tool_parser in FAMILIES else None
    reasoning = REASONING.get(reasoning_parser) if reasoning_parser else None
    if tools is None and reasoning is None:
        return None
    return OutputParser(tools, reasoning, ctx, prompt, control)

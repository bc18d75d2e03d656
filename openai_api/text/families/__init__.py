"""The model families: how each writes reasoning, content and tool calls, read back (parse side) and written
(prompt side) in one definition per family.

A model writes its answer in its family's own markup: a thinking section (`<think>`...`</think>`,
`[THINK]`...`[/THINK]`, harmony's `analysis` channel), then text and tool calls in one of a dozen formats.
Every server returns the three apart: `reasoning_content`, `content`, `tool_calls`. Each family is one
`ToolFormat` (`family.py`): its call regions' markers and decoder, its prompt side (`CallPrompt`: how the gateway
writes its calls into a prompt, how a forced call opens) and its marks for `auto` detection. `registry.FAMILIES`
registers them under the names the model config uses (`tool_parser`), `reasoning.REASONING` the thinking
sections (`reasoning_parser`); `detect.py` picks both from a chat template and the tokenizer's added tokens
(`auto`), saying when the family is only a guess. `engine.OutputParser` reads one choice's output through them,
incrementally, in O(new text) per push; the services only ask the registry (`make_parser`, `FAMILIES[name]`) and
never name a family.

Rules every family shares:
- A region that does not decode (bad JSON, a call to a function the request did not offer, a pythonic
  list with positional arguments) falls back to content: its text with the markers that are control
  (special) tokens of the model's tokenizer removed, so no control token ever reaches `content` or
  `reasoning_content`. A region cut by max_tokens keeps the calls that were whole before the cut and
  drops the rest.
- Whitespace around call regions is layout: dropped, like whitespace at the start and the end of the
  answer (when a tool format is active).
- Markers are text: the detokenizer keeps a family's marker tokens (`ToolFormat.markers`,
  `ReasoningFormat.markers`) and drops every other special token (`services.registry`), so token-id
  protocols (TensorRT-LLM, FasterTransformer) and text protocols that keep special tokens read the same.

**A new family costs one file plus a registry row**: a module here with its decoder, its writer and its
`ToolFormat` (regions, `CallPrompt`, `Marks`), then its name in `registry.ToolParserName` and its row in
`registry.FAMILIES` (placed by how specific its marks are), and a golden corpus in
`tests/data/families/corpus/<name>.json` that the unit and e2e tiers run through both sides. A family whose output
is not call regions in running text brings its own parser (`ToolFormat.parser`, as `harmony.py`).
"""

from openai_api.text.families.calls import MAX_REGION_CHARS, ParsedToolCall, RawCall, ToolContext
from openai_api.text.families.detect import Detection, detect_family, detect_reasoning, detect_tool_format
from openai_api.text.families.engine import OutputParser
from openai_api.text.families.family import CallPrompt, ChoiceParser, Piece, Region, ToolFormat, WrittenCall
from openai_api.text.families.harmony import HARMONY_MARKERS, HarmonyParser
from openai_api.text.families.reasoning import (
    REASONING,
    REASONING_PARSER_NAMES,
    ReasoningFormat,
    ReasoningParserName,
)
from openai_api.text.families.registry import (
    FAMILIES,
    TOOL_PARSER_NAMES,
    ToolParserName,
    keep_markers,
    make_parser,
    own_parser,
    thinks,
)

__all__ = [
    "FAMILIES", "HARMONY_MARKERS", "MAX_REGION_CHARS", "REASONING", "REASONING_PARSER_NAMES", "TOOL_PARSER_NAMES",
    "CallPrompt", "ChoiceParser", "Detection", "HarmonyParser", "OutputParser", "ParsedToolCall", "Piece",
    "RawCall", "ReasoningFormat", "ReasoningParserName", "Region", "ToolContext", "ToolFormat", "ToolParserName",
    "WrittenCall", "detect_family", "detect_reasoning", "detect_tool_format", "keep_markers", "make_parser",
    "own_parser", "thinks",
]

"""One parser engine for a model's output: reasoning, content and tool calls, per model family.

A model writes its answer in its family's own markup: a thinking section (`<think>`...`</think>`,
`[THINK]`...`[/THINK]`, harmony's `analysis` channel), then text and tool calls in one of a dozen formats.
Every server returns the three apart: `reasoning_content`, `content`, `tool_calls`. Here each family is
one declarative `ToolFormat` (the markers that open and close its call regions, as text, and how a
region's text becomes calls) or, for harmony's channel grammar, one small state machine; `FAMILIES`
registers them under the names the model config uses (`tool_parser`), and `REASONING` the thinking
sections (`reasoning_parser`). `detect_tool_format` and `detect_reasoning` pick them from a chat template
and the tokenizer's added tokens (`auto`), saying when the family is only a guess.

`OutputParser` runs one choice's output through them, incrementally: `push(text)` returns the `Piece`s
that are safe to send now, `finish()` the rest. Work is O(new text) per push: only a possible partial
marker at the end of the text is held back (`_partial_tail`), and a call region is searched for its end
from where the previous search stopped; a region's text is decoded once, when it ends. A plain answer is
the same machine fed the whole text at once, so the streamed and the plain answer are one answer
(content, reasoning, every call's name, id and arguments), at every split of the text.

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
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

ToolParserName = Literal["hermes", "qwen3_xml", "llama3_json", "llama4", "pythonic", "mistral", "deepseek_v3",
                         "deepseek_v31", "deepseek_dsml", "harmony", "kimi_k2", "glm45"]
ReasoningParserName = Literal["deepseek_r1", "qwen3", "mistral", "harmony"]
TOOL_PARSER_NAMES: tuple[str, ...] = get_args(ToolParserName)
REASONING_PARSER_NAMES: tuple[str, ...] = get_args(ReasoningParserName)

# A region longer than this is not decoded (it falls back to content): bounds the work a hostile or
# runaway output can cause in the decoders (regexes, `ast.parse`).
MAX_REGION_CHARS = 4 * 1024 * 1024


# ----------------------------------------------------------------------------------------------- calls


def openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_ALNUM = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """Mistral's templates require 9 alphanumeric characters (`[a-zA-Z0-9]{9}`) for a call id."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it
    id: str = field(default_factory=openai_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class RawCall:
    """A call as a decoder read it: the function's name, its arguments as a JSON object, and the id the
    model wrote itself (Kimi K2's `functions.name:0`), if any."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class ToolContext:
    """What decoders may know of the request: the offered functions (None: any name) and their parameter
    schemas (formats that write values as text, such as Qwen3-Coder's XML, type them by the schema)."""

    allowed: frozenset[str] | None = None
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_tools(cls, tools: list[dict[str, Any]] | None) -> ToolContext:
        if not tools:
            return cls()
        schemas = {}
        for t in tools:
            fn = t.get("function") if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                params = fn.get("parameters")
                schemas[fn["name"]] = params if isinstance(params, dict) else {}
        return cls(frozenset(schemas), schemas)

    def param_type(self, function: str, param: str) -> str | None:
        """The JSON-schema type of a parameter (the first non-null one of a list), or None if unknown."""
        props = self.schemas.get(function, {}).get("properties")
        spec = props.get(param) if isinstance(props, dict) else None
        if not isinstance(spec, dict):
            return None
        kind = spec.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        if kind is None and "enum" in spec:
            return "string" if all(isinstance(v, str) for v in spec["enum"]) else None
        if kind is None:
            for key in ("anyOf", "oneOf"):
                for alt in spec.get(key) or []:
                    if isinstance(alt, dict) and isinstance(alt.get("type"), str) and alt["type"] != "null":
                        return str(alt["type"])
        return kind if isinstance(kind, str) else None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _json_prefix(text: str) -> tuple[Any, str] | None:
    """The JSON value at the start of `text` (after whitespace) and what follows it, or None."""
    body = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except (ValueError, RecursionError):
        return None
    return value, body[end:]


def _object(value: Any) -> dict[str, Any] | None:
    """Arguments as a JSON object: a dict, or a string holding one (some models quote them)."""
    if isinstance(value, str):
        value = _loads(value)
    return value if isinstance(value, dict) else None


def _typed_value(raw: str, kind: str | None) -> Any:
    """A value written as text (XML formats), typed by its parameter's schema type, as vLLM and SGLang do:
    strings stay text; numbers, booleans, objects and arrays are read as JSON (then as a Python literal);
    a value that does not read as its type stays text."""
    if kind in ("string", "str", "text"):
        return raw
    text = raw.strip()
    if text.lower() in ("null", "none") and kind != "string":
        return None
    if kind in ("integer", "int"):
        try:
            return int(text)
        except ValueError:
            return raw
    if kind in ("number", "float"):
        try:
            num = float(text)
        except ValueError:
            return raw
        return int(num) if num.is_integer() and "." not in text and "e" not in text.lower() else num
    if kind in ("boolean", "bool"):
        return text.lower() == "true" if text.lower() in ("true", "false") else raw
    value = _loads(text)
    if value is not None:
        return value
    if kind in ("object", "array"):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
            return raw
    return raw


# -------------------------------------------------------------------------------------------- decoders
# Each decoder reads one region's text (between its start and end markers) and returns its calls, or None
# when the text is not a well-formed region of the family (then the region falls back to content).

Decoder = Callable[[str, ToolContext, bool], list[RawCall] | None]
# `partial`: the output was cut by max_tokens inside this region: return the calls that are complete
# before the cut (possibly none), and drop the rest.


def _decode_hermes(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`{"name": ..., "arguments": {...}}` (Hermes, Qwen 2.5/3, SmolLM2); one call per region."""
    if partial:
        return []
    obj = _loads(text.strip())
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = _object(obj.get("arguments", obj.get("parameters", {})))
    return None if args is None else [RawCall(obj["name"], args)]


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _decode_qwen3_xml(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>` (Qwen3-Coder, Qwen3.5): values
    are text, typed by the tool's schema; one newline after the opening and before the closing tag is
    layout."""
    if partial:
        end = text.rfind("</function>")
        if end == -1:
            return []
        text = text[: end + len("</function>")]
    calls = []
    for fm in _FUNCTION.finditer(text):
        name, body = fm.group(1).strip(), fm.group(2)
        args = {}
        for pm in _PARAMETER.finditer(body):
            value = pm.group(2).removeprefix("\n").removesuffix("\n")
            key = pm.group(1).strip()
            args[key] = _typed_value(value, ctx.param_type(name, key))
        calls.append(RawCall(name, args))
    if not calls or _FUNCTION.sub("", text).strip():
        return None
    return calls


_ARG_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _decode_glm45(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>...` (GLM-4.5/4.6/4.7): values typed by
    the schema (strings stay text, everything else is read as JSON); one call per region."""
    if partial:
        return []
    cut = text.find("<arg_key>")
    name = (text if cut == -1 else text[:cut]).strip()
    if not name or "<" in name or "\n" in name:
        return None
    rest = "" if cut == -1 else text[cut:]
    args = {m.group(1).strip(): _typed_value(m.group(2), ctx.param_type(name, m.group(1).strip()))
            for m in _ARG_PAIR.finditer(rest)}
    if _ARG_PAIR.sub("", rest).strip():
        return None
    return [RawCall(name, args)]


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on `sep` outside JSON strings and brackets."""
    parts, depth, in_str, esc, start = [], 0, False, False, 0
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
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


def _decode_llama3_json(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`{"name": ..., "parameters": {...}}`, several separated by `;` (Llama 3.1-3.3 JSON tool calling)."""
    calls: list[RawCall] = []
    for part in _split_top_level(text.strip(), ";"):
        obj = _loads(part.strip())
        # The arguments' key is required (`{"name": "f"}` alone is text, as vLLM's llama3_json reads it).
        args = _object(obj.get("parameters", obj.get("arguments"))) if isinstance(obj, dict) else None
        if args is None or not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return calls if partial else None
        calls.append(RawCall(obj["name"], args))
    return calls if partial else calls or None


def _decode_pythonic(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """`[f(a=1), g(b="x")]` (Llama 3.2/4 pythonic, Gemma, ...): read with `ast`, values as literals -
    parsed, never evaluated; positional arguments, attribute calls and non-literal values are not calls."""
    if partial:  # the longest list of whole calls before the cut: `[f(a=1), g(b=` -> `[f(a=1)]`
        body = text.strip()
        for cut in sorted((i for i, ch in enumerate(body) if ch == ","), reverse=True)[:64]:
            calls = _decode_pythonic(body[:cut] + "]", ctx)
            if calls:
                return calls
        return []
    body = text.strip()
    if not body.startswith("["):
        body = f"[{body}]"
    try:
        tree = ast.parse(body, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                return None
        calls.append(RawCall(node.func.id, args))
    return calls or None


def _decode_mistral(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """After `[TOOL_CALLS]`: `name[ARGS]{...}` (tokenizer v11+, `[CALL_ID]id` before `[ARGS]` in v13+),
    repeated with `[TOOL_CALLS]`; or a JSON list `[{"name": ..., "arguments": {...}}]` (before v11)."""
    calls: list[RawCall] = []
    if partial:  # the pieces that decode, up to the first that does not (the one the cut fell in)
        for piece in text.split("[TOOL_CALLS]"):
            got = _decode_mistral(piece, ctx) if piece.strip() else []
            if got is None:
                break
            calls += got
        return calls
    for piece in text.split("[TOOL_CALLS]"):
        rest = piece.strip()
        while rest:
            if rest[0] in "[{":
                found = _json_prefix(rest)
                if found is None:
                    return None
                value, rest = found[0], found[1].strip()
                for item in value if isinstance(value, list) else [value]:
                    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                        return None
                    args = _object(item.get("arguments", item.get("parameters", {})))
                    if args is None:
                        return None
                    calls.append(RawCall(item["name"], args, item.get("id") if isinstance(item.get("id"), str)
                                         else None))
                continue
            head, sep, tail = rest.partition("[ARGS]")
            if not sep:
                return None
            name, _, call_id = head.partition("[CALL_ID]")
            found = _json_prefix(tail)
            args = _object(found[0]) if found is not None else None
            if args is None or found is None or not name.strip():
                return None
            calls.append(RawCall(name.strip(), args, call_id.strip() or None))
            rest = found[1].strip()
    return calls or None


def _ds(name: str) -> str:
    """A DeepSeek marker as its tokenizer writes it: `<` U+FF5C name U+FF5C `>`, spaces as U+2581."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


DS_CALLS_BEGIN, DS_CALLS_END = _ds("tool calls begin"), _ds("tool calls end")
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = _ds("tool call begin"), _ds("tool call end"), _ds("tool sep")
DSML = "\uff5cDSML\uff5c"
_DS_V3_CALL = re.compile(re.escape(DS_CALL_BEGIN) + "(?:.*?)" + re.escape(DS_SEP)
                         + r"(?P<name>.*?)\n```(?:json)?\n(?P<args>.*?)\n```\s*" + re.escape(DS_CALL_END), re.DOTALL)
_DS_V31_CALL = re.compile(re.escape(DS_CALL_BEGIN) + "(?P<name>.*?)" + re.escape(DS_SEP) + "(?P<args>.*?)"
                          + re.escape(DS_CALL_END), re.DOTALL)


def _all_matches(pattern: re.Pattern[str], text: str, partial: bool) -> list[re.Match[str]] | None:
    """Every match of `pattern`, or None when anything but whitespace lies outside them (`partial`: the
    text was cut, so what follows the last whole match is the cut call, dropped)."""
    matches = list(pattern.finditer(text))
    if partial:
        return matches
    if not matches or pattern.sub("", text).strip():
        return None
    return matches


def _json_calls(pattern: re.Pattern[str], doc: str) -> Decoder:
    """A decoder for formats whose calls each match `pattern`, with named groups `name` (or `id`, whose
    part before `:` less `functions.` is the name) and `args` (a JSON object)."""

    def decode(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
        matches = _all_matches(pattern, text, partial)
        if matches is None:
            return None
        calls = []
        for m in matches:
            groups = m.groupdict()
            call_id = (groups.get("id") or "").strip() or None
            name = (groups.get("name") or (call_id or "").split(":", 1)[0].removeprefix("functions.")).strip()
            args = _object(m.group("args").strip())
            if args is None or not name:
                return None
            calls.append(RawCall(name, args, call_id))
        return calls

    decode.__doc__ = doc
    return decode


_decode_deepseek_v3 = _json_calls(_DS_V3_CALL, "`CALL_BEGIN function SEP NAME\\n```json\\n{...}\\n``` CALL_END` "
                                  "(V3, R1-0528; markers `DS_*`).")
_decode_deepseek_v31 = _json_calls(_DS_V31_CALL, "`CALL_BEGIN NAME SEP {...} CALL_END` (V3.1; markers `DS_*`).")


_DSML_INVOKE = re.compile(f"<(?:{DSML})?" + r'invoke\s+name="([^"]+)"\s*>(.*?)' + f"</(?:{DSML})?invoke>", re.DOTALL)
_DSML_PARAM = re.compile(f"<(?:{DSML})?" + r'parameter\s+name="([^"]+)"\s+string="(true|false)"\s*>(.*?)'
                         + f"</(?:{DSML})?parameter>", re.DOTALL)


def _decode_dsml(text: str, ctx: ToolContext, partial: bool = False) -> list[RawCall] | None:
    """DeepSeek V3.2/V4 "DSML": `<\uff5cDSML\uff5cinvoke name="NAME">` holding `<\uff5cDSML\uff5cparameter name="K"
    string="true|false">V</\uff5cDSML\uff5cparameter>` tags (typed by the schema, else by `string`) or a JSON object."""
    matches = _all_matches(_DSML_INVOKE, text, partial)
    if matches is None:
        return None
    calls = []
    for m in matches:
        body = m.group(2).strip()
        args: dict[str, Any] | None
        if body.startswith("{"):
            args = _object(body)
        else:
            args = {}
            name = m.group(1).strip()
            for p in _DSML_PARAM.finditer(body):
                # The tool's schema decides the type when it has one (as vLLM's parser); else the tag's
                # `string` attribute: "true" keeps the text, "false" reads it as JSON.
                kind = ctx.param_type(name, p.group(1)) or ("string" if p.group(2) == "true" else None)
                args[p.group(1)] = _typed_value(p.group(3), kind)
            if _DSML_PARAM.sub("", body).strip():
                args = None
        if args is None:
            return None
        calls.append(RawCall(m.group(1).strip(), args))
    return calls


_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(?P<id>.*?)\s*<\|tool_call_argument_begin\|>(?P<args>.*?)"
                        r"<\|tool_call_end\|>", re.DOTALL)


_decode_kimi_k2 = _json_calls(_KIMI_CALL, "`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}"
                              "<|tool_call_end|>`: the id is the model's own and must come back unchanged in history.")


# ---------------------------------------------------------------------------------------- tool formats


@dataclass(frozen=True, slots=True)
class Region:
    """A call region: `start` ... `end` (None: to the end of the output). `lead`: the start counts only at
    the very start of the answer (a JSON or pythonic answer), and is itself part of the region's text."""

    start: str
    end: str | None = None
    lead: bool = False


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call format (see the module docstring). `inner`: the markers inside its regions
    (kept by the detokenizer with the regions' own). `ids`: how call ids are made (the model's own id
    when it writes one). Which markers are control tokens depends on the model's tokenizer: the registry
    tells the parser (`OutputParser.control`)."""

    name: str
    regions: tuple[Region, ...]
    decode: Decoder
    inner: tuple[str, ...] = ()
    ids: Callable[[], str] = openai_call_id
    needs_end: bool = False  # a region without its end marker (and not cut) is not a call
    models: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker of the format: what the detokenizer must keep when it is a special token."""
        out = [r.start for r in self.regions if not r.lead] + [r.end for r in self.regions if r.end]
        return tuple(dict.fromkeys([*out, *self.inner]))


_DS = (DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP)
_KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>")

FAMILIES: dict[str, ToolFormat] = {f.name: f for f in (
    ToolFormat("hermes", (Region("<tool_call>", "</tool_call>"),), _decode_hermes,
               models="Hermes 2/3, Qwen2.5, Qwen3 (instruct and thinking), QwQ, SmolLM2/3"),
    ToolFormat("qwen3_xml", (Region("<tool_call>", "</tool_call>"),), _decode_qwen3_xml,
               models="Qwen3-Coder, Qwen3.5"),
    ToolFormat("llama3_json", (Region("<|python_tag|>"), Region("{", lead=True)), _decode_llama3_json,
               models="Llama 3.1, 3.2, 3.3 (JSON tool calling)"),
    ToolFormat("llama4", (Region("<|python_start|>", "<|python_end|>"), Region("[", lead=True)),
               _decode_pythonic,
               models="Llama 4 Scout / Maverick (pythonic)"),
    ToolFormat("pythonic", (Region("[", lead=True),), _decode_pythonic,
               models="Llama 3.2 pythonic, Gemma 3, Granite, ToolACE"),
    ToolFormat("mistral", (Region("[TOOL_CALLS]"),), _decode_mistral, inner=("[ARGS]", "[CALL_ID]"),
               ids=mistral_call_id, models="Mistral Small 3.x, Mistral Large 2, Devstral, Magistral, Ministral"),
    ToolFormat("deepseek_v3", (Region(_DS[0], _DS[1]),), _decode_deepseek_v3, inner=_DS,
               models="DeepSeek V3, V3-0324, R1-0528"),
    ToolFormat("deepseek_v31", (Region(_DS[0], _DS[1]),), _decode_deepseek_v31, inner=_DS,
               models="DeepSeek V3.1, V3.1-Terminus"),
    # V3.2 writes its invokes in a `function_calls` block; V4 keeps the invoke / parameter grammar in a
    # `tool_calls` block (DeepSeek's encoding_dsv4.py `tool_calls_block_name`, vLLM's `deepseek_v4` parser).
    ToolFormat("deepseek_dsml", (Region(f"<{DSML}function_calls>", f"</{DSML}function_calls>"),
                                 Region(f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"),
                                 Region("<function_calls>", "</function_calls>")), _decode_dsml,
               models="DeepSeek V3.2, V4"),
    ToolFormat("kimi_k2", (Region(_KIMI[0], _KIMI[1]),), _decode_kimi_k2, inner=_KIMI, ids=lambda: "",
               models="Kimi K2, K2-Instruct-0905, K2-Thinking"),
    ToolFormat("glm45", (Region("<tool_call>", "</tool_call>"),), _decode_glm45,
               inner=("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"), needs_end=True,
               models="GLM-4.5, GLM-4.6, GLM-4.7"),
)}
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>")
# Tokens that end a generation whatever the model's configured EOS: gpt-oss ends a turn with `<|return|>`
# (an answer) or `<|call|>` (a tool call), and its tokenizer config names only the first.
END_MARKERS: dict[str, tuple[str, ...]] = {"harmony": ("<|return|>", "<|call|>")}
HARMONY_MODELS = "gpt-oss-20b, gpt-oss-120b"


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
)}  # harmony's thinking is its `analysis` channel: `HarmonyParser` reads it


def keep_markers(tool_parser: str | None, reasoning_parser: str | None) -> tuple[str, ...]:
    """The marker texts a model's detokenizer must keep (the rest of its special tokens are dropped)."""
    out: list[str] = []
    if tool_parser == "harmony" or reasoning_parser == "harmony":
        out += HARMONY_MARKERS
    elif tool_parser in FAMILIES:
        out += FAMILIES[tool_parser].markers
    if reasoning_parser in REASONING:
        out += REASONING[reasoning_parser].markers
    return tuple(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------- detection


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


def _from_template(template: str) -> ToolParserName | None:
    if "<|channel|>" in template:
        return "harmony"
    if "<|tool_calls_section_begin|>" in template:
        return "kimi_k2"
    if DSML in template:
        return "deepseek_dsml"
    if DS_CALLS_BEGIN in template:
        return "deepseek_v3" if "```json" in template else "deepseek_v31"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<arg_key>" in template:
        return "glm45"
    if "<function=" in template or "<parameter=" in template:
        return "qwen3_xml"
    if "<|python_start|>" in template:
        return "llama4"
    if "<|python_tag|>" in template or ("<|eot_id|>" in template and '"parameters"' in template):
        return "llama3_json"
    if "<tool_call>" in template:
        return "hermes"
    return None


# A tokenizer's added tokens -> the family they mark, most specific first; `shared`: other families whose
# markers these are too, so that the tokenizer alone leaves a guess.
_TOKEN_RULES: tuple[tuple[Callable[[set[str]], bool], ToolParserName, str, tuple[str, ...]], ...] = (
    (lambda t: {"<|channel|>", "<|constrain|>"} <= t, "harmony", "<|channel|>", ()),
    (lambda t: "<|tool_calls_section_begin|>" in t, "kimi_k2", "<|tool_calls_section_begin|>", ()),
    (lambda t: any(DSML in x for x in t), "deepseek_dsml", DSML, ()),
    (lambda t: DS_CALLS_BEGIN in t, "deepseek_v3", DS_CALLS_BEGIN, ("deepseek_v31",)),
    (lambda t: "[TOOL_CALLS]" in t, "mistral", "[TOOL_CALLS]", ()),
    (lambda t: "<arg_key>" in t, "glm45", "<arg_key>", ()),
    (lambda t: "<|python_start|>" in t, "llama4", "<|python_start|>", ()),
    (lambda t: "<|python_tag|>" in t, "llama3_json", "<|python_tag|>", ()),
    (lambda t: "<tool_call>" in t, "hermes", "<tool_call>", ("qwen3_xml",)),
)


def detect_tool_format(template: str, tokens: Iterable[str] = ()) -> Detection:
    """The tool format a model speaks: from its chat template first (what the model is prompted with), then
    from its tokenizer's added tokens (a model folder may ship no template: DeepSeek V3.2 and V4 ship none),
    most specific first; hermes when neither has a marker."""
    family = _from_template(template)
    if family is not None:
        return Detection(family, "template", "its chat template writes the format's markers")
    added = set(tokens)
    for matches, name, marker, shared in _TOKEN_RULES:
        if matches(added):
            why = f"its tokenizer has the token {marker!r}"
            if shared:
                why += f", which {', '.join(shared)} also use{'s' if len(shared) == 1 else ''}"
            return Detection(name, "tokenizer", why, guess=bool(shared))
    return Detection("hermes", "none", "no tool-call marker in its chat template or its tokenizer", guess=True)


def detect_family(template: str, special_tokens: Iterable[str] = ()) -> ToolParserName:
    """The tool format a chat template (and tokenizer) speaks (`detect_tool_format`); hermes by default."""
    return detect_tool_format(template, special_tokens).family


def detect_reasoning(template: str, family: str | None) -> ReasoningParserName | None:
    """The thinking section a chat template speaks of (None: it has none)."""
    if family == "harmony":
        return "harmony"
    if "[THINK]" in template:
        return "mistral"
    if "<think>" in template:
        return "qwen3"
    return None


# ------------------------------------------------------------------------------------------- the engine


@dataclass(slots=True)
class Piece:
    """A piece of one choice's output, in order: reasoning or content text, or a whole tool call."""

    kind: Literal["reasoning", "content", "call"]
    text: str = ""
    call: ParsedToolCall | None = None


def _partial_tail(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of one of `markers` (held back). Only
    where the marker's first character occurs in the last len(marker)-1 characters is compared: per
    token, a `find` or two instead of a slice per prefix length."""
    best = 0
    n = len(text)
    for m in markers:
        j = text.find(m[0], max(0, n - len(m) + 1))
        while j != -1 and n - j > best:
            if m.startswith(text[j:]):
                best = n - j
                break
            j = text.find(m[0], j + 1)
    return best


def _strip_markers(text: str, markers: Iterable[str]) -> str:
    for m in markers:
        text = text.replace(m, "")
    return text


def _add(out: list[Piece], kind: Literal["reasoning", "content"], text: str) -> None:
    if not text:
        return
    if out and out[-1].kind == kind:
        out[-1].text += text
    else:
        out.append(Piece(kind, text))


class _Collector:
    """Text gathered until one of `ends` appears (none: until the output ends). Each `feed` costs O(new
    text): the search runs over the new text plus the few characters before it that could start an end
    marker, and the text is joined once, when an end is found."""

    __slots__ = ("_k", "_parts", "_tail", "ends")

    def __init__(self, ends: tuple[str, ...]) -> None:
        self.ends = ends
        self._k = max(map(len, ends), default=1) - 1
        self._parts: list[str] = []
        self._tail = ""

    def feed(self, text: str) -> tuple[str, str, str] | None:
        """`(text before the end, the end marker, what follows it)` once an end appears, else None."""
        combined = self._tail + text
        best, which = -1, ""
        for e in self.ends:
            i = combined.find(e)
            if i != -1 and (best == -1 or i < best):
                best, which = i, e
        if best == -1:
            self._parts.append(text)
            self._tail = combined[-self._k:] if self._k else ""
            return None
        joined = "".join(self._parts)
        body = joined[: len(joined) - len(self._tail)] + combined[:best]
        self._parts, self._tail = [], ""
        return body, which, combined[best + len(which):]

    def take(self) -> str:
        """Everything gathered (the output ended before an end marker)."""
        text = "".join(self._parts)
        self._parts, self._tail = [], ""
        return text


class OutputParser:
    """One choice's output -> `Piece`s (module docstring). `tools`: the active tool format (None: no tool
    parsing, e.g. a forced call whose guided output the caller reads itself); `reasoning`: the thinking
    section's format; `prompt`: the rendered prompt, which tells whether the output starts inside a
    thinking section.

    States: `lead` (nothing decisive yet: whitespace, a partial start tag), `think_lead` (inside thinking,
    a start tag the model writes anyway may still come and is dropped), `reasoning`, `content`, `region`
    (inside a call region, held until its end marker or the end of the output)."""

    def __init__(self, tools: ToolFormat | None, reasoning: ReasoningFormat | None, ctx: ToolContext | None = None,
                 prompt: str | None = None, control: Iterable[str] = ()) -> None:
        self.tools = tools
        self.control = tuple(control)
        self.reasoning = reasoning
        self.ctx = ctx or ToolContext()
        self._reasoning: list[str] = []
        self.calls = 0
        self._buf = ""
        self._collector = _Collector(())  # a call region's text, until its end marker
        self._raw = 0  # characters pushed so far
        self._think_end: int | None = None  # where in them the thinking section ended (after its end tag)
        self._think_done = False
        self._region: Region | None = None
        self._ws = ""  # content whitespace held back: dropped before a region and at the end
        self._region_ws = ""
        self._content_seen = False
        self._state = "think_lead" if reasoning is not None and reasoning.starts_inside(prompt) else "lead"
        self._starts = tuple(r for r in tools.regions if not r.lead) if tools else ()
        self._start_texts = tuple(r.start for r in self._starts)
        self._lead_regions = tuple(r for r in tools.regions if r.lead) if tools else ()

    @property
    def reasoning_text(self) -> str:
        """All the reasoning so far (for usage)."""
        return "".join(self._reasoning)

    @property
    def undecided(self) -> bool:
        """Nothing decisive seen yet: whitespace, or a partial thinking start tag."""
        return self._state == "lead" and self.reasoning is not None and not self._think_done

    @property
    def thinking(self) -> bool:
        """Inside the thinking section (its end not seen yet)."""
        return self._state in ("reasoning", "think_lead")

    @property
    def thinking_chars(self) -> int:
        """How many of the characters pushed so far are the thinking section, tags included."""
        if self._think_end is not None:
            return self._think_end
        return self._raw if self.thinking else 0

    def push(self, text: str) -> list[Piece]:
        """The pieces of the output's next text that are safe to send now."""
        self._raw += len(text)
        out: list[Piece] = []
        self._run(self._buf + text, out, final=False)
        return out

    def finish(self, cut: bool = False) -> list[Piece]:
        """The end of the output (`cut`: by max_tokens): what was held back, as what it turned out to be."""
        out: list[Piece] = []
        self._run(self._buf, out, final=True)
        if self._state == "region":
            self._close_region(self._collector.take(), out, terminated=False, cut=cut)
            self._state = "content"
        self._ws = ""  # trailing whitespace of the answer: layout
        return out

    def _run(self, buf: str, out: list[Piece], final: bool) -> None:
        self._buf = ""
        while buf and not self._buf:
            state = self._state
            if state == "lead":
                buf = self._lead(buf, out, final)
            elif state == "region":
                buf = self._in_region(buf, out)
            elif state == "content":
                buf = self._content(buf, out, final)
            else:
                buf = self._think(buf, out, final)

    def _hold(self, text: str) -> str:
        self._buf = text
        return ""

    def _lead(self, buf: str, out: list[Piece], final: bool) -> str:
        stripped = buf.lstrip()
        r = None if self._think_done else self.reasoning
        if r is not None:
            if not final and (not stripped or r.start.startswith(stripped)):
                return self._hold(buf)
            if stripped.startswith(r.start):
                self._state = "reasoning"
                return stripped[len(r.start):].removeprefix("\n")
        for region in self._lead_regions:
            if stripped.startswith(region.start):
                self._enter(region)
                return stripped
        if not stripped and not final and (self._lead_regions or self._think_done):
            return self._hold(buf)
        self._state = "content"
        if self.tools is not None:
            return stripped
        return buf.lstrip("\n") if self._think_done else buf  # blank lines after `</think>` are layout

    def _think(self, buf: str, out: list[Piece], final: bool) -> str:
        r = self.reasoning
        assert r is not None
        if self._state == "think_lead":
            stripped = buf.lstrip()
            if not final and (not stripped or r.start.startswith(stripped)):
                return self._hold(buf)
            self._state = "reasoning"
            if stripped.startswith(r.start):
                buf = stripped[len(r.start):].removeprefix("\n")
        i = buf.find(r.end)
        if i == -1:
            keep = 0 if final else _partial_tail(buf, (r.end,))
            self._emit_reasoning(buf[: len(buf) - keep], out)
            return self._hold(buf[len(buf) - keep:]) if keep else ""
        self._emit_reasoning(buf[:i], out)
        rest = buf[i + len(r.end):]
        self._think_end = self._raw - len(rest)
        self._state, self._think_done = "lead", True
        return rest

    def _emit_reasoning(self, text: str, out: list[Piece]) -> None:
        self._reasoning.append(text)
        _add(out, "reasoning", text)

    def _emit_content(self, text: str, out: list[Piece]) -> None:
        if self.tools is None:
            _add(out, "content", text)
            return
        if not self._content_seen:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        _add(out, "content", self._ws + body)
        self._ws = text[len(body):]
        self._content_seen = True

    def _content(self, buf: str, out: list[Piece], final: bool) -> str:
        if not self._starts:
            self._emit_content(buf, out)
            return ""
        best, region = -1, None
        for r in self._starts:
            i = buf.find(r.start)
            if i != -1 and (best == -1 or i < best):
                best, region = i, r
        if region is None:
            keep = 0 if final else _partial_tail(buf, self._start_texts)
            self._emit_content(buf[: len(buf) - keep], out)
            return self._hold(buf[len(buf) - keep:]) if keep else ""
        self._emit_content(buf[:best], out)
        self._region_ws, self._ws = self._ws, ""  # whitespace before a region is layout (if it is a call)
        self._enter(region)
        return buf[best + len(region.start):]

    def _enter(self, region: Region) -> None:
        self._state, self._region = "region", region
        self._collector = _Collector((region.end,) if region.end else ())

    def _in_region(self, buf: str, out: list[Piece]) -> str:
        done = self._collector.feed(buf)
        if done is None:
            return ""  # still inside (a region without an end marker runs to the end of the output)
        body, _, rest = done
        self._close_region(body, out, terminated=True)
        self._state = "content"
        return rest

    def _close_region(self, body: str, out: list[Piece], terminated: bool, cut: bool = False) -> None:
        region = self._region
        assert region is not None and self.tools is not None
        if len(body) > MAX_REGION_CHARS or (not terminated and not cut and region.end and self.tools.needs_end):
            raw = None
        else:  # a region cut by max_tokens keeps only its whole calls
            raw = self.tools.decode(body, self.ctx, cut and not terminated)
        if raw is not None and self.ctx.allowed is not None and any(c.name not in self.ctx.allowed for c in raw):
            raw = None  # a call to a function the request did not offer is not a tool call
        self._region = None
        if raw is None:
            shown = ("" if region.lead else region.start) + body + (region.end or "" if terminated else "")
            self._ws = self._region_ws  # the whitespace before it is text again
            self._emit_content(_strip_markers(shown, self.control), out)
            self._ws = ""
            return
        for c in raw:
            call_id = c.id or self.tools.ids() or f"functions.{c.name}:{self.calls}"
            args = json.dumps(c.arguments, ensure_ascii=False)
            out.append(Piece("call", call=ParsedToolCall(c.name, args, call_id)))
            self.calls += 1
        self._ws = ""


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
        self._header = _Collector(("<|message|>",))
        self._call = _Collector(_HARMONY_ENDS)
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
                _add(out, "content", _strip_markers(held, HARMONY_MARKERS).strip())
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
                keep = 0 if final else _partial_tail(buf, _HARMONY_ENDS)
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
            _add(out, "reasoning", text)
        else:
            _add(out, "content", text)

    def _end_message(self, body: str, out: list[Piece]) -> None:
        """A message ended: a call's body becomes the call (or content, if it is not one)."""
        if self._channel == "analysis":
            self._think_end = self._raw - len(self._buf)
        if self._is_call():
            name = self._recipient.removeprefix("functions.")
            args = _object(body.strip()) if len(body) <= MAX_REGION_CHARS else None
            allowed = self.ctx.allowed is None or name in self.ctx.allowed
            if args is not None and allowed and self.tools_active and self._recipient.startswith("functions."):
                out.append(Piece("call", call=ParsedToolCall(name, json.dumps(args, ensure_ascii=False))))
                self.calls += 1
            else:
                _add(out, "content", body)
        self._state, self._channel, self._recipient = "header", "", ""


Parser = OutputParser | HarmonyParser


def make_parser(tool_parser: str | None, reasoning_parser: str | None, *, tools_active: bool,
                ctx: ToolContext | None = None, prompt: str | None = None, control: Iterable[str] = ()
                ) -> Parser | None:
    """The parser of one choice's output, or None when the output is plain content (no tool format is
    active and the model has no thinking section). `tools_active`: the request offered tools and lets the
    model call them (`tool_choice` auto); `control`: the family's markers that are special tokens of the
    model's tokenizer."""
    if tool_parser == "harmony" or reasoning_parser == "harmony":
        return HarmonyParser(tools_active, ctx)
    tools = FAMILIES[tool_parser] if tools_active and tool_parser in FAMILIES else None
    reasoning = REASONING.get(reasoning_parser) if reasoning_parser else None
    if tools is None and reasoning is None:
        return None
    return OutputParser(tools, reasoning, ctx, prompt, control)

"""`/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API over the same chat pipeline.

A Messages request becomes a chat request (`chat_request`), as the Responses API's does; from there it is
`ChatService.prepare` (template, tokens, tool plan, guides), the shared generation path and one choice's
`Delta`s from `PreparedChat.output()` (the model family's reasoning and tool-call parsers). Only the edges
are Anthropic's:

* **In**: `system` (a string or text blocks) is the system message, less Claude Code's per-request
  `x-anthropic-billing-header: ...` line (`--keep-billing-header` keeps it), whose changing hash would otherwise
  make every turn's prompt differ from its first line and defeat every prompt cache; and so is a `system`-role
  message inside `messages` (Claude Code sends one under a model name it does not know): kept where it stands
  for a template that renders system messages there, folded into the system prompt for one that takes only one
  (`chat.place_system_messages`, decided by a probe render of the template). A user turn's `text` blocks are its
  content; each `tool_result` block (string or text-block content, `is_error` prefixing "Error: ") is a `tool`
  message answering its `tool_use_id`, which must be an id an earlier assistant turn issued. An assistant turn's
  `text` blocks are its content, `tool_use` blocks its tool calls (`input` as the call's arguments), `thinking`
  blocks its reasoning (templates read it as `reasoning_content` / `thinking`); `redacted_thinking` is opaque
  and dropped. A user turn's `image` blocks (base64 or url sources) are chat `image_url` parts for a model that
  takes images; to one that does not, a 400 naming the block, as for `document` and unknown block types.
  `cache_control` anywhere is accepted and ignored. `tools` (`name`, `description`, `input_schema`; Anthropic's
  server tools are a 400) are function tools, except those with `defer_loading` (left out of the prompt, as
  Anthropic keeps them out of the context until a tool search loads them); `tool_choice` `auto` / `any` / `tool`
  (+ `name`) / `none` are chat's `auto` / `required` / a named function / `none` (forced calls are guided),
  `disable_parallel_tool_use` is `parallel_tool_calls: false`. `stop_sequences` are stop strings,
  `metadata.user_id` the `user` (the rest of `metadata` is accepted), `temperature`, `top_p`, `top_k`,
  `max_tokens` as in chat (current SDKs no longer send the sampling fields; older clients do). * **Reasoning
  controls** (`services.effort`, set only where the model's template reads them): `thinking` `{type: enabled,
  budget_tokens}`, `adaptive` or `between_tools` (no budget) switch thinking on, `disabled` off
  (`enable_thinking` for Qwen3-style templates, `thinking` for DeepSeek-V3.1's); `output_config.effort` (low /
  medium / high / max) is gpt-oss's `reasoning_effort`, and switches thinking when `thinking` does not.
  `thinking.display` `omitted` and `updates` send thinking blocks with their signature and no text; other
  displays (`summarized`) send the text. * **Structured output**: `output_config.format` (or the beta's
  top-level `output_format`) `{type: json_schema, schema}` is chat's `response_format` json_schema: the answer's
  text block follows the schema, plain and streamed, through the same guide; a schema that cannot be compiled,
  or a backend without guided decoding, is a 400 naming the field. A `strict: true` tool's `input_schema` is
  checked as that guide too (a 400 for what cannot be compiled); a forced call of it is guided by it, as every
  forced call is; under `tool_choice` auto the model's calls are parsed, not constrained, as on chat. *
  **Context editing**: `context_management.edits` (`clear_thinking_20251015`, `clear_tool_uses_20250919`) are
  applied to the history before the prompt is rendered and reported in the answer's
  `context_management.applied_edits` (`services.context_edits`); count_tokens counts the edited prompt.
* **Thinking budget**: enforced by generating in two phases (`services.generation.budgeted_chunks`, the
  shared generation core; chat's `thinking_token_budget` is the same knob). Phase 1 generates
  `budget_tokens` minus the tokens of the family's end-of-thinking text (`ReasoningFormat.close`, e.g.
  Qwen3's and DeepSeek-R1's "\n</think>\n\n"). Ended by length with the thinking still open (the model's
  reasoning parser says so), the gateway appends that text and phase 2 generates the answer, up to what is
  left of `max_tokens`, from the prompt, phase 1's output and the end text; ended by length with the
  thinking closed, phase 2 just continues; ended by itself, there is no phase 2. So the thinking, its end
  tag included, is at most `budget_tokens` tokens and an answer follows it. The client sees one answer
  (thinking block, then text / tool_use blocks), streamed or plain; `output_tokens` counts both phases'
  generated tokens and the injected end text's tokens (`max_tokens` bounds all of them); `stop_reason` is
  the last phase's. A family whose section cannot be closed from outside (harmony's channels), or a
  budget too small to hold the end text, is capped as a fallback: past the budget the thinking is
  generated (and counted) but not sent.
* **Out**: a `message` (`msg_<request id>`) with `thinking` blocks (a `signature`: an opaque digest of
  the thinking, nothing a client can verify), `text` blocks and `tool_use` blocks (`toolu_...` ids from
  the parser's `call_...` ids; a family that writes its own ids, Kimi K2's, keeps them), in the order
  generated; `stop_reason` `end_turn`, `max_tokens`, `stop_sequence` (with `stop_sequence` set to the
  request's sequence that matched) or `tool_use`; `usage` as Anthropic splits the prompt: `cache_read_input_tokens`
  the prompt tokens the backend reported reading from its KV cache (`GenerationChunk.cached_tokens`; 0 where
  the backend cannot say), `input_tokens` the rest of the prompt (Anthropic's `input_tokens` excludes the
  cached ones: the three add up to the prompt), `cache_creation_input_tokens` 0 (the engines keep every
  prefilled block on their own, at no charge; nothing here is the paid write at a `cache_control` breakpoint
  that field counts), `output_tokens`. The plain answer and the streamed one are built by the same
  `BlockBuilder` from the same deltas, so they are one answer.
* **Streaming**: Anthropic's event grammar with `event:` lines: `message_start` and a `ping`, then per
  block `content_block_start`, its `content_block_delta`s (`thinking_delta` then one `signature_delta`,
  `text_delta`, `input_json_delta`), `content_block_stop`; then `message_delta` (stop reason, the final usage,
  every count: `message_start`'s cache figure is the backend's as of the first tokens) and
  `message_stop`. A stream with nothing to send for `PING_INTERVAL_S` gets a `ping` (`PING`, written by
  the HTTP edge's stream writer, `http.sse.coalesced`). An error after the stream began is an `error` event
  in Anthropic's shape. Per token a plain answer (no tools, no reasoning parser) costs what chat's does: its
  text goes straight to a `text_delta` whose bytes are built from a per-block prefix, with no parser pass.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from pydantic import ValidationError

from openai_api.errors import GatewayError, InvalidRequestError, anthropic_error_body
from openai_api.schemas.anthropic import CountTokensRequest, MessagesRequest
from openai_api.schemas.openai import ChatCompletionRequest, ChatMessage
from openai_api.services.chat import ChatService, PreparedChat, count_tokens
from openai_api.services.context_edits import Applied, apply_edits, needs_prompt_tokens, parse_edits
from openai_api.services.effort import EFFORT_LEVELS, reasoning_kwargs
from openai_api.services.generation import TextEvent, sequence_events
from openai_api.services.guides import schema_guide
from openai_api.services.images import chat_image_sources
from openai_api.services.output import ChoiceOutput, Delta
from openai_api.services.registry import LLMRuntime
from openai_api.services.streaming import sse_stream
from openai_api.services.tools import plan_tools

# Seconds without an event after which a stream sends a `ping` (Anthropic keeps quiet streams alive so;
# a tool call's markup is held back until it is whole, which can be many seconds of silence).
PING_INTERVAL_S = 10.0
PING = b'event: ping\ndata: {"type":"ping"}\n\n'
# Block types Anthropic defines that this gateway cannot take (a 400 that says so, not "unknown").
_UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "server_tool_use", "web_search_tool_result",
                       "container_upload", "mcp_tool_use", "mcp_tool_result")
# `thinking.display` values that send thinking blocks without their text: `omitted`, and `updates` (only the
# progress notes a Claude model writes between tool calls are shown, which a self-hosted model has none of).
# Any other display (`summarized`, the default; newer ones) sends the text.
HIDDEN_THINKING = ("omitted", "updates")
# Chat request fields by the Messages field they came from, for error messages.
_PARAM_NAMES = {"stop": "stop_sequences", "user": "metadata.user_id", "tool_choice": "tool_choice",
                "chat_template_kwargs": "thinking", "thinking_token_budget": "thinking.budget_tokens"}


def _bad(message: str, param: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of content blocks.", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{where}[{j}]: a content block must be an object with a string 'type'.", f"{where}[{j}]")
    return content


def _text(block: dict[str, Any], where: str, field: str = "text") -> str:
    value = block.get(field)
    if not isinstance(value, str):
        raise _bad(f"{where}.{field}: must be a string.", f"{where}.{field}")
    return value


def _refuse_block(kind: str, where: str, model: str, allowed: str) -> InvalidRequestError:
    if kind == "image":
        return _bad(f"{where}: image content blocks are not supported: the model {model!r} takes no images on this "
                    "gateway (its chat path accepts text only).", where, "unsupported_content")
    if kind in _UNSUPPORTED_BLOCKS:
        return _bad(f"{where}: {kind!r} content blocks are not supported by this gateway; {allowed}.", where,
                    "unsupported_content")
    return _bad(f"{where}.type: unknown content block type {kind!r}; {allowed}.", f"{where}.type",
                "unsupported_content")


# Claude Code's first system block, `x-anthropic-billing-header: cc_version=...; cch=<hash>;`: Anthropic's
# attribution line, whose hash changes with every request, so a prompt that keeps it never shares a prefix
# with the previous turn and no prompt cache can hit (vLLM #36829 and SGLang #21064 strip it too).
BILLING_HEADER = "x-anthropic-billing-header:"
_BILLING_LINES = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)


def strip_billing_header(text: str) -> str:
    """`text` without the lines that are Claude Code's billing header (nearly always: `text` unchanged)."""
    return _BILLING_LINES.sub("", text) if BILLING_HEADER in text else text


def system_text(system: Any, field: str = "system", strip_billing: bool = True) -> str:
    """A system prompt (top-level `system`, or a `system`-role message's content): a string or text blocks
    (their `cache_control` ignored), joined by a blank line; with `strip_billing`, Claude Code's billing
    header lines dropped (a block left empty by that is dropped whole)."""
    if isinstance(system, str):
        return strip_billing_header(system) if strip_billing else system
    if not isinstance(system, list):
        raise _bad(f"{field}: must be a string or a list of text blocks.", field)
    parts = []
    for j, block in enumerate(system):
        where = f"{field}[{j}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"{where}: system blocks must be text blocks.", f"{where}.type", "unsupported_content")
        text = _text(block, where)
        if strip_billing:
            text = strip_billing_header(text)
            if not text:
                continue
        parts.append(text)
    return "\n\n".join(parts)


def _tool_result_text(block: dict[str, Any], where: str, model: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            pwhere = f"{where}.content[{k}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise _refuse_block(str(kind), pwhere, model, "a tool_result holds a string or text blocks")
            parts.append(_text(part, pwhere))
        text = "\n\n".join(parts)
    else:
        raise _bad(f"{where}.content: must be a string or a list of text blocks.", f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error: must be a boolean.", f"{where}.is_error")
    return f"Error: {text}" if is_error else text


def chat_messages(req: CountTokensRequest, images: list[str] | None = None, strip_billing: bool = True
                  ) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages (see the module docstring); the path of each image block is
    appended to `images`. `strip_billing`: Claude Code's billing header left out of system text."""
    images = [] if images is None else images
    out: list[dict[str, Any]] = []
    if req.system is not None:
        text = system_text(req.system, strip_billing=strip_billing)
        if text:
            out.append({"role": "system", "content": text})
    issued: set[str] = set()
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise _bad(f"{where}.role: must be 'user', 'assistant' or 'system'.", f"{where}.role")
        if "content" not in m:
            raise _bad(f"{where}.content: field required.", f"{where}.content")
        if role == "system":  # where it stands, or folded into the system prompt (`chat.place_system_messages`)
            out.append({"role": "system", "content": system_text(m["content"], f"{where}.content", strip_billing)})
            continue
        blocks = _blocks(m["content"], f"{where}.content")
        if role == "assistant":
            out.append(_assistant(blocks, f"{where}.content", issued, req.model))
        else:
            out += _user(blocks, f"{where}.content", issued, req.model, images)
    return out


def _assistant(blocks: list[dict[str, Any]], where: str, issued: set[str], model: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        bwhere, kind = f"{where}[{j}]", b["type"]
        if kind == "text":
            texts.append(_text(b, bwhere))
        elif kind == "thinking":
            thinking.append(_text(b, bwhere, "thinking"))
        elif kind == "redacted_thinking":
            continue  # encrypted by its issuer: nothing a template could read
        elif kind == "tool_use":
            call_id, name, args = b.get("id"), b.get("name"), b.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{bwhere}.id: a tool_use block needs a string id.", f"{bwhere}.id")
            if not isinstance(name, str) or not name:
                raise _bad(f"{bwhere}.name: a tool_use block needs a string name.", f"{bwhere}.name")
            if not isinstance(args, dict):
                raise _bad(f"{bwhere}.input: must be an object.", f"{bwhere}.input")
            issued.add(call_id)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise _refuse_block(kind, bwhere, model, "an assistant turn holds text, thinking, redacted_thinking and "
                                "tool_use blocks")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def _named_block(err: InvalidRequestError, req: CountTokensRequest,
                 chat_req: ChatCompletionRequest) -> InvalidRequestError:
    """A refusal of one of chat's image parts (the fetcher's, or an adapter's image cap) named as the client's
    own image block: the k-th image part of the chat request is the k-th image block of the Messages request
    (system and tool_result blocks shift chat's indices, never the order). Anthropic's error carries no
    `param`, so the block's path leads the message as in this module's other 400s. Other errors unchanged."""
    chat_params = [s.param for s in chat_image_sources(chat_req.messages)]
    if err.param not in chat_params:
        return err
    blocks: list[str] = []
    chat_messages(req, blocks)
    path = blocks[chat_params.index(err.param)]
    return InvalidRequestError(f"{path}: {err.message}", param=path, code=err.code)


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An image block as chat's `image_url` part: a base64 source as a data URL, a url source as it is."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict) and isinstance(source.get("data"), str) \
            and isinstance(source.get("media_type"), str):
        return {"type": "image_url", "image_url": {"url": f"data:{source['media_type']};base64,{source['data']}"}}
    if kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise _bad(f"{where}.source: an image source is {{type: base64, media_type, data}} or {{type: url, url}}.",
               f"{where}.source", "unsupported_content")


def _user(blocks: list[dict[str, Any]], where: str, issued: set[str], model: str,
          images: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[Any] = []  # strings, or chat content parts once an image is among them
    for j, b in enumerate(blocks):
        bwhere, kind = f"{where}[{j}]", b["type"]
        if kind == "text":
            texts.append(_text(b, bwhere))
        elif kind == "image":
            texts.append(_image_part(b, bwhere))
            images.append(bwhere)
        elif kind == "tool_result":
            call_id = b.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in issued:
                raise _bad(f"{bwhere}.tool_use_id: no earlier assistant turn has a tool_use block with id "
                           f"{call_id!r}; a tool_result must answer a tool_use.", f"{bwhere}.tool_use_id")
            if texts:  # text before a result stays before it
                out.append({"role": "user", "content": _user_content(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": call_id, "content": _tool_result_text(b, bwhere, model)})
        else:
            raise _refuse_block(kind, bwhere, model, "a user turn holds text and tool_result blocks")
    if texts or not out:
        out.append({"role": "user", "content": _user_content(texts)})
    return out


def _user_content(items: list[Any]) -> Any:
    """Text alone is one string; with images, chat content parts in order."""
    if all(isinstance(i, str) for i in items):
        return "".join(items)
    return [{"type": "text", "text": i} if isinstance(i, str) else i for i in items]


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise _bad(f"{where}: a tool must be an object.", where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _bad(f"{where}.type: Anthropic's server tools ({kind!r}) are not available here; only custom tools "
                       "(name, description, input_schema) are.", f"{where}.type", "unsupported_parameter")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name: field required.", f"{where}.name")
        if not isinstance(schema, dict):
            raise _bad(f"{where}.input_schema: an object (a JSON Schema) is required.", f"{where}.input_schema")
        if tool.get("defer_loading") is True:
            continue  # Anthropic's deferred tool: not in the model's context until a tool search loads it
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        if tool.get("strict") is True:  # checked as a guide now: a forced call of it is guided by it
            schema_guide(schema, f"{where}.input_schema")
            fn["strict"] = True
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """`tool_choice` as chat's `tool_choice` and `parallel_tool_calls`."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("tool_choice.disable_parallel_tool_use: must be a boolean.", "tool_choice.disable_parallel_tool_use")
    parallel_calls = None if parallel is None else not parallel
    if kind == "auto":
        return "auto", parallel_calls
    if kind == "any":
        return "required", parallel_calls
    if kind == "none":
        return "none", None
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice.name: a tool choice of type 'tool' names the tool.", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel_calls
    raise _bad("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'.", "tool_choice.type")


def thinking_budget(req: CountTokensRequest) -> tuple[int | None, bool | None]:
    """`thinking` as (the budget in tokens, or None; the template's `enable_thinking`, or None: unset).
    `adaptive` and `between_tools` (the model decides how much to think) are thinking with no budget."""
    thinking = req.thinking
    if thinking is None:
        return None, None
    kind = thinking.get("type")
    if kind == "disabled":
        return None, False
    display = thinking.get("display")
    if display is not None and not isinstance(display, str):
        raise _bad("thinking.display: must be a string ('summarized', 'omitted', 'updates').", "thinking.display")
    if kind in ("adaptive", "between_tools"):
        return None, True
    if kind != "enabled":
        raise _bad("thinking.type: must be 'enabled', 'adaptive', 'between_tools' or 'disabled'.", "thinking.type")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise _bad("thinking.budget_tokens: a positive integer is required with thinking enabled.",
                   "thinking.budget_tokens")
    max_tokens = getattr(req, "max_tokens", None)
    if max_tokens is not None and budget >= max_tokens:
        raise _bad(f"max_tokens ({max_tokens}) must be greater than thinking.budget_tokens ({budget}): the thinking "
                   "counts against max_tokens, and the answer needs room after it.", "thinking.budget_tokens")
    return budget, True


# The chat field a structured output travels in, as the client named it.
_FORMAT_PARAM = "response_format.json_schema.schema"


def output_format(req: CountTokensRequest) -> dict[str, Any] | None:
    """`output_config.format` (or the beta's top-level `output_format`) `{type: json_schema, schema}` as
    chat's `response_format`: the same guide chat enforces, its schema checked (bounded, compilable) here."""
    config = (req.output_config or {}).get("format")
    beta = (req.model_extra or {}).get("output_format")
    if config is not None and beta is not None:
        raise _bad("output_format: give the format once, in output_config.format.", "output_format")
    fmt, where = (config, "output_config.format") if config is not None else (beta, "output_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad(f"{where}.type: must be 'json_schema'.", f"{where}.type")
    if "schema" not in fmt:
        raise _bad(f"{where}.schema: a JSON schema is required.", f"{where}.schema")
    schema_guide(fmt["schema"], f"{where}.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def _format_error(err: InvalidRequestError, req: CountTokensRequest) -> InvalidRequestError:
    """A refusal of the structured output's guide (a backend without guided decoding) named by the client's
    own field rather than chat's."""
    if err.param != _FORMAT_PARAM:
        return err
    where = "output_config.format.schema" if (req.output_config or {}).get("format") is not None \
        else "output_format.schema"
    return InvalidRequestError(err.message.replace(_FORMAT_PARAM, where), param=where, code=err.code)


def output_effort(config: dict[str, Any] | None) -> str | None:
    """`output_config.effort` (Anthropic's low / medium / high / max; OpenAI's names are taken too), checked."""
    effort = (config or {}).get("effort")
    if effort is not None and effort not in EFFORT_LEVELS:
        raise _bad("output_config.effort: must be 'low', 'medium', 'high' or 'max'.", "output_config.effort")
    return effort


def anthropic_call_id(call_id: str) -> str:
    """Anthropic's `toolu_` prefix on the parser's `call_` ids; an id the model wrote itself stays as it is."""
    return "toolu_" + call_id.removeprefix("call_") if call_id.startswith("call_") else call_id


def signature(thinking: str) -> str:
    """An opaque `signature` for a thinking block (Anthropic's are encrypted; clients only pass them back)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def _event(kind: bytes, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def error_event(err: GatewayError) -> bytes:
    """An error after the stream began, as Anthropic's streams carry it."""
    return _event(b"error", anthropic_error_body(err))


class BlockBuilder:
    """Deltas -> Anthropic content blocks, and (`stream`) the events that build them, in order.

    One block is open at a time; a new kind of delta closes it and opens the next, so blocks keep the order
    they were generated in. Text that is only whitespace does not open a text block until more text follows
    (the blank between a thinking section and a tool call is no answer): plain and streamed answers drop it
    alike. Thinking past `budget` tokens (counted by the `ChoiceOutput`) is not sent."""

    def __init__(self, stream: bool, omit_thinking: bool = False) -> None:
        self.stream = stream
        self.omit_thinking = omit_thinking  # `thinking.display: omitted`: the blocks, without their text
        self.blocks: list[dict[str, Any]] = []
        self.calls = 0
        self._open: str | None = None
        self._parts: list[str] = []
        self._blank = ""
        self._prefix = b""  # the open block's content_block_delta event up to its delta's type

    def text(self, text: str) -> list[bytes]:
        """`push` of one content delta; in an open text block (every token after the first) one event's bytes."""
        if self._open == "text" and text:
            self._parts.append(text)
            if not self.stream:
                return []
            return [self._prefix + b'"text_delta","text":' + orjson.dumps(text) + b"}}\n\n"]
        return self.push([Delta("content", text)]) if text else []

    def push(self, deltas: list[Delta]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if d.kind == "reasoning":
                if not d.text:
                    continue
                if self._open != "thinking":
                    self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)
                if self.omit_thinking:
                    continue
                self._parts.append(d.text)
                if self.stream:
                    out.append(self._prefix + b'"thinking_delta","thinking":' + orjson.dumps(d.text) + b"}}\n\n")
            elif d.kind == "content":
                if self._open != "text":
                    pending = self._blank + d.text
                    if not pending.strip():
                        self._blank = pending
                        continue
                    text = pending.lstrip()
                    self._start("text", {"type": "text", "text": ""}, out)
                else:
                    text = d.text
                self._parts.append(text)
                if self.stream:
                    out.append(self._prefix + b'"text_delta","text":' + orjson.dumps(text) + b"}}\n\n")
            elif d.kind == "call":
                self.calls += 1
                self._start("tool_use", {"type": "tool_use", "id": anthropic_call_id(d.call_id), "name": d.name,
                                         "input": {}}, out)
            elif d.text:  # a call's arguments
                self._parts.append(d.text)
                if self.stream:
                    out.append(self._prefix + b'"input_json_delta","partial_json":' + orjson.dumps(d.text)
                               + b"}}\n\n")
        return out

    def _start(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        out += self.close()
        self._blank = ""
        self._open, self._parts = kind, []
        self.blocks.append(block)
        self._prefix = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                        + str(len(self.blocks) - 1).encode() + b',"delta":{"type":')
        if self.stream:
            out.append(_event(b"content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                                       "content_block": block}))

    def close(self) -> list[bytes]:
        """Close the open block (its final content; `signature_delta` and `content_block_stop` when streaming)."""
        if self._open is None:
            return []
        out: list[bytes] = []
        index = len(self.blocks) - 1
        text = "".join(self._parts)
        block = dict(self.blocks[index])
        if self._open == "thinking":
            block["thinking"], block["signature"] = text, signature(text)
            if self.stream:
                out.append(_event(b"content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "signature_delta",
                                                                     "signature": block["signature"]}}))
        elif self._open == "text":
            block["text"] = text
        else:
            try:
                args = json.loads(text) if text.strip() else {}
            except ValueError:
                args = {}  # cut by max_tokens mid-call: the arguments as far as they parse are none
            block["input"] = args if isinstance(args, dict) else {}
        self.blocks[index] = block
        self._open, self._parts = None, []
        if self.stream:
            out.append(_event(b"content_block_stop", {"type": "content_block_stop", "index": index}))
        return out


def stop_reason(finish: str, stop: str | None, stops: list[str], calls: int) -> tuple[str, str | None]:
    """Chat's finish reason as Anthropic's `stop_reason` and `stop_sequence`."""
    if finish == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if stop is not None and stop in stops:
        return "stop_sequence", stop
    return "end_turn", None


class MessagesService:
    def __init__(self, chat: ChatService, keep_billing_header: bool = False) -> None:
        self.chat = chat
        self.keep_billing_header = keep_billing_header
        self.aliases: dict[str, str] = {}
        for m in chat.registry.config.llm:
            for alias in getattr(m, "aliases", None) or ():
                self.aliases[alias] = m.name

    def model(self, name: str) -> str:
        """The served model a request's `model` names: itself, or the model whose `aliases` list it."""
        return name if name in self.chat.registry.llms else self.aliases.get(name, name)

    def chat_request(self, req: CountTokensRequest) -> ChatCompletionRequest:
        """The chat request a Messages (or count_tokens) request is (see the module docstring)."""
        tool_choice, parallel = chat_tool_choice(req.tool_choice)
        budget, enable_thinking = thinking_budget(req)
        effort = output_effort(req.output_config)
        parse_edits(req.context_management)  # its 400s before admission; applied by `edited`
        images: list[str] = []
        messages = chat_messages(req, images, strip_billing=not self.keep_billing_header)
        model = self.model(req.model)
        if images and not self.chat.registry.llm(model).backend.supports("images"):
            raise _bad(f"{images[0]}: image content blocks are not supported: the model {req.model!r} takes no "
                       "images (its Triton backend has no image input).", images[0], "unsupported_content")
        body: dict[str, Any] = {"model": model, "messages": messages,
                                "tools": chat_tools(req.tools), "tool_choice": tool_choice,
                                "parallel_tool_calls": parallel, "response_format": output_format(req)}
        rt = self.chat.registry.llms.get(model)
        controls = reasoning_kwargs(rt.template if rt is not None else None, effort, enable_thinking)
        if controls:
            body["chat_template_kwargs"] = controls
        if isinstance(req, MessagesRequest):
            body.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                        stop=req.stop_sequences, stream=req.stream)
            user = (req.metadata or {}).get("user_id")
            if user is not None and not isinstance(user, str):
                raise _bad("metadata.user_id: must be a string.", "metadata.user_id")
            body["user"] = user
            body["thinking_token_budget"] = budget  # forced by the generation core (see the module docstring)
        try:
            return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        except ValidationError as e:
            err = e.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else "messages"
            param = _PARAM_NAMES.get(field, field)
            raise _bad(f"Invalid value for '{param}': {err['msg']}.", param) from None

    async def edited(self, req: CountTokensRequest,
                     chat_req: ChatCompletionRequest) -> tuple[ChatCompletionRequest, Applied | None]:
        """`chat_req` after the request's `context_management` edits (`services.context_edits`), and what they
        cleared; unchanged and None without edits."""
        edits = parse_edits(req.context_management)
        if not edits:
            return chat_req, None
        rt = self.chat.registry.llm(chat_req.model)

        async def tokens(text: str) -> int:
            return await self.chat.preprocess.run(len(text), count_tokens, rt, text)

        prompt_tokens = None
        if needs_prompt_tokens(edits):
            try:
                prompt_tokens = len((await self.chat.prompt(rt, chat_req, plan_tools(rt, chat_req))).ids)
            except InvalidRequestError as e:
                raise _named_block(e, req, chat_req) from None
        messages = [m.model_dump(exclude_none=True) for m in chat_req.messages]
        edited, applied = await apply_edits(edits, messages, prompt_tokens, tokens)
        return chat_req.model_copy(update={"messages": [ChatMessage.model_validate(m) for m in edited]}), applied

    async def count_tokens(self, req: CountTokensRequest, chat_req: ChatCompletionRequest) -> dict[str, Any]:
        """`{input_tokens}`: the prompt through the model's template and tokenizer, as `/v1/messages` sends it
        (after its context edits)."""
        chat_req, _ = await self.edited(req, chat_req)
        rt = self.chat.registry.llm(chat_req.model)
        try:
            prompt = await self.chat.prompt(rt, chat_req, plan_tools(rt, chat_req))
        except InvalidRequestError as e:
            raise _named_block(e, req, chat_req) from None
        return {"input_tokens": len(prompt.ids)}

    async def create(self, req: MessagesRequest, chat_req: ChatCompletionRequest,
                     request_id: str) -> dict[str, Any] | AsyncGenerator[bytes, None]:
        budget, _ = thinking_budget(req)
        chat_req, applied = await self.edited(req, chat_req)
        try:
            prepared = await self.chat.prepare(chat_req, request_id)
        except InvalidRequestError as e:
            raise _named_block(_format_error(e, req), req, chat_req) from None
        answer = MessageAnswer(req, prepared, request_id, budget, applied)
        if req.stream:
            encoder = MessagesStreamEncoder(answer)
            # Pings on quiet streams: the HTTP edge's writer adds them (`PING`, `PING_INTERVAL_S`).
            return sse_stream(prepared.rt, prepared.greqs, prepared.stops, encoder, prepared.prompt_tokens, answer.id)
        greq = prepared.greqs[0]
        if not prepared.stops and not prepared.rt.stop_strings:
            greq.stream_tokens = False  # nothing to cut at mid-way: one response from Triton is enough (as chat)
        parts: list[str] = []
        finish, produced, stop, cached = "stop", 0, None, None
        async for ev in sequence_events(prepared.rt, greq, prepared.stops):
            parts.append(ev.text)
            if ev.finish_reason:
                finish, produced, stop, cached = ev.finish_reason, ev.completion_tokens, ev.stop, ev.cached_tokens
        text = "".join(parts)
        deltas = answer.output.push(text, last=True, cut=finish == "length")
        answer.blocks.push(answer.cap_plain(deltas, prepared.rt))
        answer.blocks.close()
        return answer.message(finish, stop, produced, cached)


class MessageAnswer:
    """One answer's state: its id, its choice output (parsers), its blocks and the thinking budget."""

    def __init__(self, req: MessagesRequest, prepared: PreparedChat, request_id: str, budget: int | None,
                 applied: Applied | None = None) -> None:
        self.req = req
        self.applied = applied
        self.prepared = prepared
        self.id = f"msg_{request_id}"
        self.output: ChoiceOutput = prepared.output()
        self.blocks = BlockBuilder(req.stream, (req.thinking or {}).get("display") in HIDDEN_THINKING)
        self.budget = budget
        self.capped = False

    def cap_stream(self, deltas: list[Delta]) -> list[Delta]:
        """Streamed: reasoning deltas stop once the thinking's generated tokens pass the budget (the fallback
        where the generation core could not force the budget; forced, the thinking never passes it)."""
        if self.budget is None:
            return deltas
        if not self.capped and self.output.reasoning_tokens > self.budget:
            self.capped = True
        return [d for d in deltas if d.kind != "reasoning"] if self.capped else deltas

    def cap_plain(self, deltas: list[Delta], rt: LLMRuntime) -> list[Delta]:
        """Plain: the thinking cut to its first `budget` tokens (re-tokenized, as Triton sent it at once)."""
        if self.budget is None:
            return deltas
        out = []
        for d in deltas:
            if d.kind == "reasoning":
                ids = rt.tokenizer.encode(d.text)
                if len(ids) > self.budget:
                    d = Delta("reasoning", rt.tokenizer.decode(ids[: self.budget]))
            out.append(d)
        return out

    def usage(self, output_tokens: int, cached: int | None) -> dict[str, Any]:
        """Anthropic's usage (module docstring): the prompt split into cache reads and the rest."""
        read = min(cached or 0, self.prepared.prompt_tokens)
        return {"input_tokens": self.prepared.prompt_tokens - read, "output_tokens": output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": read}

    def message(self, finish: str, stop: str | None, produced: int, cached: int | None) -> dict[str, Any]:
        reason, sequence = stop_reason(finish, stop, self.req.stop_sequences or [], self.blocks.calls)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.req.model,
                "content": self.blocks.blocks, "stop_reason": reason, "stop_sequence": sequence,
                "usage": self.usage(produced, cached), **self.context_management()}

    def context_management(self) -> dict[str, Any]:
        """`{context_management: {applied_edits}}` when the request asked for edits, else nothing."""
        return {"context_management": self.applied.body()} if self.applied is not None else {}


class MessagesStreamEncoder:
    """Anthropic's stream events for one answer (see the module docstring); the envelope is `sse_stream`."""

    def __init__(self, answer: MessageAnswer) -> None:
        self.answer = answer
        self.finish = "stop"
        self.stop: str | None = None
        # No parser and no forced call: every piece of text is content (what `ChoiceOutput.push` would say).
        self.plain = answer.output.parser is None and answer.prepared.plan.forced is None

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        a = self.answer
        out: list[bytes] = []
        if first:
            start: dict[str, Any] = {"id": a.id, "type": "message", "role": "assistant", "model": a.req.model,
                                     "content": [], "stop_reason": None, "stop_sequence": None,
                                     "usage": a.usage(ev.completion_tokens, ev.cached_tokens)}
            out += [_event(b"message_start", {"type": "message_start", "message": start}),
                    _event(b"ping", {"type": "ping"})]
        last = ev.finish_reason is not None
        if self.plain:
            if not first and not last:  # the per-token path: one text_delta, or nothing
                piece = a.blocks.text(ev.text)
                return piece[0] if len(piece) == 1 else b"".join(piece)
            out += a.blocks.text(ev.text)
        else:
            deltas = a.output.push(ev.text, last, ev.completion_tokens, cut=ev.finish_reason == "length")
            out += a.blocks.push(a.cap_stream(deltas))
        if last:
            self.finish, self.stop = ev.finish_reason or "stop", ev.stop
            out += a.blocks.close()
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        return error_event(err)

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        a = self.answer
        reason, sequence = stop_reason(self.finish, self.stop, a.req.stop_sequences or [], a.blocks.calls)
        return (_event(b"message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                          "usage": a.usage(completion_tokens, cached_tokens), **a.context_management()})
                + _event(b"message_stop", {"type": "message_stop"}))

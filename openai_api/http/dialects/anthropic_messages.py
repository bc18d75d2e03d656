"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) at the HTTP edge: its bodies parsed
once into the services' typed call (`services.messages.MessagesCall`: a chat request of typed parts plus what
only Anthropic's answer needs), and its errors.

**In** (`parse`): `system` (a string or text blocks) is the system message, less Claude Code's per-request
`x-anthropic-billing-header: ...` line (`--keep-billing-header` keeps it), whose changing hash would otherwise
make every turn's prompt differ from its first line and defeat every prompt cache; and so is a `system`-role
message inside `messages` (Claude Code sends one under a model name it does not know): kept where it stands
for a template that renders system messages there, folded into the system prompt for one that takes only one
(`chat.place_system_messages`, decided by a probe render of the template). Each block becomes a typed part
(`services.parts`): a user turn's `text` blocks are its text; each `tool_result` block (string or text-block
content, `is_error` prefixing "Error: ") answers its `tool_use_id`, which must be an id an earlier assistant
turn issued. An assistant turn's `text` blocks are its text, `tool_use` blocks its tool calls (`input` as the
call's arguments), `thinking` blocks its reasoning (templates read it as `reasoning_content` / `thinking`);
`redacted_thinking` is opaque and dropped. A user turn's `image` blocks (base64 or url sources) are images for
a model that takes images; to one that does not, a 400 naming the block, as for `document` and unknown block
types. `cache_control` (at most 4 blocks, `{type: ephemeral}` with `ttl` `5m` or `1h`, else a 400) marks the
end of its block's text for the KV-cache retention of a backend that takes it (`services.retention`). `tools`
(`name`, `description`, `input_schema`; Anthropic's server tools are a 400) are function tools, except those
with `defer_loading` (left out of the prompt, as Anthropic keeps them out of the context until a tool search
loads them); `tool_choice` `auto` /
`any` / `tool` (+ `name`) / `none` are chat's `auto` / `required` / a named function / `none` (forced calls
are guided), `disable_parallel_tool_use` is `parallel_tool_calls: false`. `stop_sequences` are stop strings,
`metadata.user_id` the `user` (the rest of `metadata` is accepted), `temperature`, `top_p`, `top_k`,
`max_tokens` as in chat. Reasoning controls (`services.effort`), structured output (`output_config.format`),
the thinking budget and context edits: see `services.messages`. Every 400 names the client's own field.

**Out** (`DIALECT.answer`): a `message`, or for a stream the service's prepared `MessagesStream`, which `encode`
turns into Anthropic's events (`anthropic_events.MessagesStreamEncoder`, over `services.streaming.sse_stream`),
with a `ping` on quiet streams (`PING` every `PING_INTERVAL_S`, written by the SSE writer's own timer).

**Errors** (https://docs.anthropic.com/en/api/errors): Anthropic's status and error type for the gateway's
status (`errors.ANTHROPIC_ERRORS`: a 503 - Triton unavailable, the gateway draining - is a 529
overloaded_error, which Anthropic's SDKs retry; a Triton failure is a 500 api_error) and `{"type": "error",
"error": {"type", "message"}, "request_id"}`; in a started stream, `event: error` with the same object.

A new Anthropic surface (`/v1/messages/batches`, say) is a route beside these two that calls `parse` per
item; its errors are this module's already (`table.ROUTES` matches the prefix).
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response

from openai_api.errors import GatewayError, InvalidRequestError, anthropic_error
from openai_api.http.dialects.anthropic_events import MessagesStreamEncoder
from openai_api.http.dialects.base import Wire
from openai_api.schemas.anthropic import CountTokensRequest, MessagesRequest
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.context_edits import parse_edits
from openai_api.services.effort import EFFORT_LEVELS, reasoning_kwargs
from openai_api.services.guides import schema_guide
from openai_api.services.messages import HIDDEN_THINKING, MessagesCall, MessagesService, MessagesStream
from openai_api.services.parts import (
    Image,
    Part,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    Turn,
    chat_messages,
    image_paths,
)
from openai_api.services.retention import cache_ttl, check_breakpoints, mark_block

PREFIX = "/v1/messages"
# Seconds without an event after which a stream sends a `ping` (Anthropic keeps quiet streams alive so;
# a tool call's markup is held back until it is whole, which can be many seconds of silence).
PING_INTERVAL_S = 10.0
PING = b'event: ping\ndata: {"type":"ping"}\n\n'

# Block types Anthropic defines that this gateway cannot take (a 400 that says so, not "unknown").
_UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "server_tool_use", "web_search_tool_result",
                       "container_upload", "mcp_tool_use", "mcp_tool_result")
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
    (a block with `cache_control` ends with its breakpoint marker, `retention.mark_block`), joined by a blank
    line; with `strip_billing`, Claude Code's billing header lines dropped (a block left empty by that is
    dropped whole)."""
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
        parts.append(mark_block(text, cache_ttl(block, where)))
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
            parts.append(mark_block(_text(part, pwhere), cache_ttl(part, pwhere)))
        text = "\n\n".join(parts)
    else:
        raise _bad(f"{where}.content: must be a string or a list of text blocks.", f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error: must be a boolean.", f"{where}.is_error")
    return mark_block(f"Error: {text}" if is_error else text, cache_ttl(block, where))

def turns(req: CountTokensRequest, strip_billing: bool = True) -> list[Turn]:
    """`system` and `messages` as typed turns (see the module docstring), each block checked once.
    `strip_billing`: Claude Code's billing header left out of system text."""
    out: list[Turn] = []
    check_breakpoints(_breakpoints(req))
    if req.system is not None:
        text = system_text(req.system, strip_billing=strip_billing)
        if text:
            out.append(Turn("system", (Text(text),)))
    issued: set[str] = set()
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise _bad(f"{where}.role: must be 'user', 'assistant' or 'system'.", f"{where}.role")
        if "content" not in m:
            raise _bad(f"{where}.content: field required.", f"{where}.content")
        if role == "system":  # where it stands, or folded into the system prompt (`chat.place_system_messages`)
            out.append(Turn("system", (Text(system_text(m["content"], f"{where}.content", strip_billing)),)))
            continue
        blocks = _blocks(m["content"], f"{where}.content")
        if role == "assistant":
            out.append(Turn("assistant", _assistant(blocks, f"{where}.content", issued, req.model)))
        else:
            out.append(Turn("user", _user(blocks, f"{where}.content", issued, req.model)))
    return out


def _breakpoints(req: CountTokensRequest) -> int:
    """How many blocks carry `cache_control` (each checked): tools, system blocks, message blocks and the text
    blocks inside a tool_result. Only the places Anthropic defines are read, each at most once, in Anthropic's
    order (tools, system, messages): a '1h' breakpoint after a '5m' one is a 400, as Anthropic requires the
    longer TTL first."""
    count = 0
    short: str | None = None  # the first '5m' breakpoint's field

    def one(block: Any, where: str) -> None:
        nonlocal count, short
        ttl = cache_ttl(block, where)
        if ttl is None:
            return
        count += 1
        if ttl == "5m" and short is None:
            short = where
        elif ttl == "1h" and short is not None:
            raise _bad(f"{where}.cache_control.ttl: a breakpoint with ttl '1h' must come before every one with "
                       f"ttl '5m' ({short}.cache_control comes first).", f"{where}.cache_control.ttl")

    for k, tool in enumerate(getattr(req, "tools", None) or ()):
        one(tool, f"tools[{k}]")
    if isinstance(req.system, list):
        for j, block in enumerate(req.system):
            one(block, f"system[{j}]")
    for i, m in enumerate(req.messages):
        content = m.get("content") if isinstance(m, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else ()):
            where = f"messages[{i}].content[{j}]"
            one(block, where)
            inner = block.get("content") if isinstance(block, dict) and block.get("type") == "tool_result" else None
            for k, part in enumerate(inner if isinstance(inner, list) else ()):
                one(part, f"{where}.content[{k}]")
    return count


def _assistant(blocks: list[dict[str, Any]], where: str, issued: set[str], model: str) -> tuple[Part, ...]:
    parts: list[Part] = []
    for j, b in enumerate(blocks):
        bwhere, kind = f"{where}[{j}]", b["type"]
        if kind == "text":
            parts.append(Text(mark_block(_text(b, bwhere), cache_ttl(b, bwhere))))
        elif kind == "thinking":
            parts.append(Reasoning(_text(b, bwhere, "thinking")))
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
            parts.append(ToolCall(call_id, name, args))
        else:
            raise _refuse_block(kind, bwhere, model, "an assistant turn holds text, thinking, redacted_thinking and "
                                "tool_use blocks")
    return tuple(parts)


def _image(block: dict[str, Any], where: str) -> Image:
    """An image block as an image by URL: a base64 source as a data URL, a url source as it is."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict) and isinstance(source.get("data"), str) \
            and isinstance(source.get("media_type"), str):
        return Image(f"data:{source['media_type']};base64,{source['data']}", where)
    if kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
        return Image(source["url"], where)
    raise _bad(f"{where}.source: an image source is {{type: base64, media_type, data}} or {{type: url, url}}.",
               f"{where}.source", "unsupported_content")


def _user(blocks: list[dict[str, Any]], where: str, issued: set[str], model: str) -> tuple[Part, ...]:
    parts: list[Part] = []
    for j, b in enumerate(blocks):
        bwhere, kind = f"{where}[{j}]", b["type"]
        if kind == "text":
            parts.append(Text(mark_block(_text(b, bwhere), cache_ttl(b, bwhere))))
        elif kind == "image":
            parts.append(_image(b, bwhere))
        elif kind == "tool_result":
            call_id = b.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in issued:
                raise _bad(f"{bwhere}.tool_use_id: no earlier assistant turn has a tool_use block with id "
                           f"{call_id!r}; a tool_result must answer a tool_use.", f"{bwhere}.tool_use_id")
            parts.append(ToolResult(call_id, _tool_result_text(b, bwhere, model)))
        else:
            raise _refuse_block(kind, bwhere, model, "a user turn holds text and tool_result blocks")
    return tuple(parts)


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


def output_effort(config: dict[str, Any] | None) -> str | None:
    """`output_config.effort` (Anthropic's low / medium / high / max; OpenAI's names are taken too), checked."""
    effort = (config or {}).get("effort")
    if effort is not None and effort not in EFFORT_LEVELS:
        raise _bad("output_config.effort: must be 'low', 'medium', 'high' or 'max'.", "output_config.effort")
    return effort


def parse(req: CountTokensRequest, service: MessagesService) -> MessagesCall:
    """The typed call a Messages (or count_tokens) body is (see the module docstring): every block and field
    checked once, here, naming the client's own field; the chat request built from typed parts, its
    messages not validated again."""
    tool_choice, parallel = chat_tool_choice(req.tool_choice)
    budget, enable_thinking = thinking_budget(req)
    effort = output_effort(req.output_config)
    edits = parse_edits(req.context_management)  # its 400s before admission; applied by the service
    conversation = turns(req, strip_billing=not service.keep_billing_header)
    images = image_paths(conversation)
    model = service.model(req.model)
    if images and not service.takes_images(model):
        raise _bad(f"{images[0]}: image content blocks are not supported: the model {req.model!r} takes no "
                   "images (its Triton backend has no image input).", images[0], "unsupported_content")
    body: dict[str, Any] = {"model": model, "messages": chat_messages(conversation),
                            "tools": chat_tools(req.tools), "tool_choice": tool_choice,
                            "parallel_tool_calls": parallel, "response_format": output_format(req)}
    controls = reasoning_kwargs(service.template(model), effort, enable_thinking)
    if controls:
        body["chat_template_kwargs"] = controls
    stream, stops, omit = False, [], False
    if isinstance(req, MessagesRequest):
        stream, stops = req.stream, req.stop_sequences or []
        omit = (req.thinking or {}).get("display") in HIDDEN_THINKING
        body.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                    stop=req.stop_sequences, stream=req.stream)
        user = (req.metadata or {}).get("user_id")
        if user is not None and not isinstance(user, str):
            raise _bad("metadata.user_id: must be a string.", "metadata.user_id")
        body["user"] = user
        body["thinking_token_budget"] = budget  # forced by the generation core (`services.messages`)
    try:  # the messages are typed parts already: only the scalar fields are checked here
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "messages"
        param = _PARAM_NAMES.get(field, field)
        raise _bad(f"Invalid value for '{param}': {err['msg']}.", param) from None
    fmt = "output_config.format.schema" if (req.output_config or {}).get("format") is not None \
        else "output_format.schema"
    return MessagesCall(chat, req.model, stream, stops, budget, omit, edits, images, fmt)


class AnthropicMessages(Wire):
    """Anthropic's wire: its errors (see the module docstring) and a `ping` on quiet streams (`PING`, written by
    the stream writer's own timer, `http.sse.coalesced`: no task or queue per event)."""

    name = "anthropic"
    keepalive = PING
    keepalive_s = PING_INTERVAL_S

    def error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes]:
        status, payload = anthropic_error(err.status, err.message)
        if request_id:
            payload["request_id"] = request_id
        return status, orjson.dumps(payload)

    def stream_error(self, err: GatewayError) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(anthropic_error(err.status, err.message)[1]) + b"\n\n"

    async def answer(self, result: dict[str, Any] | MessagesStream, flush_interval_s: float = 0.0) -> Response:
        """The Messages service's answer on the wire: a `message`, or its stream's events (`encode`)."""
        return await self.respond(result if isinstance(result, dict) else encode(result), flush_interval_s)


def encode(stream: MessagesStream) -> AsyncGenerator[bytes, None]:
    """A prepared Messages stream's SSE bytes (`MessagesStreamEncoder`; pings on quiet streams are the writer's)."""
    return stream.sse(MessagesStreamEncoder(stream.answer))


DIALECT = AnthropicMessages()

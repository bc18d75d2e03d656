"""A Responses request's `input`: read once into typed items (`read_input`, which the Responses dialect calls at
the HTTP edge), then lowered to chat messages (`input_messages`; the other half of `services.response_tools`).

`read_input` is the one reader of the client's items: every 400 names the client's field (`input[i]...`), and
below it nothing reads an item's `type` again. `input` is a string (one user message) or a list of items, each
becoming chat messages in order:

* `message` (role user, assistant, system or developer; content a string or `input_text` / `output_text`
  / `input_image` parts) is that chat message; `developer` is read as `system` by the template layer,
  which also places system messages after the first (`services.chat.place_system_messages`).
* The client's record of the model's calls: `function_call` (its `namespace`, if any, joined to the name
  the model saw, `response_tools.flat_name`), `custom_tool_call` (its free-form `input` as the arguments
  `{"input": ...}`) and a client-run `tool_search_call` (its `arguments`) are the assistant turn's tool
  calls; consecutive calls are one turn.
* Their results, `function_call_output`, `custom_tool_call_output` and `tool_search_output`, are tool
  messages; a `tool_search_output`'s `tools` are also offered from then on (`ResponseInput.loaded_tools`), and its
  message names them.
* `reasoning` is the model's own past thinking: given back to the next assistant turn it precedes as
  `reasoning_content` (templates that keep earlier thinking, e.g. within a tool loop, render it; others
  drop it), from its `reasoning_text` content or from the `encrypted_content` this gateway wrote
  (`encrypt_reasoning`); a summary alone, or another issuer's encrypted content, is not thinking to show.
* `compaction` (what `/v1/responses/compact` returned, `services.compaction`) is the summary it holds, as a
  user message standing where the conversation it summarizes stood.
* Items recording hosted tools' work (`web_search_call`, `file_search_call`, `mcp_call`, ...: this gateway
  runs none, so they come from another provider's conversation) are dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import ResponsesRequest, TypedContent
from openai_api.services.compaction import summary_message
from openai_api.services.parts import ChatPart, ChatParts, Image, Reasoning, Text, chat_image_url
from openai_api.services.response_tools import CUSTOM_INPUT, TOOL_SEARCH, flat_name

# Items that record a hosted tool's work; dropped from the prompt (see the module docstring).
HOSTED_ITEMS = frozenset({
    "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call", "computer_call",
    "computer_call_output", "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
    "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
    "apply_patch_call_output"})
_CALLS = ("function_call", "custom_tool_call", "tool_search_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "tool_search_output")
# `encrypted_content` of this gateway's reasoning items: not encrypted (the client was sent the text itself
# in `content`); the thinking, base64-encoded behind this tag, so a stateless conversation can hand it back.
REASONING_TAG = "gw-reasoning-v1:"


def encrypt_reasoning(text: str) -> str:
    """A reasoning item's `encrypted_content` (see `REASONING_TAG`)."""
    return REASONING_TAG + base64.b64encode(text.encode()).decode()


def _decrypt_reasoning(value: Any) -> str | None:
    if not isinstance(value, str) or not value.startswith(REASONING_TAG):
        return None  # another issuer's (OpenAI's encrypted thinking): nothing a template could read
    try:
        return base64.b64decode(value[len(REASONING_TAG):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


@dataclass(frozen=True, slots=True)
class InputMessage:
    """A `message` item (or what stands for one: `input` as a string, a `compaction`'s summary); `where` is the
    client's field it came from."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | ChatParts
    where: str


@dataclass(frozen=True, slots=True)
class InputCall:
    """A call the model made, as chat's tool call: `arguments` the JSON text (as the client sent it: anything but
    a string is refused where the chat request is built)."""

    id: str
    name: str
    arguments: Any
    where: str


@dataclass(frozen=True, slots=True)
class InputOutput:
    """A call's result, as a tool message's text (`call_id` as the client sent it)."""

    call_id: Any
    text: str
    where: str


InputItem = InputMessage | InputCall | InputOutput | Reasoning


@dataclass(frozen=True, slots=True)
class ResponseInput:
    """A request's `input`, typed: its items in order (hosted tools' records and empty reasoning dropped), and
    the tools its `tool_search_output` items loaded (offered from then on)."""

    items: tuple[InputItem, ...]
    loaded_tools: tuple[dict[str, Any], ...] = ()


def _content(content: Any, where: str, role: str) -> str | ChatParts:
    """An input message's content: a string, or text and image parts (`input_image`, its `image_url` an http(s)
    or data URL, is an image, checked as chat's; a `file_id` is not taken)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"'{where}' must be a string or a list of content parts.", param=where)
    parts: list[ChatPart] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append(Text(part["text"]))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append(Image(chat_image_url({"image_url": image}, f"{where}[{j}]", role), f"{where}[{j}]"))
        elif kind == "input_image":
            raise InvalidRequestError("An input_image part needs an 'image_url' (an http(s) or data:image URL); "
                                      "file_id is not supported.", param=f"{where}[{j}].image_url",
                                      code="unsupported_content")
        else:
            raise InvalidRequestError(f"Content part type {kind!r} is not supported by this model; only text parts "
                                      "are.", param=f"{where}[{j}]", code="unsupported_content")
    return ChatParts(tuple(parts))


def _output_text(output: Any) -> str:
    """A tool output (a string, or content parts) as a tool message's text."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    return orjson.dumps(output).decode()


def _call(item: dict[str, Any], kind: str, where: str) -> InputCall:
    """A call item as a chat tool call."""
    call_id = item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:24]}"
    if kind == "tool_search_call":
        name, arguments = TOOL_SEARCH, orjson.dumps(item.get("arguments") or {}).decode()
    elif kind == "custom_tool_call":
        text = item.get("input", "")
        if not isinstance(text, str):
            raise InvalidRequestError(f"'{where}.input' must be a string.", param=f"{where}.input")
        name = flat_name(str(item.get("name", "")), item.get("namespace"))
        arguments = json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)
    else:
        name, arguments = flat_name(str(item.get("name", "")), item.get("namespace")), item.get("arguments", "{}")
    return InputCall(call_id, name, arguments, where)


def read_input(req: ResponsesRequest) -> ResponseInput:
    """`req.input` as typed items (see the module docstring); a 400 naming the client's field otherwise."""
    if isinstance(req.input, str):
        return ResponseInput((InputMessage("user", req.input, "input"),))
    items: list[InputItem] = []
    loaded: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"'{where}' must be an object.", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequestError(f"'{where}.role' must be user, assistant, system or developer.",
                                          param=f"{where}.role")
            items.append(InputMessage(role, _content(item.get("content"), f"{where}.content", role), where))
        elif kind in _CALLS:
            items.append(_call(item, kind, where))
        elif kind in _OUTPUTS:
            if kind == "tool_search_output":
                tools = [t for t in item.get("tools") or () if isinstance(t, dict)]
                loaded += tools
                output = json.dumps({"loaded_tools": [t.get("name") or t.get("type") for t in tools]})
            else:
                output = _output_text(item.get("output", ""))
            items.append(InputOutput(item.get("call_id", ""), output, where))
        elif kind == "reasoning":
            texts = [p["text"] for p in item.get("content") or () if isinstance(p, dict)
                     and p.get("type") == "reasoning_text" and isinstance(p.get("text"), str)]
            text = "".join(texts) or _decrypt_reasoning(item.get("encrypted_content"))
            if text:
                items.append(Reasoning(text))
        elif kind == "compaction":  # a summary `/v1/responses/compact` wrote, standing for what came before
            items.append(InputMessage("user", summary_message(item, where)["content"], where))
        elif kind in HOSTED_ITEMS:
            continue
        else:
            raise InvalidRequestError(f"Input item type {kind!r} is not supported; messages, function, custom and "
                                      "tool search calls and their outputs, reasoning and compaction items are.",
                                      param=f"{where}.type", code="unsupported_parameter")
    return ResponseInput(tuple(items), tuple(loaded))


def input_messages(inp: ResponseInput, origins: list[str] | None = None) -> list[dict[str, Any]]:
    """The input as chat messages (see the module docstring): content a string or `ChatParts`; `origins`, when
    given, gets per message the input item it came from (`input[i]`), so that a 400 about a chat message names
    the client's field."""
    out: list[dict[str, Any]] = []
    origins = origins if origins is not None else []
    thinking: list[str] = []  # reasoning items waiting for the assistant turn they precede

    def assistant(msg: dict[str, Any], where: str) -> None:
        if thinking:
            msg["reasoning_content"] = "\n\n".join(thinking)
            thinking.clear()
        out.append(msg)
        origins.append(where)

    for item in inp.items:
        if isinstance(item, InputMessage):
            msg = {"role": item.role, "content": item.content}
            if item.role == "assistant":
                assistant(msg, item.where)
            else:
                thinking.clear()  # thinking is shown only with the answer it led to
                out.append(msg)
                origins.append(item.where)
        elif isinstance(item, InputCall):
            call = {"id": item.id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None \
                    and not thinking:
                last["tool_calls"].append(call)  # consecutive calls: one assistant turn
            else:
                assistant({"role": "assistant", "content": None, "tool_calls": [call]}, item.where)
        elif isinstance(item, InputOutput):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
            origins.append(item.where)
        else:
            thinking.append(item.text)
    return out


def stored_form(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as a conversation is stored and handed on (JSON): typed content as chat's list of parts."""
    return [{**m, "content": m["content"].wire()} if isinstance(m.get("content"), TypedContent) else m
            for m in messages]


_CHAT_PARAM = re.compile(r"messages\[(\d+)\](.*)", re.DOTALL)


def input_error(err: InvalidRequestError, origins: list[str]) -> InvalidRequestError:
    """A 400 about chat's `messages[k]...` (an image part, say) as the Responses field it came from:
    `input[i].content[j]` (content parts map one to one)."""
    m = _CHAT_PARAM.fullmatch(err.param or "")
    if m is None or int(m.group(1)) >= len(origins):
        return err
    param = origins[int(m.group(1))] + m.group(2)
    return type(err)(err.message, param=param, code=err.code)

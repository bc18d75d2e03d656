"""Typed content parts: what a dialect's parser makes of a client's content blocks, and the chat messages
they are for the one pipeline (template, tokens, generation).

A dialect at the HTTP edge checks each block once, where it can name the client's own field, and hands the
services these parts; nothing below it reads a block's `type` out of a dict again. `Turn` is one turn of a
conversation in parts, and `chat_messages` lowers turns to the `ChatMessage`s the chat service renders:
constructed, not validated again (the parser checked every value), so a request is parsed once.

Lowering, as chat templates expect it: a user turn's text parts are its content (one string; with images,
chat content parts in order: `image_url` parts); each `ToolResult` is a `tool` message of its own, text
before it staying before it. An assistant turn's text is its content, its `ToolCall`s its `tool_calls`
(arguments as JSON text), its `Reasoning` its `reasoning_content`; a system turn is its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from openai_api.schemas.openai import ChatMessage, ToolCallFunction
from openai_api.schemas.openai import ToolCall as ChatToolCall
from openai_api.text import json_args


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Image:
    """An image by URL (a `data:` URL for inline bytes); `where` is the client's path to it, for errors."""

    url: str
    where: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made: its id, the tool's name and its arguments (a JSON object)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The answer to the call `call_id`, as text."""

    call_id: str
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


Part = Text | Image | ToolCall | ToolResult | Reasoning


@dataclass(frozen=True, slots=True)
class Turn:
    role: Literal["system", "user", "assistant"]
    parts: tuple[Part, ...]


def _message(**fields: Any) -> ChatMessage:
    return ChatMessage.model_construct(**fields)


def _user_content(items: list[Text | Image]) -> str | list[dict[str, Any]]:
    """Text alone is one string; with images, chat content parts in order."""
    if all(isinstance(i, Text) for i in items):
        return "".join(i.text for i in items if isinstance(i, Text))
    return [{"type": "text", "text": i.text} if isinstance(i, Text)
            else {"type": "image_url", "image_url": {"url": i.url}} for i in items]


def _user(parts: tuple[Part, ...]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    pending: list[Text | Image] = []
    for p in parts:
        if isinstance(p, ToolResult):
            if pending:  # text before a result stays before it
                out.append(_message(role="user", content=_user_content(pending)))
                pending = []
            out.append(_message(role="tool", tool_call_id=p.call_id, content=p.text))
        elif isinstance(p, Text | Image):
            pending.append(p)
    if pending or not out:
        out.append(_message(role="user", content=_user_content(pending)))
    return out


def _assistant(parts: tuple[Part, ...]) -> ChatMessage:
    text = "".join(p.text for p in parts if isinstance(p, Text))
    calls = [ChatToolCall.model_construct(id=p.id, type="function", function=ToolCallFunction.model_construct(
        name=p.name, arguments=json_args.canonical(p.arguments))) for p in parts if isinstance(p, ToolCall)]
    fields: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        fields["tool_calls"] = calls
    thinking = "".join(p.text for p in parts if isinstance(p, Reasoning))
    if thinking:
        fields["reasoning_content"] = thinking
    return _message(**fields)


def chat_messages(turns: list[Turn]) -> list[ChatMessage]:
    """`turns` as the chat messages the chat service renders (see the module docstring)."""
    out: list[ChatMessage] = []
    for t in turns:
        if t.role == "system":
            out.append(_message(role="system", content="".join(p.text for p in t.parts if isinstance(p, Text))))
        elif t.role == "assistant":
            out.append(_assistant(t.parts))
        else:
            out += _user(t.parts)
    return out


def image_paths(turns: list[Turn]) -> list[str]:
    """The client's path of each image, in order (the k-th image part of the chat messages is the k-th)."""
    return [p.where for t in turns for p in t.parts if isinstance(p, Image)]

"""Typed content parts: what a dialect's parser makes of a client's content blocks, and the chat messages
they are for the one pipeline (template, tokens, generation).

A dialect at the HTTP edge checks each block once, where it can name the client's own field, and hands the
services these parts; nothing below it reads a block's `type` out of a dict again. `Turn` is one turn of a
conversation in parts, and `chat_messages` lowers turns to the chat messages the chat service renders, as plain
values that the chat request's validation types in one compiled pass (the parser checked every value).

Chat's own content: a `messages[i].content` list is read once, by `chat_parts` (OpenAI chat's dialect calls it
at the edge), into `ChatParts` (text and images, in order); the chat service renders those, never the list.

Lowering, as chat templates expect it: a user turn's text parts are its content (one string; with images,
`ChatParts`: text and images in order); each `ToolResult` is a `tool` message of its own, text
before it staying before it. An assistant turn's text is its content, its `ToolCall`s its `tool_calls`
(arguments as JSON text), its `Reasoning` its `reasoning_content`; a system turn is its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import ChatMessage, TypedContent
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


ChatPart = Text | Image


class ChatParts(TypedContent):
    """A chat message's content as typed parts, in order: what chat takes (text and images). In place of the
    client's list of parts in `ChatMessage.content`; dumped, the list of chat parts it stands for."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[ChatPart, ...]) -> None:
        self.parts = parts

    def images(self) -> list[Image]:
        return [p for p in self.parts if isinstance(p, Image)]

    def wire(self) -> list[dict[str, Any]]:
        return [{"type": "text", "text": p.text} if isinstance(p, Text)
                else {"type": "image_url", "image_url": {"url": p.url}} for p in self.parts]

    def __repr__(self) -> str:
        return f"ChatParts({self.parts!r})"


# Who may send image parts, and the `detail` values chat takes (accepted, not used: the model's processor decides
# the resolution).
IMAGE_ROLES = frozenset({"user"})
DETAILS = frozenset({"auto", "low", "high"})


def chat_image_url(part: dict[str, Any], param: str, role: str) -> str:
    """The URL of a chat `image_url` part, its shape checked (400s name the part or its field)."""
    if role not in IMAGE_ROLES:
        raise InvalidRequestError(f"Image parts are only taken in user messages, not in a {role!r} message.",
                                  param=param, code="unsupported_content")
    value = part.get("image_url")
    url: Any
    if isinstance(value, str):
        url = value
    elif isinstance(value, dict):
        url = value.get("url")
        detail = value.get("detail")
        if detail is not None and detail not in DETAILS:
            raise InvalidRequestError("image_url.detail must be 'auto', 'low' or 'high'.",
                                      param=f"{param}.image_url.detail")
    else:
        raise InvalidRequestError("An image_url part needs an 'image_url' object with a 'url'.",
                                  param=f"{param}.image_url")
    if not isinstance(url, str) or not url:
        raise InvalidRequestError("image_url.url must be a non-empty string (an http(s) or data:image URL).",
                                  param=f"{param}.image_url.url")
    return url


def chat_parts(content: list[dict[str, Any]], index: int, role: str) -> tuple[ChatParts, InvalidRequestError | None]:
    """`messages[index].content`, a client's list of chat parts, as `ChatParts`: `{"type": "text", "text"}`
    and `{"type": "image_url", "image_url": {"url", "detail"} | URL}` (images in user messages only); a 400
    naming the part or its field for a malformed image. Any other part (`input_audio`, `file`, a text part
    without a string) is not rendered by any model here: its 400 is returned beside the parts rather than
    raised, so that a request's image errors, in every message, are named before it (the order the client
    has always been told them in)."""
    parts: list[ChatPart] = []
    unsupported: InvalidRequestError | None = None
    for j, part in enumerate(content):
        kind = part.get("type")
        where = f"messages[{index}].content[{j}]"
        if kind == "image_url":
            parts.append(Image(chat_image_url(part, where, role), where))
        elif kind == "text" and isinstance(part.get("text"), str):
            parts.append(Text(part["text"]))
        elif unsupported is None:
            unsupported = InvalidRequestError(
                f"Content part type {kind!r} is not supported by this model; only 'text' and 'image_url' parts are.",
                param=where, code="unsupported_content")
    return ChatParts(tuple(parts)), unsupported


def typed_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """`messages` with each list of parts as `ChatParts` (`chat_parts`), the others as they are; the first
    error, an image's before an unsupported part's (see `chat_parts`), raised."""
    for m in messages:  # a plain loop: this runs several times per chat request, nearly always finding none
        if isinstance(m.content, list):
            break
    else:
        return messages
    out: list[ChatMessage] = []
    unsupported: InvalidRequestError | None = None
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            typed, bad = chat_parts(m.content, i, m.role)
            unsupported = unsupported or bad
            m = m.model_copy(update={"content": typed})
        out.append(m)
    if unsupported is not None:
        raise unsupported
    return out


Message = dict[str, Any]


def _user_content(items: list[Text | Image]) -> str | ChatParts:
    """Text alone is one string; with images, the parts in order."""
    if all(isinstance(i, Text) for i in items):
        return "".join(i.text for i in items if isinstance(i, Text))
    return ChatParts(tuple(items))


def _user(parts: tuple[Part, ...]) -> list[Message]:
    out: list[Message] = []
    pending: list[Text | Image] = []
    for p in parts:
        if isinstance(p, ToolResult):
            if pending:  # text before a result stays before it
                out.append({"role": "user", "content": _user_content(pending)})
                pending = []
            out.append({"role": "tool", "tool_call_id": p.call_id, "content": p.text})
        elif isinstance(p, Text | Image):
            pending.append(p)
    if pending or not out:
        out.append({"role": "user", "content": _user_content(pending)})
    return out


def _assistant(parts: tuple[Part, ...]) -> Message:
    text = "".join(p.text for p in parts if isinstance(p, Text))
    calls = [{"id": p.id, "type": "function",
              "function": {"name": p.name, "arguments": json_args.canonical(p.arguments)}}
             for p in parts if isinstance(p, ToolCall)]
    fields: Message = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        fields["tool_calls"] = calls
    thinking = "".join(p.text for p in parts if isinstance(p, Reasoning))
    if thinking:
        fields["reasoning_content"] = thinking
    return fields


def chat_messages(turns: list[Turn]) -> list[Message]:
    """`turns` as the chat messages the chat service renders (see the module docstring), as the plain values of
    the chat request's `messages` that its validation types in one pass (pydantic's own, compiled: ~3x less
    CPU than building each message model in Python, and an agent turn lowers a hundred or more messages on
    every request). Every value is one the parser checked, so validation takes each as it is."""
    out: list[Message] = []
    for t in turns:
        if t.role == "system":
            out.append({"role": "system", "content": "".join(p.text for p in t.parts if isinstance(p, Text))})
        elif t.role == "assistant":
            out.append(_assistant(t.parts))
        else:
            out += _user(t.parts)
    return out


def image_paths(turns: list[Turn]) -> list[str]:
    """The client's path of each image, in order (the k-th image part of the chat messages is the k-th)."""
    return [p.where for t in turns for p in t.parts if isinstance(p, Image)]

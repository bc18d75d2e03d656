"""OpenAI chat's content parts, typed once at the edge (`http.dialects.openai_chat.parse`, `services.parts`)."""

from __future__ import annotations

from typing import Any

import pytest

from openai_api.errors import InvalidRequestError
from openai_api.http.dialects.openai_chat import parse
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.chat import template_messages
from openai_api.services.images import chat_image_sources
from openai_api.services.parts import ChatParts, Image, Text

PNG = "data:image/png;base64,iVBORw0KGgo="


def body(*messages: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": list(messages)})


def test_a_list_of_parts_becomes_typed_parts_named_by_the_clients_path() -> None:
    call = parse(body({"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "What is "}, {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        {"type": "image_url", "image_url": "http://127.0.0.1/x.png"}]}))
    content = call.messages[1].content
    assert call.messages[0].content == "Be brief."
    assert isinstance(content, ChatParts)
    assert content.parts == (Text("What is "), Image(PNG, "messages[1].content[1]"),
                             Image("http://127.0.0.1/x.png", "messages[1].content[2]"))
    assert [s.param for s in chat_image_sources(call.messages)] == ["messages[1].content[1]", "messages[1].content[2]"]
    # A copy of the request keeps the typed parts; dumped, they are chat's parts again (as stored, as JSON).
    again = ChatCompletionRequest.model_validate({"model": "m", "messages": call.messages})
    assert again.messages[1].content is content
    assert call.messages[1].model_dump()["content"][1] == {"type": "image_url", "image_url": {"url": PNG}}


def test_a_body_without_parts_is_the_call_itself() -> None:
    req = body({"role": "user", "content": "hi"})
    assert parse(req) is req


@pytest.mark.parametrize("part, param, message", [
    ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "messages[0].content[1]",
     "Content part type 'input_audio' is not supported by this model; only 'text' and 'image_url' parts are."),
    ({"type": "text", "text": 3}, "messages[0].content[1]",
     "Content part type 'text' is not supported by this model; only 'text' and 'image_url' parts are."),
    ({"type": "image_url", "image_url": {"url": PNG, "detail": "max"}}, "messages[0].content[1].image_url.detail",
     "image_url.detail must be 'auto', 'low' or 'high'."),
    ({"type": "image_url"}, "messages[0].content[1].image_url",
     "An image_url part needs an 'image_url' object with a 'url'."),
])
def test_a_part_chat_cannot_take_is_a_400_naming_the_clients_field(part: dict[str, Any], param: str,
                                                                   message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse(body({"role": "user", "content": [{"type": "text", "text": "x"}, part]}))
    assert (err.value.param, err.value.message) == (param, message)


def test_an_image_error_anywhere_is_named_before_an_unsupported_part() -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse(body({"role": "user", "content": [{"type": "file", "file": {}}]},
                   {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}))
    assert err.value.param == "messages[2].content[0].image_url.url"


def test_an_image_in_an_assistant_message_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse(body({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}))
    assert err.value.param == "messages[0].content[0]" and err.value.code == "unsupported_content"


def test_templates_read_typed_parts_as_text_or_as_parts() -> None:
    call = parse(body({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}))
    assert template_messages(call.messages) == [{"role": "user", "content": "ab"}]
    with pytest.raises(InvalidRequestError) as err:  # no template that renders images, no placeholder
        template_messages(parse(body({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": PNG}}]})).messages)
    assert err.value.param == "messages[0].content[0]"


def test_lowered_turns_are_the_chat_messages_they_stand_for() -> None:
    """`parts.chat_messages` (plain values the chat request's validation types) gives, validated, these messages
    (written out here): text before a tool result stays before it, calls' arguments as JSON text, reasoning as
    an extra field, images as typed parts."""
    from openai_api.schemas.openai import ChatMessage, ToolCall, ToolCallFunction
    from openai_api.services.parts import Reasoning, ToolResult, Turn, chat_messages
    from openai_api.services.parts import ToolCall as PartCall

    image = Image("https://x/cat.png", "messages[3].content[0]")
    turns = [Turn("system", (Text("Be brief."),)), Turn("user", (Text("Read "), Text("it."))),
             Turn("assistant", (Reasoning("Look first."), Text("Reading."), PartCall("c1", "Read", {"path": "a é"}))),
             Turn("user", (Text("Here:"), ToolResult("c1", "42"), image, Text("and this"))),
             Turn("assistant", (PartCall("c2", "Read", {}),))]
    got = ChatCompletionRequest.model_validate({"model": "m", "messages": chat_messages(turns)}).messages
    call = ToolCall(id="c1", function=ToolCallFunction(name="Read", arguments='{"path": "a é"}'))
    assert got == [
        ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Read it."),
        ChatMessage(role="assistant", content="Reading.", tool_calls=[call], reasoning_content="Look first."),
        ChatMessage(role="user", content="Here:"), ChatMessage(role="tool", tool_call_id="c1", content="42"),
        ChatMessage(role="user", content=got[5].content),
        ChatMessage(role="assistant", content=None,
                    tool_calls=[ToolCall(id="c2", function=ToolCallFunction(name="Read", arguments="{}"))])]
    assert isinstance(got[5].content, ChatParts) and got[5].content.parts == (image, Text("and this"))
    assert got[2].model_extra == {"reasoning_content": "Look first."}

"""A Responses request's `input`, read once into typed items (`services.response_input.read_input`, called by
the Responses dialect at the edge) and lowered to chat messages."""

from __future__ import annotations

from typing import Any

import pytest

from openai_api.errors import InvalidRequestError
from openai_api.http.dialects.openai_responses import parse
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services.parts import ChatParts, Image, Reasoning, Text
from openai_api.services.response_input import (
    InputCall,
    InputMessage,
    InputOutput,
    encrypt_reasoning,
    input_messages,
    stored_form,
)

PNG = "data:image/png;base64,iVBORw0KGgo="


def request(items: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": items})


def test_items_are_typed_once_and_named_by_the_clients_field() -> None:
    got = parse(request([
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": PNG, "detail": "low"}]},
        {"type": "reasoning", "encrypted_content": encrypt_reasoning("hmm")},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "web_search_call", "id": "ws"},  # a hosted tool's record: dropped
        {"type": "tool_search_output", "call_id": "c1", "tools": [{"type": "function", "name": "g"}]}]))
    first = got.items[0]
    assert isinstance(first, InputMessage) and isinstance(first.content, ChatParts)
    assert first.content.parts == (Text("look"), Image(PNG, "input[0].content[1]"))
    assert got.items == (InputMessage("user", first.content, "input[0]"), Reasoning("hmm"),
                         InputCall("c1", "f", "{}", "input[2]"),
                         InputOutput("c1", '{"loaded_tools": ["g"]}', "input[4]"))
    assert got.loaded_tools == ({"type": "function", "name": "g"},)


def test_lowered_to_chat_messages_and_stored_as_chat_json() -> None:
    inp = parse(request([{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]},
                         {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "t"}]},
                         {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                         {"type": "function_call_output", "call_id": "c1", "output": "ok"}]))
    origins: list[str] = []
    messages = input_messages(inp, origins)
    assert origins == ["input[0]", "input[2]", "input[3]"]
    assert isinstance(messages[0]["content"], ChatParts)
    assert stored_form(messages) == [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]},
        {"role": "assistant", "content": None, "reasoning_content": "t",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


@pytest.mark.parametrize("items, param", [
    ([{"role": "critic", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0]"),
    ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}], "input[0].content[0].image_url"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": PNG, "detail": "x"}]}],
     "input[0].content[0].image_url.detail"),
    ([{"role": "assistant", "content": [{"type": "input_image", "image_url": PNG}]}], "input[0].content[0]"),
    ([{"type": "item_reference", "id": "x"}], "input[0].type"),
])
def test_an_item_the_gateway_cannot_take_is_a_400_naming_it(items: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse(request(items))
    assert err.value.param == param

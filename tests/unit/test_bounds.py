"""`services.bounds.find_excess` over validated chat requests: the walk that skips plain chat messages finds
exactly what a plain recursive walk of every value finds (the oracle here, written out in the test), for random
messages of every shape (string, typed and list content, tool calls, extra fields shallow and deep) and limits
on both sides of where a message's own levels end."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import BaseModel

from openai_api.schemas.openai import ChatCompletionRequest, ChatMessage, ToolCall, ToolCallFunction
from openai_api.services.bounds import MAX_JSON_DEPTH, check_body_depth, find_excess
from openai_api.services.parts import ChatParts, Text


def _children(node: Any) -> list[tuple[Any, Any]] | None:
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, list):
        return list(enumerate(node))
    if isinstance(node, BaseModel):
        return [*node.__dict__.items(), *(node.model_extra or {}).items()]
    return None


def reference(value: Any, max_depth: int) -> tuple[str, list[Any]] | None:
    """The first container (depth first, fields before extras) past `max_depth` levels, the value level 1."""
    def walk(node: Any, level: int, path: list[Any]) -> list[Any] | None:
        for key, child in _children(node) or ():
            if _children(child) is None:
                continue
            if level + 1 > max_depth:
                return [*path, key]
            found = walk(child, level + 1, [*path, key])
            if found is not None:
                return found
        return None

    if _children(value) is None:
        return None
    found = walk(value, 1, [])
    return None if found is None else ("depth", found)


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for k in range(levels):
        value = {"a": value} if k % 2 else [value]
    return value


def message(rng: random.Random) -> ChatMessage:
    role = rng.choice(["user", "assistant", "tool", "system"])
    content: Any = rng.choice(["text", None, ChatParts((Text("typed"),)), [{"type": "text", "text": "x"}],
                               [{"type": "text", "text": deep(rng.randint(0, 6))}]])
    fields: dict[str, Any] = {"role": role, "content": content}
    if rng.random() < 0.5:
        calls = []
        for _ in range(rng.randint(1, 3)):
            fn_extra = {"extra": deep(rng.randint(0, 3))} if rng.random() < 0.2 else {}
            call_extra = {"meta": deep(rng.randint(0, 3))} if rng.random() < 0.2 else {}
            fn = ToolCallFunction.model_construct(name="f", arguments='{"a": 1}', **fn_extra)
            calls.append(ToolCall.model_construct(id="c", type="function", function=fn, **call_extra))
        fields["tool_calls"] = calls
    if rng.random() < 0.3:
        fields["reasoning_content"] = rng.choice(["thought", deep(rng.randint(1, 4)), 7, None])
    if rng.random() < 0.1:
        fields["name"] = {"not": "a string"}  # a service may construct anything
    return ChatMessage.model_construct(**fields)


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_finds_what_a_full_walk_finds(seed: int) -> None:
    rng = random.Random(seed)
    body = ChatCompletionRequest.model_construct(model="m", messages=[message(rng) for _ in range(rng.randint(1, 8))],
                                                 tools=[{"type": "function", "function": {"parameters": deep(3)}}])
    for max_depth in range(1, 12):
        assert find_excess(body, max_depth) == reference(body, max_depth), max_depth
        assert find_excess({"wrapped": [body]}, max_depth) == reference({"wrapped": [body]}, max_depth)


def test_plain_messages_at_the_limit_are_walked_and_refused() -> None:
    call = ToolCall(id="c", function=ToolCallFunction(name="f", arguments="{}"))
    body = ChatCompletionRequest.model_construct(model="m", messages=[
        ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content=None, tool_calls=[call])])
    # body 1, messages 2, message 3, tool_calls 4, call 5, function 6
    assert find_excess(body, 6) is None
    assert find_excess(body, 5) == ("depth", ["messages", 1, "tool_calls", 0, "function"])
    assert find_excess(body, 3) == ("depth", ["messages", 1, "tool_calls"])
    assert find_excess(body, 2) == ("depth", ["messages", 0])
    check_body_depth(body)  # the gateway's own limit, far above


def test_a_deep_extra_field_of_a_message_is_found() -> None:
    body = ChatCompletionRequest.model_construct(model="m", messages=[
        ChatMessage(role="user", content="hi"),
        ChatMessage.model_construct(role="assistant", content="x", reasoning_content=deep(MAX_JSON_DEPTH))])
    excess = find_excess(body, MAX_JSON_DEPTH)
    assert excess == reference(body, MAX_JSON_DEPTH)
    assert excess is not None and excess[1][:3] == ["messages", 1, "reasoning_content"]

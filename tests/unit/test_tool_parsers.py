"""Tool-call parsing on recorded model texts, whole and streamed at every split point."""

from __future__ import annotations

import json

import pytest

from openai_api.text.tool_parsers import HermesToolParser, Llama3JsonToolParser, ToolParser

ALLOWED = frozenset({"get_weather", "get_time"})

# Texts as models wrote them (SmolLM2 with the injected tools prompt, Qwen2.5, Llama 3.1).
RECORDED = [
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>',
     None, [("get_weather", {"location": "Paris"})]),
    (HermesToolParser, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Oslo"}), ("get_time", {"timezone": "CET"})]),
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}',  # stopped at </
     None, [("get_weather", {"location": "Paris"})]),
    (HermesToolParser, "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": "Rome"}}', None,
     [("get_weather", {"city": "Rome"})]),
    (Llama3JsonToolParser, '<|python_tag|>{"name": "get_time", "parameters": {"timezone": "UTC"}}; '
     '{"name": "get_weather", "parameters": {"city": "a;b"}}', None,
     [("get_time", {"timezone": "UTC"}), ("get_weather", {"city": "a;b"})]),
    (Llama3JsonToolParser, "Rome is lovely in spring.", "Rome is lovely in spring.", []),
]

MALFORMED = [
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par'),
    (HermesToolParser, 'Paris", "arguments": {\n "location": "Moscow"\n }}\n</tool_call>\nIt is hot.'),
    (HermesToolParser, '<tool_call>\n{"name": "Paris", "arguments": {"location": "Moscow"}}\n</tool_call>'),
    (HermesToolParser, "<tool_call>not json</tool_call>"),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": '),
    (Llama3JsonToolParser, '{"nome": "x"}'),
]


def calls_of(parsed: list) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed]


@pytest.mark.parametrize(("cls", "text", "content", "expected"), RECORDED)
def test_recorded_outputs_parse_whole(cls: type[ToolParser], text: str, content: str | None, expected: list) -> None:
    got_content, calls = cls(ALLOWED).parse(text)
    assert calls_of(calls) == expected
    assert got_content == content


@pytest.mark.parametrize(("cls", "text", "content", "expected"), RECORDED)
def test_streaming_at_every_split_point_matches_whole_parse(cls: type[ToolParser], text: str, content: str | None,
                                                            expected: list) -> None:
    for cut in range(len(text) + 1):
        stream = cls(ALLOWED).streamer()
        events = [stream.push(text[:cut]), stream.push(text[cut:]), stream.finish()]
        streamed = "".join(e.content for e in events)
        assert calls_of([c for e in events for c in e.calls]) == expected
        assert ("<tool_call>" not in streamed and '"arguments"' not in streamed) or not expected
        assert streamed.strip() == (content or "")


@pytest.mark.parametrize(("cls", "text"), MALFORMED)
def test_malformed_tool_output_falls_back_to_plain_content(cls: type[ToolParser], text: str) -> None:
    content, calls = cls(ALLOWED).parse(text)
    assert calls == [] and content == text
    stream = cls(ALLOWED).streamer()
    events = [stream.push(ch) for ch in text] + [stream.finish()]
    assert [c for e in events for c in e.calls] == []
    assert "".join(e.content for e in events) == text


def test_tool_call_ids_are_unique_and_arguments_are_json_strings() -> None:
    _, calls = HermesToolParser(ALLOWED).parse(RECORDED[1][1])
    assert len({c.id for c in calls}) == 2
    assert all(c.to_openai()["type"] == "function" and isinstance(c.arguments, str) for c in calls)

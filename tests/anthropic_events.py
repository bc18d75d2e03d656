"""Anthropic's Messages API shapes for both test tiers: each body and streamed event validated against
`tests/data/anthropic/messages.schema.json` (written from Anthropic's public API reference; its sources are
named in the file), and a stream's events checked against the event grammar of Anthropic's streaming
reference: `message_start`; then blocks, each `content_block_start` (indices 0, 1, 2, ... in order), its
deltas (of the block's own kind) and `content_block_stop`, one block open at a time; then one
`message_delta` and `message_stop` last; `ping` anywhere after `message_start`; or an `error` event ending
the stream early."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tests.helpers import REPO

SCHEMA = json.loads((REPO / "tests" / "data" / "anthropic" / "messages.schema.json").read_text(encoding="utf-8"))
_REGISTRY = Registry().with_resource("urn:anthropic", Resource.from_contents(SCHEMA))
_DELTAS = {"text": {"text_delta"}, "thinking": {"thinking_delta", "signature_delta"}, "tool_use": {"input_json_delta"}}


def validate(name: str, instance: Any) -> None:
    """Raise when `instance` is not a valid `name` (a `$defs` entry of the schema file)."""
    Draft202012Validator({"$ref": f"urn:anthropic#/$defs/{name}"}, registry=_REGISTRY).validate(instance)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of an SSE body; each must be `event: <type>` + `data: <json>` with the same type."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        kind, data = block.split("\n", 1)
        assert kind.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}", block
        out.append(event)
    return out


def check_stream(events: list[dict[str, Any]]) -> None:
    """Every event valid against its schema, and the sequence Anthropic's grammar (see the module docstring)."""
    for ev in events:
        validate(ev["type"], ev)
    assert events and events[0]["type"] == "message_start", [e["type"] for e in events]
    open_kind: str | None = None
    next_index = 0
    ended = False
    for k, ev in enumerate(events[1:], 1):
        kind = ev["type"]
        assert not ended or kind == "message_stop", f"event {k} ({kind}) after message_delta"
        if kind == "ping":
            continue
        if kind == "error":
            assert k == len(events) - 1, "an error event ends the stream"
            return
        if kind == "content_block_start":
            assert open_kind is None, f"event {k}: a block starts while another is open"
            assert ev["index"] == next_index, f"event {k}: index {ev['index']}, expected {next_index}"
            open_kind = ev["content_block"]["type"]
        elif kind == "content_block_delta":
            assert open_kind is not None and ev["index"] == next_index, f"event {k}: a delta outside its block"
            assert ev["delta"]["type"] in _DELTAS[open_kind], f"event {k}: {ev['delta']['type']} in a {open_kind}"
        elif kind == "content_block_stop":
            assert open_kind is not None and ev["index"] == next_index, f"event {k}: stop of a block not open"
            open_kind, next_index = None, next_index + 1
        elif kind == "message_delta":
            assert open_kind is None, f"event {k}: message_delta with a block open"
            ended = True
        elif kind == "message_stop":
            assert ended and k == len(events) - 1, "message_stop is last, after message_delta"
        else:
            raise AssertionError(f"event {k}: unknown event type {kind!r}")
    assert events[-1]["type"] == "message_stop", "the stream ended without message_stop"


def accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a stream builds, by Anthropic's rules (independent of any SDK): message_start's message,
    each block from its start event plus its deltas (input_json_delta's concatenated JSON parsed at the stop),
    message_delta's stop reason, stop sequence and usage."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for ev in events:
        kind = ev["type"]
        if kind == "message_start":
            message = json.loads(json.dumps(ev["message"]))
        elif kind == "content_block_start":
            message["content"].append(dict(ev["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][ev["index"]], ev["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                partial[ev["index"]] = partial.get(ev["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and ev["index"] in partial:
            message["content"][ev["index"]]["input"] = json.loads(partial[ev["index"]] or "{}")
        elif kind == "message_delta":
            message.update(ev["delta"])
            message["usage"].update({k: v for k, v in ev["usage"].items() if v is not None})
    return message

"""Anthropic's Messages stream events (`/v1/messages` with `stream: true`), the encoder the dialect
(`http.dialects.anthropic_messages.encode`) drives over the one envelope (`services.streaming.sse_stream`).

`message_start` and a `ping`, then each content block's `content_block_start`, deltas and
`content_block_stop` (`StreamedBlocks`: the plain answer's `services.messages.BlockBuilder`, writing the events
as it builds the blocks, so the two are one answer), then `message_delta` (stop reason, usage, applied context edits)
and `message_stop`; an error after the first byte is an `error` event in Anthropic's shape. A plain answer
(no parser, no forced call) costs one `text_delta` per token, built from the open block's prefix.
"""

from __future__ import annotations

from typing import Any

import orjson

from openai_api.errors import GatewayError, anthropic_error_body
from openai_api.services.generation import TextEvent
from openai_api.services.messages import BlockBuilder, MessageAnswer, stop_reason
from openai_api.services.output import Delta


def block_event(kind: bytes, payload: dict[str, Any]) -> bytes:
    """One Anthropic stream event: `event: <kind>` and its `data:` line."""
    return b"event: " + kind + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class StreamedBlocks(BlockBuilder):
    """`BlockBuilder` that also returns the events building its blocks: `content_block_start`, the deltas
    (`thinking_delta`, `text_delta`, `input_json_delta`; a thinking block's `signature_delta` as it closes) and
    `content_block_stop`. A delta's bytes are the open block's prefix plus the new text's JSON."""

    def __init__(self, omit_thinking: bool = False) -> None:
        super().__init__(omit_thinking)
        self._prefix = b""  # the open block's content_block_delta event up to its delta's type

    def text(self, text: str) -> list[bytes]:
        """`push` of one content delta; in an open text block (every token after the first) one event's bytes."""
        if self._open == "text" and text:
            self._parts.append(text)
            return [self._prefix + b'"text_delta","text":' + orjson.dumps(text) + b"}}\n\n"]
        return self.push([Delta("content", text)]) if text else []

    def _on_start(self, index: int, block: dict[str, Any], out: list[bytes]) -> None:
        self._prefix = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                        + str(index).encode() + b',"delta":{"type":')
        out.append(block_event(b"content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": block}))

    def _on_delta(self, head: bytes, text: str, out: list[bytes]) -> None:
        out.append(self._prefix + head + orjson.dumps(text) + b"}}\n\n")

    def _on_stop(self, index: int, block: dict[str, Any], out: list[bytes]) -> None:
        if block["type"] == "thinking":
            out.append(block_event(b"content_block_delta", {"type": "content_block_delta", "index": index,
                                                            "delta": {"type": "signature_delta",
                                                                      "signature": block["signature"]}}))
        out.append(block_event(b"content_block_stop", {"type": "content_block_stop", "index": index}))


class MessagesStreamEncoder:
    """Anthropic's stream events for one answer (see the module docstring); the envelope is `sse_stream`."""

    def __init__(self, answer: MessageAnswer) -> None:
        answer.blocks = StreamedBlocks(answer.call.omit_thinking)  # the answer's blocks, and their events
        self.answer = answer
        self.finish = "stop"
        self.stop: str | None = None
        # No parser and no forced call: every piece of text is content (what `ChoiceOutput.push` would say).
        self.plain = answer.output.parser is None and answer.prepared.plan.forced is None

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        a = self.answer
        out: list[bytes] = []
        if first:
            start: dict[str, Any] = {"id": a.id, "type": "message", "role": "assistant", "model": a.call.model,
                                     "content": [], "stop_reason": None, "stop_sequence": None,
                                     "usage": a.usage(ev.completion_tokens, ev.cached_tokens)}
            out += [block_event(b"message_start", {"type": "message_start", "message": start}),
                    block_event(b"ping", {"type": "ping"})]
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
        return block_event(b"error", anthropic_error_body(err))

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        a = self.answer
        reason, sequence = stop_reason(self.finish, self.stop, a.call.stop_sequences, a.blocks.calls)
        return (block_event(b"message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                          "usage": a.usage(completion_tokens, cached_tokens), **a.context_management()})
                + block_event(b"message_stop", {"type": "message_stop"}))

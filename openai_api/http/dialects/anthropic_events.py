"""Anthropic's Messages stream events (`/v1/messages` with `stream: true`), the encoder the dialect
(`http.dialects.anthropic_messages.encode`) drives over the one envelope (`services.streaming.sse_stream`).

`message_start` and a `ping`, then each content block's `content_block_start`, deltas and
`content_block_stop` (written by the answer's `services.messages.BlockBuilder`, which the plain answer is
built by too, so the two are one answer), then `message_delta` (stop reason, usage, applied context edits)
and `message_stop`; an error after the first byte is an `error` event in Anthropic's shape. A plain answer
(no parser, no forced call) costs one `text_delta` per token, built from the open block's prefix.
"""

from __future__ import annotations

from typing import Any

from openai_api.errors import GatewayError, anthropic_error_body
from openai_api.services.generation import TextEvent
from openai_api.services.messages import MessageAnswer, block_event, stop_reason


class MessagesStreamEncoder:
    """Anthropic's stream events for one answer (see the module docstring); the envelope is `sse_stream`."""

    def __init__(self, answer: MessageAnswer) -> None:
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

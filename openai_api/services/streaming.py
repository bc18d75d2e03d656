"""Pre-built SSE bytes for the per-token hot path: one `orjson.dumps` of the new text per chunk and
byte concatenation for the rest, never a model object per chunk."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class ChatChunkEncoder:
    """`chat.completion.chunk` events for one response id; every method returns one SSE event."""

    __slots__ = ("_head", "_tail")

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self._head = (b'data: {"id":' + orjson.dumps(completion_id) + b',"object":"chat.completion.chunk","created":'
                      + str(created).encode() + b',"model":' + orjson.dumps(model) + b',"choices":[')
        self._tail = b"}]}\n\n"

    def role(self, index: int) -> bytes:
        return (self._head + b'{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,'
                b'"finish_reason":null' % index + self._tail)

    def content(self, index: int, text: str) -> bytes:
        return (self._head + b'{"index":%d,"delta":{"content":' % index + orjson.dumps(text)
                + b'},"logprobs":null,"finish_reason":null' + self._tail)

    def delta(self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None) -> bytes:
        """Any other delta (tool calls, content with log-probs): rare enough for a full dumps."""
        return (self._head + b'{"index":%d,"delta":' % index + orjson.dumps(delta) + b',"logprobs":'
                + orjson.dumps(logprobs) + b',"finish_reason":null' + self._tail)

    def finish(self, index: int, reason: str) -> bytes:
        return self._head + b'{"index":%d,"delta":{},"logprobs":null,"finish_reason":"%s"' % (
            index, reason.encode()) + self._tail

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (self._head + b'],"usage":' + orjson.dumps(usage_dict(prompt_tokens, completion_tokens))
                + b"}\n\n")


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class CompletionChunkEncoder:
    """`text_completion` stream events (the legacy completions API streams the same object type)."""

    __slots__ = ("_head",)

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self._head = (b'data: {"id":' + orjson.dumps(completion_id) + b',"object":"text_completion","created":'
                      + str(created).encode() + b',"model":' + orjson.dumps(model) + b',"choices":[')

    def text(self, index: int, text: str, logprobs: dict[str, Any] | None = None) -> bytes:
        return (self._head + b'{"index":%d,"text":' % index + orjson.dumps(text) + b',"logprobs":'
                + orjson.dumps(logprobs) + b',"finish_reason":null}]}\n\n')

    def finish(self, index: int, reason: str) -> bytes:
        return self._head + b'{"index":%d,"text":"","logprobs":null,"finish_reason":"%s"}]}\n\n' % (
            index, reason.encode())

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (self._head + b'],"usage":' + orjson.dumps(usage_dict(prompt_tokens, completion_tokens))
                + b"}\n\n")

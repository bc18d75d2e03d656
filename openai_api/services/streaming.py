"""The one streaming envelope (chat, completions, and any API that streams generated text), and the
pre-built SSE bytes of the per-token hot path.

`sse_stream` drives a request's sequences and hands each `TextEvent` to the API's `StreamEncoder`, which
turns it into that API's events; the envelope owns what every streaming API shares: the order of
events, the usage count, an error after the first byte becoming a final error event (before it, the
error is raised, so the HTTP layer can still answer with a status code), and closing the Triton
streams when the client leaves or a stop string matched. Per token, with one choice, it is one async
generator layer between the backend and the SSE writer.

The encoders build bytes directly: one `orjson.dumps` of the new text per chunk and byte concatenation
for the rest, never a model object per chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

import orjson

from openai_api.errors import GatewayError, error_response_bytes
from openai_api.services.generation import (
    SequenceText,
    TextEvent,
    backend_chunks,
    request_cached_tokens,
    sequence_events,
)
from openai_api.services.registry import LLMRuntime
from openai_api.triton.llm import GenerationRequest

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


class StreamEncoder(Protocol):
    """One API's events for a streamed generation (see `sse_stream`)."""

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        """The events for choice `index`'s new text, and its finish when `ev.finish_reason` is set;
        `first`: the stream's first event (prepend whatever opens the stream). b"" for nothing."""
        ...

    def error(self, err: GatewayError) -> bytes:
        """The final event of a stream that failed after its first byte."""
        ...

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        """What closes a complete stream (usage, [DONE], ...). `cached_tokens`: the prompt tokens the backend
        read from its KV cache (`generation.request_cached_tokens`; None: it cannot say)."""
        ...


async def sse_stream(rt: LLMRuntime, greqs: list[GenerationRequest], stops: list[str], encoder: StreamEncoder,
                     prompt_tokens: int, stream_id: str = "",
                     before_end: Callable[[], Awaitable[None]] | None = None) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of `greqs` (the request's choices) as `encoder` spells them.

    Nothing is yielded before a sequence produced text or finished, so a backend error before that is
    raised to the caller (a proper status code); after it, it ends the stream with `encoder.error`.
    Closing this iterator cancels every Triton request still running. `before_end` is awaited once, after
    `encoder.end` and before its bytes go out (a stored response is kept before the client reads its end).
    """
    produced = [0] * len(greqs)
    cached: list[int | None] = [None] * len(greqs)
    started = False
    try:
        if len(greqs) == 1:
            # The hot path, inline: backend chunks -> text -> bytes, no generator layer of its own.
            seq = SequenceText(rt, greqs[0], stops)
            chunks = backend_chunks(rt, greqs[0])  # the backend's own generator unless a thinking budget is set
            try:
                async for chunk in chunks:
                    ev = seq.push(chunk)
                    if ev is None:
                        continue
                    data = encoder.event(0, ev, not started)
                    started = True
                    if seq.stopped:
                        produced[0], cached[0] = ev.completion_tokens, ev.cached_tokens
                        yield data
                        break
                    if data:
                        yield data
                else:
                    ev = seq.finish()
                    produced[0], cached[0] = ev.completion_tokens, ev.cached_tokens
                    data = encoder.event(0, ev, not started)
                    started = True
                    yield data
            finally:
                await chunks.aclose()
        else:
            events = merge_choices([sequence_events(rt, g, stops) for g in greqs])
            try:
                async for i, ev in events:
                    if ev.finish_reason:
                        produced[i], cached[i] = ev.completion_tokens, ev.cached_tokens
                    data = encoder.event(i, ev, not started)
                    started = True
                    if data:
                        yield data
            finally:
                await events.aclose()
    except GatewayError as e:
        if not started:
            raise
        logger.warning("stream %s ended by backend error: %s", stream_id, e.message)
        yield encoder.error(e)
        return
    end = encoder.end(prompt_tokens, sum(produced), request_cached_tokens(greqs, cached))
    if before_end is not None:
        await before_end()
    yield end


async def merge_choices(streams: list[AsyncGenerator[TextEvent, None]]
                        ) -> AsyncGenerator[tuple[int, TextEvent], None]:
    """Interleave several choices' events as they arrive (n > 1), tagged with the choice index."""
    queue: asyncio.Queue[tuple[int, TextEvent | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, it: AsyncGenerator[TextEvent, None]) -> None:
        try:
            async for ev in it:
                await queue.put((i, ev))
            await queue.put((i, None))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            i, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def error_event(err: GatewayError) -> bytes:
    """An error after the stream started, as OpenAI's chat/completions streams carry it."""
    return b"data: " + error_response_bytes(err) + b"\n\n"


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

    def usage(self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None,
              cached_tokens: int | None = None) -> bytes:
        usage = usage_dict(prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens)
        return self._head + b'],"usage":' + orjson.dumps(usage) + b"}\n\n"


def usage_dict(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None,
               cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object (chat and completions); `completion_tokens_details.reasoning_tokens` for a model
    that reasons; `prompt_tokens_details.cached_tokens` (the prompt tokens the backend read from its KV cache)
    where the backend reports it, and no `prompt_tokens_details` where it cannot (vLLM's shape when it does not
    count them: the client's typed usage then says None, not a false 0)."""
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


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

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> bytes:
        return (self._head + b'],"usage":'
                + orjson.dumps(usage_dict(prompt_tokens, completion_tokens, cached_tokens=cached_tokens)) + b"}\n\n")

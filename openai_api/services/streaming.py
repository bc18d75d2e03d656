"""The one streaming envelope (chat, completions, and any API that streams generated text).

A service answers a streamed request with a `StreamPlan`: the request's prepared sequences and what its API's
events need, nothing encoded yet. The dialect at the HTTP edge (`http.dialects`) picks its `StreamEncoder`
and calls `StreamPlan.sse`, which is `sse_stream`: it drives the sequences and hands each `TextEvent` to the
encoder, which turns it into that API's events; the envelope owns what every streaming API shares: the order
of events, the usage count, an error after the first byte becoming a final error event (before it, the
error is raised, so the HTTP layer can still answer with a status code), and closing the Triton streams when
the client leaves or a stop string matched. Per token, with one choice, it is one async generator layer
between the backend and the SSE writer (`StreamPlan.sse` returns the envelope's generator, it adds none).

The encoders build bytes directly: one `orjson.dumps` of the new text per chunk and byte concatenation
for the rest, never a model object per chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from openai_api.errors import GatewayError
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


@dataclass(slots=True)
class StreamPlan:
    """A streamed generation, prepared and not started: the request's sequences (`greqs`, one per choice), the
    stop strings, the prompt's token count and the stream's id (for logs). A service's plan for its API adds
    what that API's encoder needs; nothing runs until the iterator `sse` returns is iterated."""

    rt: LLMRuntime
    greqs: list[GenerationRequest]
    stops: list[str]
    prompt_tokens: int
    stream_id: str

    def sse(self, encoder: StreamEncoder,
            before_end: Callable[[], Awaitable[None]] | None = None) -> AsyncGenerator[bytes, None]:
        """The plan's events as `encoder` spells them (`sse_stream`; its generator, no layer of its own)."""
        return sse_stream(self.rt, self.greqs, self.stops, encoder, self.prompt_tokens, self.stream_id, before_end)


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

"""OpenAI's (legacy) Completions API (`/v1/completions`) at the HTTP edge.

Its body is the services' typed call already: `CompletionRequest`, validated once from the request's bytes
(`http.fastpath`). Its answer is a `text_completion`, or for a stream the service's prepared `CompletionStream`,
which `encode` turns into `text_completion` chunks (`CompletionStreamEncoder`, over
`services.streaming.sse_stream`); its errors are OpenAI's (`base.OpenAIDialect`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson
from starlette.responses import Response

from openai_api.errors import GatewayError
from openai_api.http.dialects.base import DONE, OpenAIDialect, error_event
from openai_api.schemas.openai import CompletionRequest
from openai_api.services.completions import CompletionStream, completion_logprobs
from openai_api.services.generation import TextEvent
from openai_api.services.streaming import usage_dict

PATH = "/v1/completions"


class OpenAICompletions(OpenAIDialect):
    name = "openai_completions"

    async def answer(self, result: dict[str, Any] | CompletionStream, flush_interval_s: float = 0.0) -> Response:
        """The completions service's answer on the wire: a `text_completion`, or its stream's chunks (`encode`)."""
        return await self.respond(result if isinstance(result, dict) else encode(result), flush_interval_s)


def parse(body: CompletionRequest) -> CompletionRequest:
    """The typed call of a completions body: the body itself."""
    return body


def encode(stream: CompletionStream) -> AsyncGenerator[bytes, None]:
    """A prepared completion stream's SSE bytes: `text_completion` chunks, then `[DONE]`."""
    return stream.sse(CompletionStreamEncoder(stream))


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


class CompletionStreamEncoder:
    """`text_completion` stream events (the envelope is `services.streaming.sse_stream`): echoed prompts
    open the stream, then per choice text deltas (with log-probs and their offsets when asked for) and a
    finish chunk, and at the end a usage chunk (`stream_options.include_usage`) and `[DONE]`."""

    def __init__(self, stream: CompletionStream) -> None:
        self.rt = stream.rt
        self.chunks = CompletionChunkEncoder(stream.stream_id, stream.created, stream.model)
        self.echoes = stream.echoes
        self.offsets = [len(e) for e in stream.echoes]
        self.logprobs = stream.logprobs
        self.include_usage = stream.include_usage

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        enc = self.chunks
        out = [enc.text(k, e) for k, e in enumerate(self.echoes) if e] if first else []
        if ev.text or (self.logprobs and ev.token_ids):
            lp = completion_logprobs(self.rt, ev.token_ids, ev.logprobs, self.offsets[index]) if self.logprobs \
                else None
            self.offsets[index] += len(ev.text)
            out.append(enc.text(index, ev.text, lp))
        if ev.finish_reason:
            out.append(enc.finish(index, ev.finish_reason))
        return out[0] if len(out) == 1 else b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        return error_event(err)

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        if not self.include_usage:
            return DONE
        return self.chunks.usage(prompt_tokens, completion_tokens, cached_tokens) + DONE


DIALECT = OpenAICompletions()

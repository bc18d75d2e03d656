"""OpenAI's Chat Completions API (`/v1/chat/completions`) at the HTTP edge.

Its body is validated once from the request's bytes (`http.fastpath`) into `ChatCompletionRequest`, with
OpenAI's own field names in every 400 (`param`); `parse` then reads each message's list of content parts once
into typed parts (`services.parts.chat_parts`: text and images; an image's shape and role checked, any other
part type a 400 naming `messages[i].content[j]`), so the services render `ChatParts`, never the client's
dicts. Its answer is a `chat.completion`, or for a stream the service's prepared `ChatStream`, which `encode`
turns into `chat.completion.chunk` events (`ChatStreamEncoder`, over `services.streaming.sse_stream`); its
errors are OpenAI's (`base.OpenAIDialect`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson
from starlette.responses import Response

from openai_api.errors import GatewayError
from openai_api.http.dialects.base import DONE, OpenAIDialect, error_event
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.chat import ChatStream, logprob_entries
from openai_api.services.generation import TextEvent
from openai_api.services.parts import typed_messages
from openai_api.services.streaming import usage_dict

PATH = "/v1/chat/completions"


class OpenAIChat(OpenAIDialect):
    name = "openai_chat"

    async def answer(self, result: dict[str, Any] | ChatStream, flush_interval_s: float = 0.0) -> Response:
        """The chat service's answer on the wire: a `chat.completion`, or its stream's events (`encode`)."""
        return await self.respond(result if isinstance(result, dict) else encode(result), flush_interval_s)


def parse(body: ChatCompletionRequest) -> ChatCompletionRequest:
    """The typed call of a chat body: the body, its content parts typed (see the module docstring). Run after
    admission, whose depth check reads the parts as the client sent them."""
    typed = typed_messages(body.messages)
    return body if typed is body.messages else body.model_copy(update={"messages": typed})


def encode(stream: ChatStream) -> AsyncGenerator[bytes, None]:
    """A prepared chat stream's SSE bytes: `chat.completion.chunk` events, then `[DONE]` (`ChatStreamEncoder`).
    Nothing is yielded before the first tokens arrived, so a backend error before them is raised to the
    awaiter of the first item (a proper status)."""
    return stream.sse(ChatStreamEncoder(stream))


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


class ChatStreamEncoder:
    """`chat.completion.chunk` events (the envelope is `services.streaming.sse_stream`): the role chunks
    open the stream, then per choice its deltas (`services.output`: reasoning_content, content with
    log-probs when asked for, tool calls: id, type and name first, then the arguments), its finish chunk,
    and at the end a usage chunk (`stream_options.include_usage`) and `[DONE]`. A plain chat (no tools,
    no reasoning parser, no log-probs) takes the fast path: its text is its content."""

    def __init__(self, stream: ChatStream) -> None:
        prepared, n = stream.prepared, stream.n
        self.rt = prepared.rt
        self.chunks = ChatChunkEncoder(stream.stream_id, stream.created, stream.model)
        self.n = n
        self.logprobs = stream.logprobs
        self.include_usage = stream.include_usage
        first = prepared.output()
        plain = prepared.plan.forced is None and first.parser is None
        self.outputs = None if plain else [first, *(prepared.output() for _ in range(n - 1))]

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        enc = self.chunks
        out = [enc.role(j) for j in range(self.n)] if first else []
        last = ev.finish_reason is not None
        if self.outputs is None:
            if self.logprobs and (ev.text or ev.token_ids):
                out.append(enc.delta(index, {"content": ev.text}, self._logprobs(ev)))
            elif ev.text:
                out.append(enc.content(index, ev.text))
        else:
            deltas = self.outputs[index].push(ev.text, last, ev.completion_tokens, cut=ev.finish_reason == "length")
            lp = self._logprobs(ev) if self.logprobs and ev.token_ids else None
            for d in deltas:
                if d.kind == "content":
                    out.append(enc.delta(index, {"content": d.text}, lp) if lp else enc.content(index, d.text))
                    lp = None
                elif d.kind == "reasoning":
                    out.append(enc.delta(index, {"reasoning_content": d.text}))
                elif d.kind == "call":
                    out.append(enc.delta(index, {"tool_calls": [{"index": d.index, "id": d.call_id, "type": "function",
                                                                 "function": {"name": d.name, "arguments": ""}}]}))
                else:
                    out.append(enc.delta(index, {"tool_calls": [{"index": d.index,
                                                                 "function": {"arguments": d.text}}]}))
            if lp:  # log-probs of tokens whose text was held back or was not content
                out.append(enc.delta(index, {"content": ""}, lp))
        if last:
            called = self.outputs is not None and self.outputs[index].calls and ev.finish_reason != "length"
            out.append(enc.finish(index, "tool_calls" if called else ev.finish_reason or "stop"))
        return out[0] if len(out) == 1 else b"".join(out)

    def _logprobs(self, ev: TextEvent) -> dict[str, Any]:
        return {"content": logprob_entries(self.rt, ev.token_ids, ev.logprobs), "refusal": None}

    def error(self, err: GatewayError) -> bytes:
        return error_event(err)

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        if not self.include_usage:
            return DONE
        reasoning = None
        if self.rt.reasoning_parser is not None and self.outputs is not None:
            reasoning = sum(o.reasoning_tokens for o in self.outputs)
        return self.chunks.usage(prompt_tokens, completion_tokens, reasoning, cached_tokens) + DONE


DIALECT = OpenAIChat()

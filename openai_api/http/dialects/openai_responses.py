"""OpenAI's Responses API (`/v1/responses`) at the HTTP edge.

`parse` reads the body's `input` once into typed items (`services.response_input.read_input`: messages with
text and image parts, the client's record of calls and their outputs, reasoning, compaction summaries), every
400 naming the client's field (`input[2].content[1].image_url`); the Responses service lowers those items to
the chat pipeline (`services.responses`) and never reads an item's `type` again. Requests the services make
themselves (a background response's, a compaction's) are read the same way there. Its answer is a response
object, or for a stream the service's prepared `ResponseStream`, which `encode` turns into the typed events
(`ResponsesStreamEncoder`, over `services.streaming.sse_stream`; the WebSocket mode, `routers.responses_ws`,
sends the same events' `data` as its messages); its errors are OpenAI's (`base.OpenAIDialect`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson
from starlette.responses import Response

from openai_api.errors import GatewayError
from openai_api.http.dialects.base import OpenAIDialect
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services.generation import TextEvent
from openai_api.services.response_input import ResponseInput, read_input
from openai_api.services.responses import ResponseBuilder, ResponseStream

PREFIX = "/v1/responses"


class OpenAIResponses(OpenAIDialect):
    name = "openai_responses"

    async def answer(self, result: dict[str, Any] | ResponseStream, flush_interval_s: float = 0.0) -> Response:
        """The Responses service's answer on the wire: a response object, or its stream's events (`encode`)."""
        return await self.respond(result if isinstance(result, dict) else encode(result), flush_interval_s)


def parse(body: ResponsesRequest) -> ResponseInput:
    """The typed input of a Responses body (see the module docstring); run after admission, whose depth check
    reads the body as sent."""
    return read_input(body)


def encode(stream: ResponseStream) -> AsyncGenerator[bytes, None]:
    """A prepared response's SSE bytes: `event: <type>` + `data: <json>` per typed event, no `[DONE]`
    (`ResponsesStreamEncoder`); the whole response is handed to `stream.keep` before its final event is sent."""
    encoder = ResponsesStreamEncoder(stream.resp)

    async def kept() -> None:
        if encoder.result is not None:
            await stream.keep(encoder.result)

    return stream.sse(encoder, before_end=kept)


async def encode_events(events: list[dict[str, Any]]) -> AsyncGenerator[bytes, None]:
    """Typed events already whole (a compaction turn's, `services.response_ops.CompactionTurn.events`) as the
    stream's SSE bytes: `event: <type>` + `data: <json>` each, no `[DONE]`."""
    for e in events:
        yield b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"


class ResponsesStreamEncoder:
    """The Responses API's typed SSE events for one streamed response (see the module docstring)."""

    def __init__(self, resp: ResponseBuilder) -> None:
        self.resp = resp
        self.result: dict[str, Any] | None = None  # the whole response, once `end` built it
        self.seq = 0
        self.open: str | None = None  # "reasoning", "message", or the call's kind: the item being streamed
        self.index = -1  # its output_index
        self.item_id = ""
        self.texts: list[str] = []  # the open item's text so far (for its .done events)
        self.finish_reason = "stop"
        self.produced = 0

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}  # OpenAI's count from 0
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _open(self, kind: str, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open, self.index, self.item_id, self.texts = kind, self.index + 1, item["id"], []
        out.append(self._event("response.output_item.added", output_index=self.index, item=item))
        if kind == "message":
            out.append(self._event("response.content_part.added", item_id=self.item_id, output_index=self.index,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                          "logprobs": []}))
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        text, idx, iid = "".join(self.texts), self.index, self.item_id
        out = []
        items = self.resp.output_items()
        item = next((i for i in items if i["id"] == iid), None)
        if self.open == "reasoning":
            out.append(self._event("response.reasoning_text.done", item_id=iid, output_index=idx, content_index=0,
                                   text=text))
        elif self.open == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out.append(self._event("response.output_text.done", item_id=iid, output_index=idx, content_index=0,
                                   text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=iid, output_index=idx, content_index=0,
                                   part=part))
            item = {"type": "message", "id": iid, "status": "completed", "role": "assistant", "content": [part]}
        elif self.open == "function":
            out.append(self._event("response.function_call_arguments.done", item_id=iid, output_index=idx,
                                   name=item["name"] if item is not None else "", arguments=text))
        elif self.open == "custom" and item is not None:  # its input is whole only once its JSON is
            out.append(self._event("response.custom_tool_call_input.delta", item_id=iid, output_index=idx,
                                   delta=item["input"]))
            out.append(self._event("response.custom_tool_call_input.done", item_id=iid, output_index=idx,
                                   input=item["input"]))
        if item is not None:
            done = {**item, "status": "completed"} if "status" in item else item
            out.append(self._event("response.output_item.done", output_index=idx, item=done))
        self.open = None
        return out

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        out: list[bytes] = []
        if first:
            created = self.resp.response("in_progress", [], None)
            out += [self._event("response.created", response=created),
                    self._event("response.in_progress", response=created)]
        deltas = self.resp.output.push(ev.text, ev.finish_reason is not None, ev.completion_tokens,
                                       cut=ev.finish_reason == "length")
        self.resp.add(deltas)
        rid = self.resp.id.removeprefix("resp_")
        for d in deltas:
            if d.kind == "reasoning":
                if self.open != "reasoning":
                    out += self._open("reasoning", {"type": "reasoning", "id": f"rs_{rid}", "summary": [],
                                                    "content": [], "status": "in_progress"})
                self.texts.append(d.text)
                out.append(self._event("response.reasoning_text.delta", item_id=self.item_id, output_index=self.index,
                                       content_index=0, delta=d.text))
            elif d.kind == "content":
                if self.open != "message":
                    out += self._open("message", {"type": "message", "id": f"msg_{rid}", "status": "in_progress",
                                                  "role": "assistant", "content": []})
                self.texts.append(d.text)
                out.append(self._event("response.output_text.delta", item_id=self.item_id, output_index=self.index,
                                       content_index=0, delta=d.text, logprobs=[]))
            elif d.kind == "call":
                # A function's arguments stream as they come; a custom tool's input and a tool search's
                # arguments are sent whole when the call closes (they are read out of the call's JSON).
                out += self._open(self.resp.tools.kind(d.name),
                                  self.resp.tools.item(d.call_id, d.name, "", "in_progress"))
            else:
                self.texts.append(d.text)
                if self.open == "function":
                    out.append(self._event("response.function_call_arguments.delta", item_id=self.item_id,
                                           output_index=self.index, delta=d.text))
        if ev.finish_reason is not None:
            self.finish_reason, self.produced = ev.finish_reason, ev.completion_tokens
            out += self._close()
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        return self._event("error", code=err.code, message=err.message, param=err.param)

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        result = self.result = self.resp.finish(self.finish_reason, completion_tokens, cached_tokens)
        kind = "response.incomplete" if result["status"] == "incomplete" else "response.completed"
        return self._event(kind, response=result)


DIALECT = OpenAIResponses()

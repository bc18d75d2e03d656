"""`/v1/responses`: OpenAI's Responses API over the same generation path as chat.

A request becomes a chat request: `instructions` a system message; `input` a string (one user message)
or input items (messages with text parts, `function_call` items as an assistant's tool calls,
`function_call_output` items as tool messages; reasoning items are the model's own past thinking and
are not sent back); function `tools`, `tool_choice`, `parallel_tool_calls`; `max_output_tokens`,
`temperature`, `top_p`; `text.format` (`json_schema`, `json_object`) as `response_format`, so the
constrained-decoding path enforces it. From there it is `ChatService.prepare` and the shared
generation and output assembly (`services.output`): the answer comes back as output items, a
`reasoning` item (models with a reasoning parser), a `message` item with `output_text`, and one
`function_call` item per tool call, with `usage` (reasoning tokens counted), and `status: "incomplete"`
(`max_output_tokens`) when the answer was cut.

Streaming (`stream: true`) sends the typed event sequence: `response.created`, `response.in_progress`,
then per item `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
`response.content_part.added` + `response.output_text.delta`, `response.function_call_arguments.delta`)
and their `.done` events, `response.output_item.done`, and finally `response.completed` (or
`response.incomplete`) with the whole response; each event is `event: <type>` + `data: <json>` with a
`sequence_number`. There is no `[DONE]`.

`store` defaults to false. Past responses are kept only when the gateway runs with a response store
(`--responses-store N`, an in-memory LRU of N responses) and the request asks `store: true`; then
`previous_response_id` continues that conversation and `GET /v1/responses/{id}` returns it. Without a
store, `previous_response_id` is a 400 that says how to enable one.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from pydantic import ValidationError

from openai_api.errors import GatewayError, InvalidRequestError, NotFoundError
from openai_api.schemas.openai import ChatCompletionRequest, ResponsesRequest
from openai_api.services.chat import ChatService, PreparedChat, collect_plain
from openai_api.services.generation import TextEvent
from openai_api.services.output import Delta, assemble
from openai_api.services.streaming import sse_stream

# Responses request fields that pass through to the chat request as they are (sampling extensions too).
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k", "min_tokens",
           "repetition_penalty", "presence_penalty", "frequency_penalty", "stop")


class ResponseStore:
    """The last `capacity` stored responses and their conversations, in memory (LRU)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._items[response["id"]] = (response, conversation)
        self._items.move_to_end(response["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item


def _text_of(content: Any, where: str) -> Any:
    """An input message's content as chat content: a string, or text and image parts (`input_image`, its
    `image_url` an http(s) or data URL, becomes chat's `image_url` part; a `file_id` is not taken)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"'{where}' must be a string or a list of content parts.", param=where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_image":
            raise InvalidRequestError("An input_image part needs an 'image_url' (an http(s) or data:image URL); "
                                      "file_id is not supported.", param=f"{where}[{j}].image_url",
                                      code="unsupported_content")
        else:
            raise InvalidRequestError(f"Content part type {kind!r} is not supported by this model; only text parts "
                                      "are.", param=f"{where}[{j}]", code="unsupported_content")
    return parts


def input_messages(req: ResponsesRequest, origins: list[str] | None = None) -> list[dict[str, Any]]:
    """`input` as chat messages (see the module docstring); `origins`, when given, gets per message the
    input item it came from (`input[i]`), so that a 400 about a chat message names the client's field."""
    if isinstance(req.input, str):
        if origins is not None:
            origins.append("input")
        return [{"role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    origins = origins if origins is not None else []
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"'{where}' must be an object.", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequestError(f"'{where}.role' must be user, assistant, system or developer.",
                                          param=f"{where}.role")
            out.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
            origins.append(where)
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "{}")}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)  # consecutive calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                origins.append(where)
        elif kind == "function_call_output":
            output = item.get("output", "")
            if not isinstance(output, str):
                output = "".join(p.get("text", "") for p in output if isinstance(p, dict)) \
                    if isinstance(output, list) else orjson.dumps(output).decode()
            out.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": output})
            origins.append(where)
        elif kind == "reasoning":
            continue  # the model's own past thinking: not part of the next prompt
        else:
            raise InvalidRequestError(f"Input item type {kind!r} is not supported; messages, function_call and "
                                      "function_call_output items are.", param=f"{where}.type",
                                      code="unsupported_parameter")
    return out


_CHAT_PARAM = re.compile(r"messages\[(\d+)\](.*)", re.DOTALL)


def input_error(err: InvalidRequestError, origins: list[str]) -> InvalidRequestError:
    """A 400 about chat's `messages[k]...` (an image part, say) as the Responses field it came from:
    `input[i].content[j]` (content parts map one to one)."""
    m = _CHAT_PARAM.fullmatch(err.param or "")
    if m is None or int(m.group(1)) >= len(origins):
        return err
    param = origins[int(m.group(1))] + m.group(2)
    return type(err)(err.message, param=param, code=err.code)


def chat_tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequestError(f"Tool type {kind!r} is not supported; only function tools are.",
                                      param=f"tools[{i}].type", code="unsupported_parameter")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequestError("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}.",
                              param="tool_choice")


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                        if k in fmt}}
    return {"type": fmt.get("type")}


class ResponsesService:
    def __init__(self, chat: ChatService, store: ResponseStore | None) -> None:
        self.chat = chat
        self.store = store

    def get(self, response_id: str) -> dict[str, Any]:
        item = self.store.get(response_id) if self.store is not None else None
        if item is None:
            raise NotFoundError(f"No response with id {response_id!r} (only stored responses can be retrieved).",
                                param="response_id")
        return item[0]

    def _conversation(self, req: ResponsesRequest, origins: list[str] | None = None) -> list[dict[str, Any]]:
        prior: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            if self.store is None:
                raise InvalidRequestError(
                    "previous_response_id needs the gateway's response store, which is off: start the gateway with "
                    "--responses-store N (and send store: true), or send the whole conversation as input.",
                    param="previous_response_id", code="response_store_disabled")
            item = self.store.get(req.previous_response_id)
            if item is None:
                raise InvalidRequestError(f"Previous response with id {req.previous_response_id!r} not found.",
                                          param="previous_response_id", code="previous_response_not_found")
            prior = item[1]
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        if origins is not None:
            origins += ["instructions"] * len(system) + ["previous_response_id"] * len(prior)
        return [*system, *prior, *input_messages(req, origins)]

    async def create(self, req: ResponsesRequest, request_id: str) -> dict[str, Any] | AsyncGenerator[bytes, None]:
        origins: list[str] = []
        messages = self._conversation(req, origins)
        body: dict[str, Any] = {"model": req.model, "messages": messages, "tools": chat_tools(req),
                                "tool_choice": chat_tool_choice(req.tool_choice),
                                "max_tokens": req.max_output_tokens, "response_format": response_format(req.text)}
        extra = req.model_extra or {}
        for key in _PASSED:
            value = getattr(req, key, None) if key in ResponsesRequest.model_fields else extra.get(key)
            if value is not None:
                body[key] = value
        try:
            chat_req = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or "input"
            raise InvalidRequestError(f"Invalid request: {err['msg']} ({where}).", param="input") from None
        try:
            prepared = await self.chat.prepare(chat_req, request_id)
        except InvalidRequestError as e:
            raise input_error(e, origins) from None
        resp = ResponseBuilder(req, request_id, prepared, [m for m in messages if m.get("role") != "system"],
                               stored=self.store is not None and bool(req.store))
        if req.stream:
            encoder = ResponsesStreamEncoder(resp, self._keep)
            return sse_stream(prepared.rt, prepared.greqs, prepared.stops, encoder, prepared.prompt_tokens, resp.id)
        [(text, finish, produced, _, _, cached)] = await collect_plain(prepared.rt, prepared.greqs, prepared.stops)
        resp.add(resp.output.push(text, last=True, cut=finish == "length"))
        resp.output.reasoning_tokens = await self.chat.count_reasoning(prepared.rt, resp.output, text)
        result = resp.finish(finish, produced, cached)
        self._keep(resp, result)
        return result

    def _keep(self, resp: ResponseBuilder, result: dict[str, Any]) -> None:
        if self.store is not None and resp.req.store:
            self.store.put(result, resp.conversation_after())


def echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A request's tool as the response object repeats it: function tools always carry `parameters` and `strict`."""
    if tool.get("type") != "function":
        return tool
    return {**tool, "parameters": tool.get("parameters"), "strict": tool.get("strict")}


class ResponseBuilder:
    """One response's output items, built from a choice's deltas (plain: all at once; streamed: as they
    come, with the events `ResponsesStreamEncoder` sends for each)."""

    def __init__(self, req: ResponsesRequest, request_id: str, prepared: PreparedChat,
                 conversation: list[dict[str, Any]], stored: bool) -> None:
        self.req = req
        self.stored = stored
        self.id = f"resp_{request_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self.prepared = prepared
        self.conversation = conversation
        self.output = prepared.output()
        self.items: list[dict[str, Any]] = []
        self.deltas: list[Delta] = []

    def add(self, deltas: list[Delta]) -> None:
        self.deltas += deltas

    def output_items(self, status: str = "completed") -> list[dict[str, Any]]:
        answer = assemble(self.deltas)
        items: list[dict[str, Any]] = []
        rid = self.id.removeprefix("resp_")
        if answer.reasoning:
            items.append({"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": status,
                          "content": [{"type": "reasoning_text", "text": answer.reasoning}]})
        text = answer.content
        if text.strip() or not answer.calls:  # a call's whitespace around it is no message
            items.append({"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant",
                          "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
        for call in answer.calls:
            items.append({"type": "function_call", "id": f"fc_{call.id.removeprefix('call_')}", "call_id": call.id,
                          "name": call.name, "arguments": call.arguments, "status": status})
        return items

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        fmt = (req.text or {}).get("format") or {"type": "text"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
                "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens, "model": req.model, "output": output,
                "parallel_tool_calls": req.parallel_tool_calls is not False,
                "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
                "store": self.stored, "temperature": req.temperature, "text": {"format": fmt},
                "tool_choice": req.tool_choice or "auto", "tools": [echo_tool(t) for t in req.tools or []],
                "top_p": req.top_p, "truncation": "disabled", "metadata": req.metadata or {},
                # the schema types these as present-or-absent, never null
                **({"usage": usage} if usage is not None else {}),
                **({"user": req.user} if req.user is not None else {})}

    def finish(self, finish_reason: str, produced: int, cached: int | None = None) -> dict[str, Any]:
        """The whole response once generation ended. `cached`: the prompt tokens the backend read from its KV
        cache (`input_tokens_details.cached_tokens`, an integer in the Responses schema: 0 where the backend
        cannot say); nothing is written to a cache the client pays for, so `cache_write_tokens` is 0."""
        status = "incomplete" if finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        reasoning = self.output.reasoning_tokens
        usage = {"input_tokens": self.prepared.prompt_tokens,
                 "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
                 "output_tokens": produced, "output_tokens_details": {"reasoning_tokens": reasoning},
                 "total_tokens": self.prepared.prompt_tokens + produced}
        return self.response(status, self.output_items(status), usage, incomplete)

    def conversation_after(self) -> list[dict[str, Any]]:
        """The conversation a stored response continues: its input, then its answer as chat messages."""
        answer = assemble(self.deltas)
        turn: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
        if answer.calls:
            turn["tool_calls"] = [c.to_openai() for c in answer.calls]
        return [*self.conversation, turn]


class ResponsesStreamEncoder:
    """The Responses API's typed SSE events for one streamed response (see the module docstring)."""

    def __init__(self, resp: ResponseBuilder, keep: Any) -> None:
        self.resp = resp
        self.keep = keep
        self.seq = 0
        self.open: str | None = None  # "reasoning", "message" or "call": the item being streamed
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
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=iid, output_index=idx,
                                   arguments=text))
        if item is not None:
            out.append(self._event("response.output_item.done", output_index=idx, item={**item, "status": "completed"}))
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
                out += self._open("call", {"type": "function_call", "id": f"fc_{d.call_id.removeprefix('call_')}",
                                           "call_id": d.call_id, "name": d.name, "arguments": "",
                                           "status": "in_progress"})
            else:
                self.texts.append(d.text)
                out.append(self._event("response.function_call_arguments.delta", item_id=self.item_id,
                                       output_index=self.index, delta=d.text))
        if ev.finish_reason is not None:
            self.finish_reason, self.produced = ev.finish_reason, ev.completion_tokens
            out += self._close()
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        return self._event("error", code=err.code, message=err.message, param=err.param)

    def end(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> bytes:
        result = self.resp.finish(self.finish_reason, completion_tokens, cached_tokens)
        self.keep(self.resp, result)
        kind = "response.incomplete" if result["status"] == "incomplete" else "response.completed"
        return self._event(kind, response=result)

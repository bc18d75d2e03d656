"""`/v1/responses`: OpenAI's Responses API over the same generation path as chat.

A request becomes a chat request: `instructions` a system message; `input` a string (one user message)
or input items (`services.response_input`: messages, the client's record of calls and their outputs,
reasoning items given back to the turn they led to); `tools` (`services.response_tools`: function,
namespace, custom and client tool-search tools offered as functions; hosted tools left out and named in
the `x-omitted-tools` header), `tool_choice`, `parallel_tool_calls`; `max_output_tokens`, `temperature`,
`top_p`; `reasoning.effort` as the model's own reasoning controls (`services.effort`); `text.format`
(`json_schema`, `json_object`) as `response_format`, so the constrained-decoding path enforces it. From
there it is `ChatService.prepare` and the shared generation and output assembly (`services.output`): the
answer comes back as output items, a `reasoning` item (models with a reasoning parser; with `include:
["reasoning.encrypted_content"]` it carries the thinking for a stateless client to send back), a
`message` item with `output_text`, and one item per tool call (`function_call`, with `namespace` for a
namespaced tool; `custom_tool_call`; `tool_search_call`), with `usage` (reasoning tokens counted), and
`status: "incomplete"` (`max_output_tokens`) when the answer was cut. The other request fields are
checked and echoed (`check_fields`).

Streaming (`stream: true`) sends the typed event sequence: `response.created`, `response.in_progress`,
then per item `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
`response.content_part.added` + `response.output_text.delta`, `response.function_call_arguments.delta`;
a custom tool's `response.custom_tool_call_input.delta`, once, when its call is whole) and their `.done`
events, `response.output_item.done`, and finally `response.completed` (or
`response.incomplete`) with the whole response; each event is `event: <type>` + `data: <json>` with a
`sequence_number`. There is no `[DONE]`. The service prepares the stream (`ResponseStream`); the Responses dialect
at the HTTP edge encodes it (`http.dialects.openai_responses`), for `/v1/responses` and its WebSocket mode alike.

`store` defaults to false. Past responses are kept only when the gateway runs with a response store
(`--responses-store N`; `services.stored_responses`) and the request asks `store: true`; then
`previous_response_id` continues that conversation, `GET /v1/responses/{id}` returns it, `DELETE` forgets it
and `GET /v1/responses/{id}/input_items` lists its input, each for the key that made it only (any other key,
or one whose allow-list no longer has its model, gets the 404 of an id never issued). Response ids are made
here (`resp_` + 192 random bits), never from the request id. Without a store, `previous_response_id` is a
400 that says how to enable one. `background: true` stores the response `queued` and generates it in a task
(`services.response_background`: polled with GET, cancelled with `POST /v1/responses/{id}/cancel`).
`/v1/responses/input_tokens` and `/v1/responses/compact` go the same way up to the prompt (`services.response_ops`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from openai_api.errors import InvalidRequestError, NotFoundError
from openai_api.observability import current_stats
from openai_api.quota.caller import Caller
from openai_api.schemas.openai import ChatCompletionRequest, ResponsesRequest
from openai_api.services.chat import ChatService, PreparedChat, collect_plain
from openai_api.services.context import RequestContext
from openai_api.services.effort import EFFORT_LEVELS, reasoning_kwargs
from openai_api.services.output import Delta, assemble
from openai_api.services.response_background import BackgroundResponses
from openai_api.services.response_input import (
    ResponseInput,
    encrypt_reasoning,
    input_error,
    input_messages,
    read_input,
    stored_form,
)
from openai_api.services.response_tools import ResponseTools
from openai_api.services.stored_responses import ResponseStore, StoredResponse, input_item_resources, page
from openai_api.services.streaming import StreamPlan
from openai_api.stored.base import new_id

logger = logging.getLogger(__name__)

# Responses request fields that pass through to the chat request as they are (sampling extensions too).
# (`prompt_cache_key` names the session for prefix-affinity routing, as chat's does: `routing.session_key`.)
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k", "min_tokens",
           "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "prompt_cache_key")


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                        if k in fmt}}
    return {"type": fmt.get("type")}


def _one_of(value: Any, allowed: tuple[str | None, ...], param: str) -> None:
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed if a is not None)
        raise InvalidRequestError(f"'{param}' must be one of {names}.", param=param)


def check_fields(req: ResponsesRequest) -> None:
    """The fields that shape a response but not its prompt, checked (each is read where it is used):
    `reasoning.effort` (any level OpenAI or Anthropic defines: `services.effort`) and `reasoning.summary`
    (accepted; the gateway writes no summaries: reasoning items carry the thinking itself), `text.verbosity`
    (accepted and echoed; no template control reads it), `truncation` (`disabled`, and `auto`, which here too
    refuses a prompt past the context with a 400 rather than dropping items), `include` (see
    `ResponseBuilder`), `prompt_cache_key`, `client_metadata`, `service_tier`, `safety_identifier` (typed by
    the schema; see `ResponsesRequest`)."""
    reasoning = req.reasoning or {}
    _one_of(reasoning.get("effort"), (None, *EFFORT_LEVELS), "reasoning.effort")
    _one_of(reasoning.get("summary"), (None, "auto", "concise", "detailed"), "reasoning.summary")
    _one_of((req.text or {}).get("verbosity"), (None, "low", "medium", "high"), "text.verbosity")
    _one_of(req.truncation, (None, "auto", "disabled"), "truncation")


class ResponsesService:
    def __init__(self, chat: ChatService, store: ResponseStore | None,
                 background: BackgroundResponses | None = None) -> None:
        self.chat = chat
        self.store = store
        self.background = background

    async def _stored(self, response_id: str, caller: Caller) -> StoredResponse:
        item = await self.store.get(caller, response_id) if self.store is not None else None
        if item is None:
            raise NotFoundError(f"No response with id {response_id!r} (only stored responses can be retrieved).",
                                param="response_id")
        return item if self.background is None else await self.background.settle(caller, item)

    async def start_background(self, req: ResponsesRequest, ctx: RequestContext,
                               detach: Callable[[], Callable[[], None]]) -> dict[str, Any]:
        """`background: true`: the response stored `queued` and returned, generated by a task
        (`services.response_background`; `detach` hands it the request's in-flight slot)."""
        if self.background is None:
            raise InvalidRequestError(
                "background needs the gateway's response store, which is off: start the gateway with "
                "--responses-store N.", param="background", code="response_store_disabled")
        return await self.background.start(self, req, ctx, detach)

    async def cancel(self, response_id: str, caller: Caller) -> dict[str, Any]:
        """`POST /v1/responses/{id}/cancel`: a background response cancelled (or as it ended), else a 404."""
        if self.background is None:
            raise NotFoundError(f"No response with id {response_id!r}.", param="response_id")
        return await self.background.cancel(caller, response_id)

    async def get(self, response_id: str, caller: Caller) -> dict[str, Any]:
        """`GET /v1/responses/{id}`: the caller's stored response, else a 404."""
        return (await self._stored(response_id, caller)).response

    async def delete(self, response_id: str, caller: Caller) -> dict[str, Any]:
        """`DELETE /v1/responses/{id}`: `{id, object: "response", deleted: true}`, else a 404."""
        if self.store is None or not await self.store.delete(caller, response_id):
            raise NotFoundError(f"No response with id {response_id!r} (only stored responses can be deleted).",
                                param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, response_id: str, caller: Caller, after: str | None = None, limit: int = 20,
                          order: str = "desc") -> dict[str, Any]:
        """`GET /v1/responses/{id}/input_items`: a page of the stored response's input items, else a 404."""
        return page((await self._stored(response_id, caller)).input_items, after, limit, order)

    async def prior_conversation(self, req: ResponsesRequest, caller: Caller,
                                 local: Mapping[str, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
        """The conversation `req.previous_response_id` names ([] without one): a WebSocket connection's own last
        response (`local`), else the store's (a 404 for an id the caller has no response of)."""
        if req.previous_response_id is None:
            return []
        kept = local.get(req.previous_response_id) if local is not None else None
        if kept is not None:  # a WebSocket connection's own last response (`http.routers.responses_ws`)
            return kept
        if local is not None and self.store is None:  # the answer on which Codex resends it all
            raise NotFoundError(f"Previous response with id {req.previous_response_id!r} not found.",
                                param="previous_response_id", code="previous_response_not_found")
        return await self.stored_conversation(req.previous_response_id, caller)

    async def _conversation(self, req: ResponsesRequest, caller: Caller, origins: list[str] | None = None,
                            local: Mapping[str, list[dict[str, Any]]] | None = None,
                            items: ResponseInput | None = None) -> list[dict[str, Any]]:
        prior = await self.prior_conversation(req, caller, local)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        if origins is not None:
            origins += ["instructions"] * len(system) + ["previous_response_id"] * len(prior)
        return [*system, *prior, *input_messages(items or read_input(req), origins)]

    async def stored_conversation(self, response_id: str, caller: Caller) -> list[dict[str, Any]]:
        """The conversation a stored response continues (`previous_response_id`); a 400 without a store, a 404
        for an id the caller has no response of."""
        if self.store is None:
            raise InvalidRequestError(
                "previous_response_id needs the gateway's response store, which is off: start the gateway with "
                "--responses-store N (and send store: true), or send the whole conversation as input.",
                param="previous_response_id", code="response_store_disabled")
        item = await self.store.get(caller, response_id)
        if item is None:  # OpenAI's answer: a 404 naming the field
            raise NotFoundError(f"Previous response with id {response_id!r} not found.",
                                param="previous_response_id", code="previous_response_not_found")
        return item.conversation

    async def chat_request(self, req: ResponsesRequest, ctx: RequestContext,
                           local: Mapping[str, list[dict[str, Any]]] | None = None,
                           items: ResponseInput | None = None) -> ChatTurn:
        """The chat request a Responses request becomes (see the module docstring), before its prompt is made:
        shared by `create`, `/v1/responses/input_tokens` and `/v1/responses/compact`. `local`: conversations a
        `previous_response_id` may name besides the store's (a WebSocket connection's last response); `items`:
        its `input` as the dialect read it at the edge (`response_input.read_input`), read here when not given
        (a request a service made, or one from a route that does not read it first)."""
        request_id, caller = ctx.request_id, ctx.caller
        check_fields(req)
        if items is None:
            items = read_input(req)
        tools = ResponseTools(req.tools, list(items.loaded_tools))
        if tools.omitted:
            logger.info("responses %s: left out tools the gateway cannot run: %s", request_id, ", ".join(tools.omitted))
        origins: list[str] = []
        messages = await self._conversation(req, caller, origins, local, items)
        tool_choice = tools.choice(req.tool_choice)  # before `tools.chat`: allowed_tools narrows it
        body: dict[str, Any] = {"model": req.model, "messages": messages, "tools": tools.chat,
                                "tool_choice": tool_choice if tools.chat else None,
                                "max_tokens": req.max_output_tokens, "response_format": response_format(req.text)}
        extra = req.model_extra or {}
        for key in _PASSED:
            value = getattr(req, key, None) if key in ResponsesRequest.model_fields else extra.get(key)
            if value is not None:
                body[key] = value
        if req.user is None and req.safety_identifier is not None:
            body["user"] = req.safety_identifier
        rt = self.chat.registry.llms.get(req.model)
        controls = reasoning_kwargs(rt.template if rt is not None else None, (req.reasoning or {}).get("effort"))
        if controls:
            body["chat_template_kwargs"] = controls
        try:
            chat_req = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or "input"
            raise InvalidRequestError(f"Invalid request: {err['msg']} ({where}).", param="input") from None
        return ChatTurn(chat_req, tools, messages, origins)

    async def prepare(self, req: ResponsesRequest, ctx: RequestContext,
                      local: Mapping[str, list[dict[str, Any]]] | None = None,
                      items: ResponseInput | None = None) -> ResponseBuilder:
        """Everything before generation: the chat request, its prompt, and the builder of its response."""
        turn = await self.chat_request(req, ctx, local, items)
        try:
            prepared = await self.chat.prepare(turn.chat, ctx)
        except InvalidRequestError as e:
            raise input_error(e, turn.origins) from None
        resp = ResponseBuilder(req, prepared, stored_form([m for m in turn.messages if m.get("role") != "system"]),
                               stored=self.store is not None and bool(req.store), tools=turn.tools)
        stats = current_stats()
        if stats is not None:  # the access log and the trace name it beside the request id
            stats.object_id = resp.id
        return resp

    async def create(self, req: ResponsesRequest, ctx: RequestContext,
                     local: Mapping[str, list[dict[str, Any]]] | None = None, items: ResponseInput | None = None,
                     ) -> dict[str, Any] | ResponseStream:
        """A response for `ctx.caller` (who owns it when it is stored), or with `stream` its prepared stream
        (`stream`); `ctx.request_id` is Triton's request id; `items`: its input as read at the edge (see
        `chat_request`)."""
        caller = ctx.caller
        resp = await self.prepare(req, ctx, local, items)
        if req.stream:
            return self.stream(resp, caller)
        result = await self.generate(resp)
        await self._keep(resp, result, caller)
        return result

    def stream(self, resp: ResponseBuilder, caller: Caller,
               ended: Callable[[ResponseBuilder], None] | None = None) -> ResponseStream:
        """A prepared response as a stream for the Responses dialect to encode (`ResponseStream`); `ended` is told
        of it once it is whole, before its final event goes out (as the store is: a follow-up may name this
        response at once)."""
        prepared = resp.prepared

        async def keep(result: dict[str, Any]) -> None:
            if ended is not None:
                ended(resp)
            await self._keep(resp, result, caller)

        return ResponseStream(prepared.rt, prepared.greqs, prepared.stops, prepared.prompt_tokens, resp.id, resp, keep)

    async def generate(self, resp: ResponseBuilder) -> dict[str, Any]:
        """A prepared response, generated whole (plain requests, and background ones)."""
        prepared = resp.prepared
        [(text, finish, produced, _, _, cached)] = await collect_plain(prepared.rt, prepared.greqs, prepared.stops)
        resp.add(resp.output.push(text, last=True, cut=finish == "length"))
        resp.output.reasoning_tokens = await self.chat.count_reasoning(prepared.rt, resp.output, text)
        return resp.finish(finish, produced, cached)

    async def _keep(self, resp: ResponseBuilder, result: dict[str, Any], caller: Caller) -> None:
        if self.store is not None and resp.req.store:
            await self.store.put(caller, resp.req.model, StoredResponse(result, resp.conversation_after(),
                                                                        input_item_resources(resp.req.input)))


@dataclass(slots=True)
class ResponseStream(StreamPlan):
    """A streamed response, prepared (`StreamPlan`, `stream_id` the response id): `resp` builds its output items
    as the deltas come, and `keep` is awaited with the whole response before its final event goes out (it is
    stored, and a WebSocket remembers it for its next turn)."""

    resp: ResponseBuilder
    keep: Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """A Responses request as the chat request it becomes: `origins` names, per chat message, the field it came
    from (so a 400 about a message names the client's field)."""

    chat: ChatCompletionRequest
    tools: ResponseTools
    messages: list[dict[str, Any]]
    origins: list[str]


def echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A request's tool as the response object repeats it: function tools always carry `parameters` and `strict`."""
    if tool.get("type") != "function":
        return tool
    return {**tool, "parameters": tool.get("parameters"), "strict": tool.get("strict")}


class ResponseBuilder:
    """One response's output items, built from a choice's deltas (plain: all at once; streamed: as they
    come, with the events the Responses dialect's encoder sends for each: `http.dialects.openai_responses`)."""

    def __init__(self, req: ResponsesRequest, prepared: PreparedChat, conversation: list[dict[str, Any]],
                 stored: bool, tools: ResponseTools | None = None) -> None:
        self.req = req
        self.stored = stored
        self.tools = tools if tools is not None else ResponseTools(req.tools)
        # `include: ["reasoning.encrypted_content"]`: reasoning items carry their thinking for a stateless
        # client to hand back (`response_input.encrypt_reasoning`). Other `include` values name what hosted
        # tools or logprobs would add; there is nothing of them to include here.
        self.encrypted = "reasoning.encrypted_content" in (req.include or ())
        self.id = new_id("resp_")  # made here, never from a header: see the module docstring
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
            items.append(self.reasoning_item(answer.reasoning, status))
        text = answer.content
        if text.strip() or not answer.calls:  # a call's whitespace around it is no message
            items.append({"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant",
                          "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
        items += [self.tools.item(call.id, call.name, call.arguments, status) for call in answer.calls]
        return items

    def reasoning_item(self, text: str, status: str) -> dict[str, Any]:
        rid = self.id.removeprefix("resp_")
        item = {"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}]}
        return {**item, "encrypted_content": encrypt_reasoning(text)} if self.encrypted else item

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        fmt = (req.text or {}).get("format") or {"type": "text"}
        text: dict[str, Any] = {"format": fmt}
        if (req.text or {}).get("verbosity") is not None:
            text["verbosity"] = (req.text or {})["verbosity"]
        reasoning = req.reasoning or {}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
                "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens, "model": req.model, "output": output,
                "parallel_tool_calls": req.parallel_tool_calls is not False,
                "previous_response_id": req.previous_response_id,
                "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
                "store": self.stored, "temperature": req.temperature, "text": text,
                "tool_choice": req.tool_choice or "auto", "tools": [echo_tool(t) for t in req.tools or []],
                "top_p": req.top_p, "truncation": req.truncation or "disabled", "metadata": req.metadata or {},
                "service_tier": "default", "prompt_cache_key": req.prompt_cache_key,
                "safety_identifier": req.safety_identifier,
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

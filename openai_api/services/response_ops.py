"""`POST /v1/responses/input_tokens` and `POST /v1/responses/compact`: the Responses API's counting and compaction,
over the same request path as `/v1/responses` (`services.responses`).

**input_tokens** takes the body `/v1/responses` takes and answers `{"object": "response.input_tokens",
"input_tokens": N}`, N being the `usage.input_tokens` that request would report: its prompt as rendered for the
model (instructions, a stored `previous_response_id`'s conversation, the input items, the tools offered, the
reasoning controls), tokenized, plus each image's configured `image_tokens`. A prompt that leaves no room for an
answer is still counted; one longer than the whole context is the 400 `context_length_exceeded` that
`/v1/responses` answers (tokenizing stops there: the client learns that it must compact, not by how much).

**compact** takes `model`, `input`, `instructions` and `previous_response_id` (and the other `/v1/responses`
fields, which shape nothing here but are checked as there) and has the served model summarize the conversation:
the conversation, then a user message asking for a summary (`COMPACT_PROMPT`), generated without tools, at most
`COMPACT_MAX_TOKENS` tokens (or the request's `max_output_tokens`, a gateway extension, when smaller; fewer when
less context is left). The answer is OpenAI's compacted response,
`{"id", "object": "response.compaction", "created_at", "output", "usage"}`, whose `output` is every user message
of the conversation (as input message items) followed by one `compaction` item holding the summary
(`services.compaction`); a following `/v1/responses` takes that output as its input (plus what comes next) and
the model reads the summary where the compacted turns stood. Nothing is stored.

**A final `compaction_trigger` input item** on `/v1/responses` (Codex's remote compaction v2, over HTTP or the
WebSocket) is the same compaction answered as a response (`compaction_turn`): its `output` exactly one `compaction`
item, stored (or kept by the WebSocket connection) as the compacted conversation, so that a follow-up's
`previous_response_id` continues from the summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openai_api.errors import ContextLengthExceededError, InvalidRequestError
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services.compaction import MAX_SUMMARY_CHARS, write_compaction
from openai_api.services.context import RequestContext
from openai_api.services.images import chat_image_sources
from openai_api.services.response_input import ResponseInput, input_messages, read_input, stored_form
from openai_api.services.responses import ResponsesService
from openai_api.services.stored_responses import StoredResponse, input_item_resources
from openai_api.services.tools import plan_tools
from openai_api.stored.base import new_id

COMPACT_PROMPT = (
    "Your context is being compacted. Write a summary of the conversation so far that lets it continue without "
    "it: the user's goals and constraints, what has been done (files read or changed, commands run and their "
    "results, decisions made), and what is left to do. Write only the summary.")
COMPACT_MAX_TOKENS = 2048


async def input_tokens(service: ResponsesService, req: ResponsesRequest, ctx: RequestContext,
                       items: ResponseInput | None = None) -> dict[str, Any]:
    """`POST /v1/responses/input_tokens` (see the module docstring); `items`: its input as read at the edge."""
    turn = await service.chat_request(req, ctx, items=items)
    chat = service.chat
    rt = chat.registry.llm(turn.chat.model)
    # As `ChatService.prepare` counts `usage.input_tokens`, without asking for room to answer.
    prompt = await chat.prompt(rt, turn.chat, plan_tools(rt, turn.chat))
    count = len(prompt.ids) + len(chat_image_sources(turn.chat.messages)) * rt.config.image_tokens
    return {"object": "response.input_tokens", "input_tokens": count}


def _user_items(conversation: list[dict[str, Any]], req: ResponsesRequest) -> list[dict[str, Any]]:
    """The user messages of a conversation as input message items: those of a stored previous response (chat
    messages), then those of the request's input."""
    prior = [{"type": "message", "role": "user", "content": m["content"]} for m in conversation
             if m.get("role") == "user" and isinstance(m.get("content"), (str, list))]
    items = [*prior, *([{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str)
                       else [i for i in req.input if isinstance(i, dict)
                             and i.get("type", "message") == "message" and i.get("role") == "user"])]
    return [i for i in input_item_resources(items) if i.get("type") == "message"]


async def _summarize(service: ResponsesService, req: ResponsesRequest, ctx: RequestContext,
                     local: Mapping[str, list[dict[str, Any]]] | None = None,
                     ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The served model's summary of `req`'s conversation: the summarizing response (its usage, its times), the
    conversation's user messages as input items, and the `compaction` item holding the summary."""
    ask = {"type": "message", "role": "user", "content": COMPACT_PROMPT}
    body = {**req.model_dump(exclude_unset=True), "input": ([{"type": "message", "role": "user",
                                                              "content": req.input}] if isinstance(req.input, str)
                                                            else list(req.input)) + [ask],
            "tools": None, "tool_choice": None, "text": None, "stream": False, "store": False, "background": False,
            "max_output_tokens": min(req.max_output_tokens or COMPACT_MAX_TOKENS, COMPACT_MAX_TOKENS)}
    summarize = ResponsesRequest.model_validate(body)
    try:
        resp = await service.prepare(summarize, ctx, local)
    except ContextLengthExceededError:  # little context left: the summary gets what there is
        resp = await service.prepare(summarize.model_copy(update={"max_output_tokens": None}), ctx, local)
    result = await service.generate(resp)
    summary = "".join(part.get("text", "") for item in result["output"] if item.get("type") == "message"
                      for part in item.get("content") or ())
    prior = await service.prior_conversation(req, ctx.caller, local)
    compaction = {"type": "compaction", "id": new_id("cmp_"),
                  "encrypted_content": write_compaction(summary[:MAX_SUMMARY_CHARS])}
    return result, _user_items(prior, req), compaction


async def compact(service: ResponsesService, req: ResponsesRequest, ctx: RequestContext) -> dict[str, Any]:
    """`POST /v1/responses/compact` (see the module docstring)."""
    result, users, compaction = await _summarize(service, req, ctx)
    return {"id": new_id("resp_"), "object": "response.compaction", "created_at": result["created_at"],
            "output": [*users, compaction], "usage": result["usage"]}


def compaction_triggered(req: ResponsesRequest) -> bool:
    """Whether `req` asks for a compaction in place of an answer: its last input item is Codex's
    `compaction_trigger` (remote compaction v2). One anywhere else, or two, is a 400 naming it."""
    if isinstance(req.input, str):
        return False
    at = [i for i, item in enumerate(req.input) if isinstance(item, dict) and item.get("type") == "compaction_trigger"]
    if not at:
        return False
    last = len(req.input) - 1
    wrong = next((i for i in at if i != last), None)
    if wrong is not None:
        raise InvalidRequestError(f"'input[{wrong}]': a compaction_trigger item must be the last input item, and "
                                  "only one may be sent.", param=f"input[{wrong}]")
    return True


@dataclass(frozen=True, slots=True)
class CompactionTurn:
    """A `/v1/responses` turn that ended in a compaction (`compaction_turn`): the response, and the conversation a
    following `previous_response_id` continues (the user messages, then the summary)."""

    response: dict[str, Any]
    conversation: list[dict[str, Any]]

    def events(self) -> list[dict[str, Any]]:
        """The response as the Responses API streams it: created, in progress, its one output item added and done,
        completed (each with its `sequence_number`)."""
        item = self.response["output"][0]
        opened = {k: v for k, v in self.response.items() if k != "usage"} | {"status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": opened},
            {"type": "response.in_progress", "response": opened},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": self.response}]
        return [{**e, "sequence_number": n} for n, e in enumerate(events)]


async def compaction_turn(service: ResponsesService, req: ResponsesRequest, ctx: RequestContext,
                          local: Mapping[str, list[dict[str, Any]]] | None = None) -> CompactionTurn:
    """A `/v1/responses` request whose input ends with `compaction_trigger` (`compaction_triggered`): the
    conversation before the trigger summarized as `/v1/responses/compact` does, answered as a response whose
    output is exactly one `compaction` item (what Codex's remote compaction v2 reads), stored when `store` asks
    (its conversation: the user messages, then the summary, so a follow-up continues from the compaction)."""
    assert not isinstance(req.input, str)
    before = req.model_copy(update={"input": list(req.input[:-1])})
    result, users, compaction = await _summarize(service, before, ctx, local)
    response = {**result, "output": [compaction], "instructions": req.instructions,
                "previous_response_id": req.previous_response_id,
                "store": bool(req.store) and service.store is not None}
    conversation = stored_form(input_messages(read_input(before.model_copy(update={"input": [*users, compaction]}))))
    if service.store is not None and req.store:
        await service.store.put(ctx.caller, req.model, StoredResponse(response, conversation,
                                                                      input_item_resources(before.input)))
    return CompactionTurn(response, conversation)

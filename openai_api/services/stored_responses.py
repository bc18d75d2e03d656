"""Stored `/v1/responses` answers (`store: true`), each owned by the key that made it (`openai_api.stored`).

What is kept per response, as one JSON object of kind `response`: the response object as it was returned,
the conversation a `previous_response_id` continues (its input, then its answer, as chat messages), and its
input items as `GET /v1/responses/{id}/input_items` lists them (OpenAI's item resources: every item with an
`id` and `status`, a message's string content as an `input_text` part, an assistant's as `output_text`).
Every read (`get`) names the caller: another key's response, or one made with a model the caller's
allow-list no longer includes, is None here and a 404 on the wire, as an id never issued.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from openai_api.errors import InvalidRequestError
from openai_api.quota.caller import Caller
from openai_api.stored.base import ObjectStore, StoredObject, StoreUnavailableError, new_id, readable

logger = logging.getLogger("openai_api.stored")
KIND = "response"
MAX_PAGE = 100


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    input_items: list[dict[str, Any]]
    # A background response still running: until when (epoch seconds) the worker running it vouches for it
    # (`services.response_background`); None once it ended, and for every other response.
    lease_until: float | None = None


class ResponseStore:
    """The responses of an `ObjectStore` (see the module docstring)."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    async def put(self, caller: Caller, model: str, stored: StoredResponse) -> bool:
        """Keep a response for `caller`; a store that fails is logged, and the answer goes out all the same."""
        data = orjson.dumps({"response": stored.response, "conversation": stored.conversation,
                             "input_items": stored.input_items,
                             **({"lease_until": stored.lease_until} if stored.lease_until is not None else {})})
        rid = stored.response["id"]
        try:
            kept = await self.objects.put(StoredObject(KIND, rid, caller.owner, model, data, time.time()))
        except StoreUnavailableError:
            kept = False
        if not kept:
            logger.warning("response %s was not stored (%d bytes; the store's limit is %d, or it failed)", rid,
                           len(data), self.objects.max_bytes)
        return kept

    async def get(self, caller: Caller, response_id: str) -> StoredResponse | None:
        obj = readable(await self.objects.get(KIND, caller.owner, response_id), caller)
        if obj is None:
            return None
        raw = orjson.loads(obj.data)
        return StoredResponse(raw["response"], raw["conversation"], raw["input_items"], raw.get("lease_until"))

    async def delete(self, caller: Caller, response_id: str) -> bool:
        """Forget `caller`'s response (one made with a model its allow-list excludes stays unseen: False)."""
        if await self.get(caller, response_id) is None:
            return False
        return await self.objects.delete(KIND, caller.owner, response_id)

    async def start(self) -> None:
        await self.objects.start()

    async def close(self) -> None:
        await self.objects.close()


def _content(content: Any, assistant: bool) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "output_text", "text": content, "annotations": [], "logprobs": []} if assistant
                else {"type": "input_text", "text": content}]
    parts = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        part = dict(part)
        if part.get("type") == "input_image":
            part.setdefault("detail", "auto")
        elif assistant and part.get("type") in ("output_text", "text"):
            part = {"type": "output_text", "text": part.get("text", ""), "annotations": part.get("annotations") or [],
                    "logprobs": part.get("logprobs") or []}
        elif part.get("type") == "text":
            part["type"] = "input_text"
        parts.append(part)
    return parts


def input_item_resources(input_: str | list[Any]) -> list[dict[str, Any]]:
    """A request's `input` as the item resources `input_items` lists (see the module docstring)."""
    if isinstance(input_, str):
        input_ = [{"type": "message", "role": "user", "content": input_}]
    out: list[dict[str, Any]] = []
    for item in input_:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            assistant = item.get("role") == "assistant"
            out.append({"id": item.get("id") or new_id("msg_"), "type": "message", "role": item.get("role"),
                        "status": item.get("status") or "completed",
                        "content": _content(item.get("content"), assistant)})
        elif kind == "function_call":
            out.append({**item, "id": item.get("id") or new_id("fc_"), "status": item.get("status") or "completed"})
        elif kind == "function_call_output":
            out.append({**item, "id": item.get("id") or new_id("fco_"),
                        "status": item.get("status") or "completed"})
        else:
            out.append({**item, "id": item.get("id") or new_id("item_")})
    return out


def page(items: list[dict[str, Any]], after: str | None, limit: int, order: str) -> dict[str, Any]:
    """OpenAI's list page of `items`: `order` asc or desc (OpenAI's default), those after the item `after`,
    at most `limit` (1 to 100)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequestError(f"'limit' must be between 1 and {MAX_PAGE}.", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("'order' must be 'asc' or 'desc'.", param="order")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise InvalidRequestError(f"No input item with id {after!r} in this response.", param="after")
        ordered = ordered[at + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}

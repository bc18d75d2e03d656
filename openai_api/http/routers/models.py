from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from openai_api.errors import InvalidRequestError, ModelNotFoundError, anthropic_error_body
from openai_api.http.deps import CallerDep, ModelsSvc
from openai_api.http.responses import json_response
from openai_api.quota.caller import Caller

router = APIRouter()

# Anthropic's SDKs send this header with every request; OpenAI's never do. On the model routes it picks
# Anthropic's shapes (its model objects, its page fields, its errors).
ANTHROPIC_VERSION = "anthropic-version"


@router.get("/v1/models", tags=["models"])
async def list_models(request: Request, models: ModelsSvc, caller: CallerDep,
                      limit: int = Query(20, description="Anthropic clients: models per page (1-1000)"),
                      after_id: str | None = Query(None, description="Anthropic clients: the page after this id"),
                      before_id: str | None = Query(None, description="Anthropic clients: the page before this id")
                      ) -> Response:
    """The models the caller's key may use (every model for `--api-key` keys and without keys): OpenAI's list, or
    with an `anthropic-version` header Anthropic's page of model objects (the LLMs and their aliases, which
    `/v1/messages` accepts; `limit`, `after_id`, `before_id`, `has_more`, `first_id`, `last_id`)."""
    if ANTHROPIC_VERSION in request.headers:
        return _anthropic_page(models, caller, limit, after_id, before_id)
    return json_response({"object": "list", "data": [_visible(m, caller) for m in models.list()
                                                     if caller.allows(m["id"])]})


@router.get("/v1/models/{model_id:path}", tags=["models"])
async def get_model(request: Request, model_id: str, models: ModelsSvc, caller: CallerDep) -> Response:
    if ANTHROPIC_VERSION in request.headers:
        found = next((m for served, m in models.anthropic_models() if m["id"] == model_id and caller.allows(served)),
                     None)
        if found is None:
            err = ModelNotFoundError(f"model: {model_id}")
            return json_response(anthropic_error_body(err), status=404)
        return json_response(found)
    card = models.get(model_id) if caller.allows(model_id) else None  # one the key may not use does not exist
    if card is None:
        raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
    return json_response(_visible(card, caller))


def _anthropic_page(models: ModelsSvc, caller: Caller, limit: int, after_id: str | None,
                    before_id: str | None) -> Response:
    """One page of Anthropic's `GET /v1/models` (in the config's order: a served model, then its aliases)."""
    if not 1 <= limit <= 1000:
        err = InvalidRequestError("limit: must be between 1 and 1000.", param="limit")
        return json_response(anthropic_error_body(err), status=400)
    items = [m for served, m in models.anthropic_models() if caller.allows(served)]
    ids = [m["id"] for m in items]
    start, end = 0, len(items)
    if after_id is not None:
        start = ids.index(after_id) + 1 if after_id in ids else len(items)
    if before_id is not None:
        end = ids.index(before_id) if before_id in ids else 0
        start = max(start, end - limit)
    page = items[start:min(end, start + limit)]
    more = (start + len(page) < end) if before_id is None else start > 0
    return json_response({"data": page, "has_more": more, "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None})


def _visible(card: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """A card naming only models the key may use: a base model's adapters, and an adapter's base (its
    `parent`, null when the key may not use it)."""
    if card.get("adapters"):
        card = {**card, "adapters": [a for a in card["adapters"] if caller.allows(a)]}
    if card.get("parent") and not caller.allows(card["parent"]):
        card = {**card, "parent": None}
    return card

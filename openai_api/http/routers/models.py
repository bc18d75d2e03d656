from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.errors import ModelNotFoundError
from openai_api.http.deps import CallerDep, ModelsSvc
from openai_api.http.responses import json_response
from openai_api.quota.caller import Caller

router = APIRouter()


@router.get("/v1/models", tags=["models"])
async def list_models(models: ModelsSvc, caller: CallerDep) -> Response:
    """The models the caller's key may use (every model for `--api-key` keys and without keys)."""
    return json_response({"object": "list", "data": [_visible(m, caller) for m in models.list()
                                                     if caller.allows(m["id"])]})


@router.get("/v1/models/{model_id:path}", tags=["models"])
async def get_model(model_id: str, models: ModelsSvc, caller: CallerDep) -> Response:
    card = models.get(model_id) if caller.allows(model_id) else None  # one the key may not use does not exist
    if card is None:
        raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
    return json_response(_visible(card, caller))


def _visible(card: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """A card naming only models the key may use: a base model's adapters, and an adapter's base (its
    `parent`, null when the key may not use it)."""
    if card.get("adapters"):
        card = {**card, "adapters": [a for a in card["adapters"] if caller.allows(a)]}
    if card.get("parent") and not caller.allows(card["parent"]):
        card = {**card, "parent": None}
    return card

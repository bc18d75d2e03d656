from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.errors import ModelNotFoundError
from openai_api.http.deps import CallerDep, ModelsSvc
from openai_api.http.responses import json_response

router = APIRouter()


@router.get("/v1/models", tags=["models"])
async def list_models(models: ModelsSvc, caller: CallerDep) -> Response:
    """The models the caller's key may use (every model for `--api-key` keys and without keys)."""
    return json_response({"object": "list", "data": [m for m in models.list() if caller.allows(m["id"])]})


@router.get("/v1/models/{model_id:path}", tags=["models"])
async def get_model(model_id: str, models: ModelsSvc, caller: CallerDep) -> Response:
    card = models.get(model_id) if caller.allows(model_id) else None  # one the key may not use does not exist
    if card is None:
        raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
    return json_response(card)

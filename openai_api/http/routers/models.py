from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.errors import ModelNotFoundError
from openai_api.http.deps import ModelsSvc
from openai_api.http.responses import json_response

router = APIRouter()


@router.get("/v1/models", tags=["models"])
async def list_models(models: ModelsSvc) -> Response:
    return json_response({"object": "list", "data": models.list()})


@router.get("/v1/models/{model_id:path}", tags=["models"])
async def get_model(model_id: str, models: ModelsSvc) -> Response:
    card = models.get(model_id)
    if card is None:
        raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
    return json_response(card)
